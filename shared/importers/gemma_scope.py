"""Gemma Scope SAEs (google/gemma-scope-<size>-<pt|it>-<site>, on Gemma 2): a ``params.npz`` per
SAE, in its Hugging Face repository's layout: ``layer_<L>/width_<W>/<l0>/params.npz``.

The archive holds ``W_enc`` ``[d_model, d_sae]``, ``W_dec`` ``[d_sae, d_model]``, ``b_enc``,
``b_dec`` and ``threshold`` ``[d_sae]`` (the JumpReLU thresholds), as Gemma Scope's tutorial
loads them and sae-lens' ``gemma_2_sae_huggingface_loader`` reads them (it also takes lower-case
``w_dec``, as here). The file names no hook point; the path does. ``layer_<L>`` is the block,
and the residual-stream releases (``-res``) read ``blocks.L.hook_resid_post``, the output of
``model.layers[L]`` (the tutorial's forward hook; sae-lens' hook name for them): hotwire
``layer: L``. The MLP, attention and transcoder releases read other points, the ``embedding``
SAEs the embedding: refused, as is a path without the repository's name (its site cannot be
told). Gemma Scope 2 (Gemma 3, other file layout) is not read here. Feature ``i`` is
``W_dec[i]`` as stored, its threshold in the metadata; no preset (Gemma Scope gives no
steering scale).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from .result import ImportResult, layer_of
from .sae_features import checked_features, feature_vectors, name_of
from .tensor_rows import npz_names, npz_rows, npz_shape

PARAMS = "params.npz"
RELEASE = re.compile(r"gemma-scope-(?P<size>\d+b)-(?P<kind>pt|it)-(?P<site>[a-z]+)")
SITES = {"mlp": "the MLP output", "att": "the attention output", "transcoders": "an MLP's input"}
LAYER = re.compile(r"layer_(\d+)")


def import_params(path: Path, *, n_layers: int | None, id_prefix: str,
                  features: Sequence[int] | None, sae_name: str | None) -> ImportResult:
    """The chosen features of the SAE in ``path`` (a ``params.npz``)."""
    parts = path.resolve().parts
    release = next((m for part in reversed(parts) if (m := RELEASE.search(part))), None)
    if release is None:
        raise ValueError(f"{path}: cannot tell which stream this SAE reads: Gemma Scope's files "
                         "name no hook point, its repository does (gemma-scope-<size>-<pt|it>-res"
                         "/layer_<L>/...); keep that layout")
    if release["site"] != "res":
        raise ValueError(f"{path}: {release[0]} SAEs read "
                         f"{SITES.get(release['site'], release['site'])}, not the residual "
                         "stream hotwire steers (use a -res release)")
    at = max((i for i, part in enumerate(parts[:-1]) if LAYER.fullmatch(part)), default=None)
    if at is None:
        raise ValueError(f"{path}: no layer_<L> folder in its path (Gemma Scope keeps each SAE "
                         "under layer_<L>/width_<W>/<l0>/; an embedding SAE reads the embedding, "
                         "which hotwire cannot steer)")
    layer = layer_of(int(LAYER.fullmatch(parts[at])[1]), "its layer_<L> folder", path, n_layers)
    key = next((k for k in ("W_dec", "w_dec") if k in npz_names(path)), "W_dec")
    shape = npz_shape(path, key)
    if len(shape) != 2:
        raise ValueError(f"{path}: {key} has shape {list(shape)}; expected [d_sae, d_model]")
    chosen = checked_features(features, shape[0], path)
    rows = npz_rows(path, key, chosen)
    thresholds = npz_rows(path, "threshold", chosen).reshape(-1)
    folder = "/".join(parts[at:-1])
    model = f"gemma-2-{release['size']}" + ("-it" if release["kind"] == "it" else "")
    metadata = {"imported_from": "gemma-scope", "release": release[0], "model": model,
                "hook_name": f"blocks.{layer}.hook_resid_post", "folder": folder,
                "d_sae": shape[0], "architecture": "jumprelu"}
    name = sae_name or name_of(folder.replace("/", "-"))
    return ImportResult(feature_vectors(name, chosen, rows, layer, metadata, path, id_prefix,
                                        [{"threshold": float(t)} for t in thresholds]))
