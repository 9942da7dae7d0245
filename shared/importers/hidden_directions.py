"""hidden-directions' direction dictionaries (``direction_dict/<model>/``): ``<name>.pt`` tensors
(``[n_layers, hidden]``, often bfloat16) and a ``manifest.json``::

    {"model": "...", "extracted_via": "...", "directions": [{"name", "shape", "dtype",
      "recommended_layer", "recommended_alpha"}], "preset_provenance": "..."}

Each listed ``<name>.pt`` becomes vector ``<name>`` (float32), with its manifest entry, the
model and the provenance notes as metadata; a ``recommended_layer`` becomes a preset named after
the vector: ``{"id", "layer": recommended_layer, "scale": recommended_alpha}`` (alpha absent: 1),
on every token, as hidden-directions steers.

Layer numbering, read at moudrkat/hidden-directions: decoder layers from 0, as vLLM's.
``src/hidden_directions/extract/pref.py`` and ``extract/refusal.py`` stack
``hidden_states[1:]``, so row ``i`` is the output of decoder layer ``i`` (hotwire's row ``i``);
``src/hidden_directions/sweep.py`` steers layer ``L`` with a forward hook on
``model.model.layers[L]`` adding ``alpha * v[L]`` to its output (``bake.py`` folds the same
into that layer's ``mlp.down_proj`` bias, the same stream), and brainscope loads
``recommended_layer`` as its steering layer. So ``recommended_layer: L`` is hotwire
``layer: L``, unchanged. (The last row is transformers' ``hidden_states[n_layers]``, which most
models return after the final norm: a source quirk, imported as it is.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .result import (ImportedPreset, ImportedVector, ImportResult, as_vector, checked_preset,
                     inside, layer_of, read_pt, scale_of, vector_id)

NOTES = ("model", "extracted_via", "preset_provenance")  # manifest-wide, kept with each vector


def import_dictionary(root: Path, manifest: dict[str, Any], *, n_layers: int | None,
                      id_prefix: str) -> tuple[ImportResult, set[str]]:
    """The vectors ``manifest`` lists, and the file names it lists (imported or not)."""
    entries = manifest.get("directions")
    if not isinstance(entries, list):
        raise ValueError(f"{root / 'manifest.json'}: `directions` must be a list")
    notes = {k: manifest[k] for k in NOTES if k in manifest}
    result, listed = ImportResult(), set()
    for i, entry in enumerate(entries):
        where = f"{root / 'manifest.json'}: directions[{i}]"
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) \
                    or Path(entry["name"]).name != entry["name"]:
                raise ValueError(f"{where}: an entry needs a `name` (its file is <name>.pt)")
            listed.add(f"{entry['name']}.pt")
            result.vectors.append(_vector(inside(root, root / f"{entry['name']}.pt"), entry, notes,
                                          n_layers, id_prefix))
        except ValueError as e:
            result.problems.append(str(e))
    return result, listed


def _vector(path: Path, entry: dict[str, Any], notes: dict[str, Any], n_layers: int | None,
            id_prefix: str) -> ImportedVector:
    vid = vector_id(path.stem, id_prefix, path)
    if not path.is_file():
        raise ValueError(f"{path}: listed in manifest.json but missing")
    preset = _preset(vid, entry, notes, path, n_layers)
    tensor = as_vector(read_pt(path), path, n_layers)
    metadata = {"imported_from": "hidden-directions", **notes, **entry}
    return ImportedVector(vid, tensor, None, metadata, path, preset)


def _preset(vid: str, entry: dict[str, Any], notes: dict[str, Any], path: Path,
            n_layers: int | None) -> ImportedPreset | None:
    if entry.get("recommended_layer") is None:
        return None
    layer = layer_of(entry["recommended_layer"], "recommended_layer", path, n_layers)
    alpha = entry.get("recommended_alpha")
    alpha = 1.0 if alpha is None else scale_of(alpha, "recommended_alpha", path)
    model = notes.get("model") or "its model"
    return checked_preset(({"id": vid, "layer": layer, "scale": alpha},),
                  f"hidden-directions: recommended layer {layer}, alpha {alpha:g} ({model})", path)
