"""Host-to-device hand-offs that never make the host wait for the GPU.

vLLM prepares step N+1 on the host while step N runs on the GPU. A copy from pageable host
memory (``torch.tensor(..., device=...)``, or ``.to(non_blocking=True)`` of a plain numpy array)
stalls the host until the stream drains, which would serialise that overlap on every step a
request arrives or the batch changes. So:

* :func:`to_device` (a rare path: a vector registered) copies through pinned
  blocks of torch's caching host allocator: it records the copy on the stream and does not hand
  a block out again before the copy has run, so the host returns as soon as the copy is enqueued.
* :class:`HostRing` (every step in which the batch changes) holds pinned buffers the host fills
  with numpy, which the device reads in place where it can (CUDA unified addressing): the hand-off
  is then no torch call at all, only the kernel that consumes it. Fewer torch calls is the point:
  each one releases the GIL, and in a served engine vLLM's output thread then takes it and the
  step thread waits for it back (measured on the H200 at 256 in flight: ~70 µs a call where it
  costs ~7 µs alone). Slicing a tensor is such a call too (``aten::slice`` lets the GIL go, as
  ``stride(dim)`` does; ``shape``, ``stride()`` and ``data_ptr()`` do not), so the spans a ring
  hands out, and those of the tables they are gathered into, are views made once and kept
  (:class:`Spans`).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger("vllm.hotwire")


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` (its shape and dtype) on ``device``; on a CUDA device enqueued, not awaited."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)


def _unified_view(host: torch.Tensor) -> torch.Tensor | None:
    """A CUDA tensor aliasing pinned ``host`` (unified virtual addressing, through vLLM's own
    op), None where vLLM or the platform offers none.

    The op's library is loaded by vLLM's platform module when the platform is resolved (which
    ``is_uva_available`` does), not by importing a library by name: vLLM 0.25 builds it into
    ``_C_stable_libtorch``, later releases elsewhere."""
    try:
        from vllm.utils.platform_utils import is_uva_available
        from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

        return get_accelerator_view_from_cpu_tensor(host) if is_uva_available() else None
    except Exception as e:  # an older or newer vLLM without these, or a platform without the op
        log.info("hotwire: no unified-address view of pinned host memory (%s: %s); routing uploads "
                 "are copied", type(e).__name__, e)
        return None


class Spans:
    """Views of one tensor that never moves, each made on first use and kept: ``get(start, stop)``
    is ``tensor[start:stop]`` (viewed as ``shape`` if given) with no torch call once made. At most
    one view per distinct span, and a step's spans recur (batch sizes)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor
        self._views: dict[tuple[int, int, tuple[int, ...] | None], torch.Tensor] = {}

    def get(self, start: int, stop: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        key = (start, stop, shape)
        view = self._views.get(key)
        if view is None:
            view = self._tensor[start:stop]
            view = self._views[key] = view if shape is None else view.view(shape)
        return view


class HostRing:
    """``depth`` int32 host buffers of ``words`` each, used in turn: :meth:`next` hands out the
    next one's numpy view to fill, :meth:`read` a span of it as a tensor the device reads.

    On CUDA the buffers are pinned and, where vLLM offers unified addressing, read by kernels in
    place (``direct``); otherwise :meth:`read` enqueues one copy. On CPU a buffer is read as it is.

    Reuse contract: a buffer is filled again ``depth`` calls of :meth:`next` later, so whatever
    reads it must have run by then. A caller that takes one buffer per engine step needs a depth
    above the number of steps vLLM keeps in flight (``VllmConfig.max_concurrent_batches``: at a
    step's start the inputs of the step two before it have been consumed; vLLM double-buffers its
    own pinned inputs on the same ground).
    """

    def __init__(self, words: int, depth: int, device: torch.device):
        cuda = device.type == "cuda"
        self._host = [torch.zeros(words, dtype=torch.int32, pin_memory=cuda) for _ in range(depth)]
        self._np = [h.numpy() for h in self._host]
        views = [_unified_view(h) if cuda else h for h in self._host]
        self.direct = all(v is not None for v in views)
        self._spans = [Spans(v) for v in (views if self.direct else self._host)]
        self._device = device
        self._i = -1

    def next(self) -> np.ndarray:
        """The next buffer, to fill on the host (its previous contents stay until overwritten)."""
        self._i = (self._i + 1) % len(self._host)
        return self._np[self._i]

    def read(self, start: int, stop: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Words ``[start, stop)`` of the current buffer (viewed as ``shape`` if given), as the
        device reads them."""
        view = self._spans[self._i].get(start, stop, shape)
        return view if self.direct else view.to(self._device, non_blocking=True)
