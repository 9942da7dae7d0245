"""brainscope's hotwire export (``python -m brainscope.export_hotwire``): a directory of
``<name>.pt`` float32 tensors (``[hidden]`` or ``[n_layers, hidden]``) and a ``manifest.json``::

    {"exported_at": "...", "vectors": [{"name", "file", "shape", "norm_min", "norm_max",
      "unit_norm", "model", "source", "calibration_regime": {"backend", "note",
      "decode_only_recommended"}, ...passport extras, e.g. "calibrated": {"layer", "scale",
      "decode_only"}, "eval", "recipe"}]}

The vector's id is its file's stem; its manifest entry is kept whole as the vector's metadata, and
a ``calibrated`` passport becomes a preset named after the vector: one entry with the passport's
layer, scale and decode_only (absent: the regime's ``decode_only_recommended``).

Layer numbering, read at moudrkat/brainscope. brainscope uses two:

- Steering specs count decoder layers from 0, as vLLM and hotwire do: ``brainscope/server.py``
  (``_install_steer_hooks``) steers spec layer ``L`` with a forward hook on
  ``model.model.layers[L]`` that adds ``strength * v`` to that layer's output (row ``L`` of a
  per-layer direction), and ``docs/steering.md`` / ``brainscope/parity.py`` send one
  ``{"id", "layer", "scale", "decode_only"}`` spec unchanged to brainscope and to hotwire. The
  passport's ``calibrated`` block is such a spec, so its layer maps to hotwire ``layer: L``
  unchanged: the stream it steers is transformers' ``hidden_states[L + 1]``.
- Its extractors count hidden states after the embedding, from 1: ``extract.py --layer k`` reads
  ``hidden_states[k]``, and ``pca_directions.py`` numbers its table (``best_layer``,
  ``suggested_layers``) as ``hidden_states[k]``, i.e. the output of decoder layer ``k - 1``.
  Those numbers say where a direction was read, not where it was calibrated; they are not in the
  export, and a passport that carries them keeps them as metadata only.

Per-layer tensors need no mapping: brainscope's rows are ``hidden_states[1:]``, row ``i`` the
output of decoder layer ``i``, which is hotwire's row ``i``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .result import (ImportedPreset, ImportedVector, ImportResult, as_vector, checked_preset,
                     inside, layer_of, read_pt, scale_of, vector_id)


def import_export(root: Path, manifest: dict[str, Any], *, n_layers: int | None,
                  id_prefix: str) -> tuple[ImportResult, set[str]]:
    """The vectors ``manifest`` lists, and the file names it lists (imported or not)."""
    entries = manifest.get("vectors")
    if not isinstance(entries, list):
        raise ValueError(f"{root / 'manifest.json'}: `vectors` must be a list")
    result, listed = ImportResult(), set()
    for i, entry in enumerate(entries):
        where = f"{root / 'manifest.json'}: vectors[{i}]"
        try:
            file = _file_of(entry, where)
            listed.add(file)
            result.vectors.append(_vector(root, file, entry, manifest, n_layers, id_prefix))
        except ValueError as e:
            result.problems.append(str(e))
    return result, listed


def _file_of(entry: Any, where: str) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        raise ValueError(f"{where}: an entry needs a `file` (the .pt file's name)")
    file = entry["file"]
    if Path(file).name != file or not file.endswith(".pt"):
        raise ValueError(f"{where}: file {file!r} must be a .pt file in the export directory")
    return file


def _vector(root: Path, file: str, entry: dict[str, Any], manifest: dict[str, Any],
            n_layers: int | None, id_prefix: str) -> ImportedVector:
    path = inside(root, root / file)
    vid = vector_id(path.stem, id_prefix, path)
    if not path.is_file():
        raise ValueError(f"{path}: listed in manifest.json but missing")
    preset = _preset(vid, entry, path, n_layers)
    tensor = as_vector(read_pt(path), path, n_layers)
    metadata = {"imported_from": "brainscope", "exported_at": manifest.get("exported_at"), **entry}
    return ImportedVector(vid, tensor, None, metadata, path, preset)


def _preset(vid: str, entry: dict[str, Any], path: Path, n_layers: int | None) -> ImportedPreset | None:
    passport = entry.get("calibrated")
    if passport is None:
        return None
    if not isinstance(passport, dict):
        raise ValueError(f"{path}: its `calibrated` passport must be an object")
    layer = layer_of(passport.get("layer"), "calibrated.layer", path, n_layers)
    scale = scale_of(passport.get("scale"), "calibrated.scale", path)
    regime = entry.get("calibration_regime")
    if not isinstance(regime, dict):
        regime = {}
    decode_only = passport.get("decode_only", regime.get("decode_only_recommended", False))
    if not isinstance(decode_only, bool):
        raise ValueError(f"{path}: calibrated.decode_only must be true or false")
    model = entry.get("model") or "its model"
    return checked_preset(
        ({"id": vid, "layer": layer, "scale": scale, "decode_only": decode_only},),
        f"brainscope passport: calibrated at layer {layer}, scale {scale:g}, "
        f"decode_only {str(decode_only).lower()} ({model})", path)
