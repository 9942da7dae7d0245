"""What the SAE importers share: the hook point a feature lives at, as hotwire's layer; the
features picked by index; one vector per feature.

A sparse autoencoder's feature ``i`` writes row ``i`` of its decoder (``W_dec``,
``[d_sae, d_in]``) into the stream its hook point reads. Steering with the feature adds that row
there, as Neuronpedia's steering does (``activations += strength * W_dec[i]``, the row as
stored). hotwire steers the stream a decoder layer outputs, so only the residual stream between
blocks can be imported, in TransformerLens' names:

- ``blocks.L.hook_resid_post``, what block ``L`` outputs: vLLM decoder layer ``L``, hotwire
  ``layer: L``;
- ``blocks.L.hook_resid_pre``, what block ``L`` receives: the output of decoder layer ``L - 1``,
  hotwire ``layer: L - 1``. ``blocks.0.hook_resid_pre`` is the embedding, before any decoder
  layer, which hotwire cannot steer.

Neuronpedia's inference server maps them the same way for models it runs with nnsight
(``resid_post`` L: layer L's output; ``resid_pre`` L: layer L - 1's). Other hook points (MLP
or attention outputs, ``hook_z``, a head index) are not the stream between layers and are refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .result import ImportedVector, as_vector, layer_of, vector_id

RESIDUAL_HOOK = re.compile(r"blocks\.(\d+)\.hook_resid_(pre|post)")
_NOT_ID = re.compile(r"[^A-Za-z0-9._-]+")


def hook_layer(hook: Any, where: Path | str, n_layers: int | None) -> int:
    """hotwire's layer for a TransformerLens hook name, else :class:`ValueError` saying why."""
    match = RESIDUAL_HOOK.fullmatch(hook) if isinstance(hook, str) else None
    if match is None:
        raise ValueError(f"{where}: hook point {hook!r} is not the residual stream between blocks "
                         "(blocks.L.hook_resid_post or blocks.L.hook_resid_pre), the stream "
                         "hotwire steers")
    block, side = int(match[1]), match[2]
    if side == "pre" and block == 0:
        raise ValueError(f"{where}: blocks.0.hook_resid_pre is the embedding, before any decoder "
                         "layer: hotwire steers decoder layers' outputs")
    layer = block if side == "post" else block - 1
    return layer_of(layer, f"the layer {hook} names", where, n_layers)


def name_of(text: str) -> str:
    """``text`` made an id's worth of characters (runs of others become ``-``)."""
    return _NOT_ID.sub("-", text).strip("-.") or "sae"


def checked_features(features: Sequence[int] | None, d_sae: int, where: Path) -> list[int]:
    """The features asked for, each a row the decoder has; :class:`ValueError` otherwise."""
    if not features:
        raise ValueError(f"{where}: an SAE has {d_sae} features; pick the ones to import by "
                         "index (--features 1234,5678)")
    outside = sorted({f for f in features if not 0 <= f < d_sae})
    if outside:
        raise ValueError(f"{where}: the SAE has {d_sae} features (0..{d_sae - 1}); no feature "
                         f"{', '.join(map(str, outside))}")
    return list(dict.fromkeys(features))


def feature_vectors(sae: str, features: Sequence[int], rows: np.ndarray, layer: int,
                    metadata: dict[str, Any], where: Path, id_prefix: str,
                    per_feature: Sequence[dict[str, Any]] | None = None) -> list[ImportedVector]:
    """One ``[d_in]`` vector per feature, ``<prefix><sae>.<index>``, with the SAE's metadata,
    the feature's index, layer and decoder norm, and ``per_feature`` extras (a threshold)."""
    vectors = []
    for i, (feature, row) in enumerate(zip(features, rows)):
        vid = vector_id(f"{sae}.{feature}", id_prefix, where)
        extra = per_feature[i] if per_feature else {}
        meta = {**metadata, "sae": sae, "feature": int(feature), "layer": layer,
                "decoder_norm": round(float(np.linalg.norm(row)), 6), **extra}
        vectors.append(ImportedVector(vid, as_vector(row, where, None), None, meta, where))
    return vectors
