"""Host-to-device copies that never make the host wait for the GPU.

vLLM prepares step N+1 on the host while step N runs on the GPU. A copy from pageable host
memory (``torch.tensor(..., device=...)``, or ``.to(non_blocking=True)`` of a plain numpy array)
stalls the host until the stream drains, which would serialise that overlap on every step a
request arrives or the batch changes. CUDA copies here go through pinned blocks of torch's
caching host allocator instead: it records the copy on the stream and does not hand a block out
again before the copy has run, so the host returns as soon as the copy is enqueued.
"""

from __future__ import annotations

import numpy as np
import torch


def _staged(a: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory() if device.type == "cuda" else t


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` (its shape and dtype) on ``device``; on a CUDA device enqueued, not awaited."""
    return _staged(a, device).to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, a: np.ndarray) -> None:
    """``dst.copy_(a)``; on a CUDA device enqueued, not awaited."""
    dst.copy_(_staged(a, dst.device), non_blocking=True)
