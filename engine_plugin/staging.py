"""Host-to-device hand-offs that never make the host wait for the GPU.

vLLM prepares step N+1 on the host while step N runs on the GPU. A copy from pageable host
memory (``torch.tensor(..., device=...)``, or ``.to(non_blocking=True)`` of a plain numpy array)
stalls the host until the stream drains, which would serialise that overlap on every step a
request arrives or the batch changes. So:

* :func:`to_device` (a rare path: a vector registered) copies through pinned
  blocks of torch's caching host allocator: it records the copy on the stream and does not hand
  a block out again before the copy has run, so the host returns as soon as the copy is enqueued.
* :class:`HostRing` (every step in which the batch changes) holds pinned buffers the host fills
  with numpy and copies from into fixed device tensors, in stream order. On CUDA the copy is the
  driver's ``cuMemcpyAsync`` called through ``ctypes.PyDLL``, which keeps the GIL: no torch call
  at all. Fewer torch calls is the point: each one releases the GIL, and in a served engine
  vLLM's output thread then takes it and the step thread waits for it back (measured on the H200
  at 256 in flight: ~70 µs a call where it costs ~7 µs alone). Slicing a tensor is such a call
  too (``aten::slice`` lets the GIL go, as ``stride(dim)`` does; ``shape``, ``stride()`` and
  ``data_ptr()`` do not), and so do numpy's larger operations: a fancy-index gather, and a copy,
  fill or reduction of more than 500 elements. So the routing uses no gather or reduction, and
  fills its buffers through :func:`put` and :func:`clear` (CPython's ``memoryview`` copies), and
  V1's token counts come from :func:`diff` (numpy in pieces of at most 500). On
  the CPU the copies are those too, into the tables' own memory; where torch copies instead (CUDA
  without a driver to call), the spans are views made once and kept (:class:`Spans`).
"""

from __future__ import annotations

import ctypes
import functools
import logging

import numpy as np
import torch

log = logging.getLogger("vllm.hotwire")


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` (its shape and dtype) on ``device``; on a CUDA device enqueued, not awaited."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)


@functools.cache
def _driver_memcpy():
    """The CUDA driver's ``cuMemcpyAsync(dst, src, bytes, stream)`` (unified addresses: any
    direction), called with the GIL held; None where the driver cannot be loaded."""
    try:
        fn = ctypes.PyDLL("libcuda.so.1").cuMemcpyAsync
    except (OSError, AttributeError) as e:
        log.info("hotwire: no CUDA driver to copy routing uploads through (%s); torch copies them", e)
        return None
    fn.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


def put(dst: np.ndarray, at: int, src: np.ndarray) -> None:
    """``dst[at: at + len(src)] = src`` for 1-D arrays of one dtype, keeping the GIL: numpy lets
    it go to copy or fill more than 500 elements, CPython's ``memoryview`` copy does not."""
    memoryview(dst)[at: at + len(src)] = memoryview(src)


def clear(dst: np.ndarray, start: int, stop: int) -> None:
    """``dst[start:stop] = 0`` for a 1-D int32 array, keeping the GIL (:func:`put`)."""
    global _ZEROS
    if len(_ZEROS) < stop - start:
        _ZEROS = np.zeros(max(stop - start, 2 * len(_ZEROS)), dtype=np.int32)
    put(dst, start, _ZEROS[: stop - start])


_ZEROS = np.zeros(4096, dtype=np.int32)
_PIECE = 500  # numpy keeps the GIL for an elementwise loop of at most this many elements


def diff(a: np.ndarray) -> np.ndarray:
    """``np.diff(a)`` of a 1-D array, keeping the GIL: the subtraction in pieces of :data:`_PIECE`."""
    out = np.empty(len(a) - 1, dtype=a.dtype)
    for i in range(0, len(out), _PIECE):
        j = min(i + _PIECE, len(out))
        np.subtract(a[i + 1: j + 1], a[i:j], out=out[i:j])
    return out


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


def _raw_stream(device: torch.device):
    """A function giving the device's current stream as a ``cudaStream_t`` (the one inductor's
    generated code launches on: the forward's)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return functools.partial(raw, index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


class DeviceWords:
    """A fixed int32 device tensor as flat words, the target of :meth:`HostRing.copy` (on the
    CPU also as the numpy array sharing its memory)."""

    def __init__(self, tensor: torch.Tensor):
        assert tensor.dtype == torch.int32 and tensor.is_contiguous()
        self.address, self.spans = tensor.data_ptr(), Spans(tensor.view(-1))
        self.host = tensor.view(-1).numpy() if tensor.device.type == "cpu" else None


class HostRing:
    """``depth`` int32 host buffers of ``words`` each, used in turn: :meth:`next` hands out the
    next one's numpy view to fill, :meth:`copy` enqueues a span of it into a device tensor.

    No copy makes a torch call (``direct``) where it can: on CUDA the buffers are pinned and copied
    by the driver's ``cuMemcpyAsync`` on the current stream, on the CPU by numpy, both holding the
    GIL; on CUDA without a driver to call, by a torch copy.

    Reuse contract: a buffer is filled again ``depth`` calls of :meth:`next` later, so the copies
    from it must have run by then. A caller that takes one buffer per engine step needs a depth
    above the number of steps vLLM keeps in flight (``VllmConfig.max_concurrent_batches``: at a
    step's start the inputs of the step two before it have been consumed; vLLM double-buffers its
    own pinned inputs on the same ground).
    """

    def __init__(self, words: int, depth: int, device: torch.device):
        cuda = device.type == "cuda"
        self._host = [torch.zeros(words, dtype=torch.int32, pin_memory=cuda) for _ in range(depth)]
        self._np = [h.numpy() for h in self._host]
        self._address = [h.data_ptr() for h in self._host]
        self._spans = [Spans(h) for h in self._host]
        self._memcpy = _driver_memcpy() if cuda else None
        self._cpu = device.type == "cpu"
        self._stream = _raw_stream(device) if cuda else None
        self._i = -1

    @property
    def direct(self) -> bool:
        """Do the copies keep the GIL (no torch call)?"""
        return self._cpu or self._memcpy is not None

    def next(self) -> np.ndarray:
        """The next buffer, to fill on the host (its previous contents stay until overwritten)."""
        self._i = (self._i + 1) % len(self._host)
        return self._np[self._i]

    def copy(self, start: int, stop: int, dst: DeviceWords, at: int) -> None:
        """Words ``[start, stop)`` of the current buffer into ``dst``'s words from ``at``, enqueued
        on the current stream (the host does not wait)."""
        if dst.host is not None:
            put(dst.host, at, self._np[self._i][start:stop])
            return
        if self._memcpy is not None:
            rc = self._memcpy(dst.address + 4 * at, self._address[self._i] + 4 * start, 4 * (stop - start),
                              self._stream())
            if rc == 0:
                return
            log.warning("hotwire: cuMemcpyAsync failed (CUresult %d); routing uploads are torch copies from now on",
                        rc)
            self._memcpy = None
        with torch.inference_mode():
            dst.spans.get(at, at + stop - start).copy_(self._spans[self._i].get(start, stop), non_blocking=True)
