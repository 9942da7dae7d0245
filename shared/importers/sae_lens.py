"""SAELens SAEs as saved on disk (``SAE.save_model``, and the folders of the releases on the
Hugging Face hub): a directory holding ``cfg.json`` and ``sae_weights.safetensors``.

Read as sae-lens 6 reads them (``sae_lens_disk_loader``, then ``handle_config_defaulting``):
``cfg.json`` has ``d_in``, ``d_sae``, ``architecture`` and the hook point, under ``metadata``
since 6.0 (``metadata.hook_name``) and at the top level before (``hook_name``, or
``hook_point`` in older files); ``hook_head_index`` must be empty (a head's slice is not a
stream direction). The weights file holds ``W_dec``, ``[d_sae, d_in]``, in the dtype the config
names (bfloat16 included), and for JumpReLU SAEs a ``threshold`` per feature. Feature ``i`` is
``W_dec[i]`` as stored (sae-lens' ``load_from_disk`` changes no decoder row), kept unscaled:
what Neuronpedia steers with.

The hook point names the layer (:mod:`.sae_features`): ``blocks.L.hook_resid_post`` is hotwire
``layer: L``, ``blocks.L.hook_resid_pre`` is ``layer: L - 1``. The SAE gives no steering scale,
so no preset comes with the vectors: ``hotwire vectors sweep`` calibrates one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .result import ImportResult, inside, read_manifest
from .sae_features import checked_features, feature_vectors, hook_layer, name_of
from .tensor_rows import safetensors_header, safetensors_rows

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
KEPT = ("model_name", "hook_name", "architecture", "d_in", "d_sae", "dtype",
        "normalize_activations", "apply_b_dec_to_input", "neuronpedia_id", "sae_lens_version",
        "sae_lens_training_version", "dataset_path", "context_size", "prepend_bos")


def is_sae_lens(root: Path) -> bool:
    return (root / CONFIG).is_file() and (root / WEIGHTS).is_file()


def import_sae(root: Path, *, n_layers: int | None, id_prefix: str,
               features: Sequence[int] | None, sae_name: str | None) -> ImportResult:
    """The chosen features of the SAE in ``root``; :class:`ValueError` names what is wrong."""
    cfg = _config(read_manifest(inside(root, root / CONFIG)))
    where = root / CONFIG
    if cfg.get("hook_head_index") is not None:
        raise ValueError(f"{where}: the SAE reads one attention head (hook_head_index "
                         f"{cfg['hook_head_index']}), not the residual stream")
    layer = hook_layer(cfg.get("hook_name"), where, n_layers)
    d_in, d_sae = _size(cfg, "d_in", where), _size(cfg, "d_sae", where)
    weights = inside(root, root / WEIGHTS)
    shape = safetensors_header(weights).get("W_dec", {}).get("shape")
    if shape != [d_sae, d_in]:
        raise ValueError(f"{weights}: W_dec has shape {shape}, but {CONFIG} says "
                         f"[d_sae, d_in] = [{d_sae}, {d_in}]")
    chosen = checked_features(features, d_sae, where)
    rows = safetensors_rows(weights, "W_dec", chosen)
    extras = None
    if "threshold" in safetensors_header(weights):
        thresholds = safetensors_rows(weights, "threshold", chosen)
        extras = [{"threshold": float(t)} for t in thresholds.reshape(-1)]
    metadata = {"imported_from": "sae-lens", **{k: cfg[k] for k in KEPT if _plain(cfg.get(k))}}
    name = sae_name or name_of(root.resolve().name)
    return ImportResult(feature_vectors(name, chosen, rows, layer, metadata, weights, id_prefix,
                                        extras))


def _config(raw: dict[str, Any]) -> dict[str, Any]:
    """The config with its hook fields at the top level, whichever sae-lens wrote it."""
    cfg = dict(raw)
    meta = raw.get("metadata")
    if isinstance(meta, dict):
        cfg.update({k: v for k, v in meta.items() if k not in cfg or cfg[k] is None})
    if cfg.get("hook_name") is None and "hook_point" in cfg:
        cfg["hook_name"] = cfg["hook_point"]
        cfg.setdefault("hook_head_index", cfg.get("hook_point_head_index"))
    return cfg


def _size(cfg: dict[str, Any], key: str, where: Path) -> int:
    value = cfg.get(key)
    if type(value) is not int or value <= 0:
        raise ValueError(f"{where}: {key} must be a positive int, got {value!r}")
    return value


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))
