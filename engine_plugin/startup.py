"""Vectors loaded at engine start from ``HOTWIRE_VECTORS=<dir>``.

``<id>.safetensors`` (one tensor) or ``<id>.pt`` (a tensor, read with
``torch.load(weights_only=True)``; nothing else is unpickled), each ``(hidden,)`` or
``(n_layers, hidden)``. A bad file is logged by name and skipped; the engine still starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from hotwire.shared.spec import valid_id
from hotwire.shared.wire import ModelShape, VectorError, check_vector, decode_safetensors

log = logging.getLogger("vllm.hotwire")


def _read(path: Path) -> np.ndarray:
    if path.suffix == ".safetensors":
        return decode_safetensors(path.read_bytes())
    t = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise VectorError("bad_dtype", f"holds {type(t).__name__}, not a float tensor")
    return t.float().numpy()


def load_dir(directory: str, model: ModelShape) -> list[tuple[str, np.ndarray]]:
    """``[(id, float32 [1 or n_layers, hidden])]`` for every good file, sorted by id."""
    root = Path(directory)
    if not root.is_dir():
        log.error("hotwire: HOTWIRE_VECTORS=%s is not a directory; no startup vectors", directory)
        return []
    out = []
    for path in sorted(root.iterdir()):
        if path.suffix not in (".safetensors", ".pt"):
            continue
        if not valid_id(path.stem):
            log.error("hotwire: skipping %s: %r is not a valid vector id", path, path.stem)
            continue
        try:
            out.append((path.stem, check_vector(_read(path), model)))
        except Exception as e:  # any unreadable file is skipped, never fatal to the engine
            log.error("hotwire: skipping %s: %s", path, e)
    return out
