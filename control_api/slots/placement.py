"""Which mailbox rows a vector needs on a given engine.

A ``(hidden,)`` vector is one row that serves any layer (slot layer ``ANY_LAYER``), and so is a
``(1, hidden)`` one on a model of more than one layer. A ``(n_layers, hidden)`` vector is one row
per layer it is materialised on: the layers named at upload, or every layer the engine armed.
The same rules run at upload (to refuse it) and whenever an engine attaches, since an
engine restart may bring another model or arm other layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hotwire.shared.mailbox import ANY_LAYER, Fingerprint
from hotwire.shared.wire import VectorError, check_vector

from ..layer_lists import format_layers


def is_per_layer(shape: Sequence[int], fp: Fingerprint) -> bool:
    return len(shape) == 2 and shape[0] == fp.n_layers


def target_layers(shape: Sequence[int], layers: Sequence[int] | None, fp: Fingerprint,
                  armed: Sequence[int]) -> tuple[int, ...]:
    """Slot layers of a vector of ``shape`` on this engine, or raise :class:`VectorError`."""
    fits = shape and shape[-1] == fp.hidden and (
        len(shape) == 1 or (len(shape) == 2 and shape[0] in (1, fp.n_layers)))
    if not fits:
        raise VectorError("bad_shape", f"shape {list(shape)} does not match the model: "
                          f"expected [{fp.hidden}] or [{fp.n_layers}, {fp.hidden}]")
    if not is_per_layer(shape, fp):
        if layers is not None:
            raise VectorError("bad_layers", f"a vector of shape {list(shape)} serves every layer; "
                              f"`layers` applies to [{fp.n_layers}, {fp.hidden}] vectors")
        return (ANY_LAYER,)
    if layers is None:
        return tuple(armed)
    if not layers:
        raise VectorError("bad_layers", "`layers` must name at least one layer")
    outside = sorted(set(layers) - set(range(fp.n_layers)))
    if outside:
        raise VectorError("bad_layers", f"layers {outside} are outside the model's "
                          f"0..{fp.n_layers - 1}")
    unarmed = sorted(set(layers) - set(armed))
    if unarmed:
        raise VectorError("bad_layers", f"layers {unarmed} are not armed by the engine "
                          f"(armed: {format_layers(armed) or 'none'})")
    return tuple(sorted(set(layers)))


def mailbox_rows(vector: np.ndarray, fp: Fingerprint,
                 layers: tuple[int, ...]) -> list[tuple[int, np.ndarray]]:
    """``(slot layer, float32 row)`` pairs for ``layers`` (from :func:`target_layers`).

    Runs :func:`check_vector` again, so values that overflow this engine's dtype are refused.
    """
    checked = check_vector(vector, fp.shape)
    if layers == (ANY_LAYER,):
        return [(ANY_LAYER, checked[0])]
    return [(layer, checked[layer]) for layer in layers]
