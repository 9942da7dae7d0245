"""Host-to-device hand-offs that never make the host wait for the GPU.

vLLM prepares step N+1 on the host while step N runs on the GPU. A copy from pageable host
memory (``torch.tensor(..., device=...)``, or ``.to(non_blocking=True)`` of a plain numpy array)
stalls the host until the stream drains, which would serialise that overlap on every step a
request arrives or the batch changes. So:

* :func:`to_device` (a rare path: a vector registered) copies through pinned
  blocks of torch's caching host allocator: it records the copy on the stream and does not hand
  a block out again before the copy has run, so the host returns as soon as the copy is enqueued.
* :class:`HostRing` (every step in which the batch changes) holds pinned buffers the host fills
  with numpy and hands to the device in stream order. On CUDA the GPU reads them itself
  (:mod:`.upload_triton`: one kernel per upload, through the buffers' device addresses), not a
  copy engine, whose copies make the step wait on a busy GPU. No torch call is made for it: each
  one releases the GIL, and in a served engine vLLM's output thread then takes it and the step
  thread waits for it back (measured on the H200 at 256 in flight: ~70 µs a call where it costs
  ~7 µs alone; the kernel's launch lets it go once). Slicing a tensor is such a call
  too (``aten::slice`` lets the GIL go, as ``stride(dim)`` does; ``shape``, ``stride()`` and
  ``data_ptr()`` do not), and so do numpy's larger operations: a fancy-index gather, and a copy,
  fill or reduction of more than 500 elements. So the routing uses no gather or reduction, and
  fills its buffers through :func:`put` and :func:`clear` (CPython's ``memoryview`` copies), and
  V1's token counts come from :func:`diff` (numpy in pieces of at most 500). On
  the CPU the copies are those too, into the tables' own memory; where torch copies instead (CUDA
  without a driver to map the buffers), the spans are views made once and kept (:class:`Spans`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .driver_launch import libcuda

log = logging.getLogger("vllm.hotwire")


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` (its shape and dtype) on ``device``; on a CUDA device enqueued, not awaited."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)


@functools.cache
def _device_address():
    """A function giving the device address of a pinned host address (the driver's
    ``cuMemHostGetDevicePointer``; under unified addressing most often the same number), None
    where the driver cannot be loaded; the function answers None for an address it cannot map."""
    try:
        fn = libcuda().cuMemHostGetDevicePointer_v2
    except (OSError, AttributeError) as e:
        log.info("hotwire: no CUDA driver to map routing uploads through (%s); torch copies them", e)
        return None
    fn.argtypes = (ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint)
    fn.restype = ctypes.c_int

    def device(host: int) -> int | None:
        out = ctypes.c_uint64()
        return out.value if fn(ctypes.byref(out), host, 0) == 0 else None
    return device


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


@functools.cache
def say_unmapped() -> None:
    log.warning("hotwire: the CUDA driver could not map the routing's pinned buffers; torch copies them "
                "(each copy lets the GIL go)")


class DeviceWords:
    """A fixed int32 device tensor as flat words, the target of :meth:`HostRing.copy` (on the
    CPU also as the numpy array sharing its memory)."""

    def __init__(self, tensor: torch.Tensor):
        assert tensor.dtype == torch.int32 and tensor.is_contiguous()
        self.address, self.spans = tensor.data_ptr(), Spans(tensor.view(-1))
        self.host = tensor.view(-1).numpy() if tensor.device.type == "cpu" else None


Span = tuple[int, int, DeviceWords, int]  # (start, stop, dst, at): the buffer's words [start, stop) to dst from word at


class Expansion(NamedTuple):
    """A token map the upload kernel writes on the device from the runner's batch
    (:mod:`.upload_triton`): ``tok[query_starts[i]: query_starts[i+1]] = rows[states[i]]`` for
    ``i < requests``, then ``tok[tokens: clear_to] = 0``."""

    states: int  # device address: the runner's request state of each batch entry, [requests] int32
    query_starts: int  # device address: where each entry's tokens start, [requests + 1] int32
    rows_at: int  # word of the current buffer where hotwire's request row per state starts
    tok: DeviceWords  # the token map
    requests: int
    tokens: int
    clear_to: int


class HostRing:
    """``depth`` int32 host buffers of ``words`` each, used in turn: :meth:`next` hands out the
    next one's numpy view to fill, :meth:`copy` enqueues spans of it into device tensors.

    On CUDA the buffers are pinned and one :mod:`.upload_triton` kernel per :meth:`copy` reads them
    through their device addresses (at most ``spans`` spans a call), on the current stream, launched
    by the driver where it can be (:attr:`how`); on the CPU numpy copies them. Neither is a torch
    call (``direct``). Where the driver cannot map the
    buffers, each span is a torch copy.

    Reuse contract: a buffer (and the kernel's description of its spans) is filled again ``depth``
    calls of :meth:`next` later, so the copies from it must have run by then. A caller that takes
    one buffer per engine step needs a depth above the number of steps vLLM keeps in flight
    (``VllmConfig.max_concurrent_batches``: at a step's start the inputs of the step two before it
    have been consumed; vLLM double-buffers its own pinned inputs on the same ground).
    """

    def __init__(self, words: int, depth: int, device: torch.device, spans: int = 1):
        cuda = device.type == "cuda"
        self._host = [torch.zeros(words, dtype=torch.int32, pin_memory=cuda) for _ in range(depth)]
        self._np = [h.numpy() for h in self._host]
        self._spans = [Spans(h) for h in self._host]
        self._cpu = device.type == "cpu"
        self._i = -1
        self._desc: list[np.ndarray] | None = None  # per buffer the kernel's description, int64, pinned
        if cuda:
            self._map(depth, spans, device)

    def _map(self, depth: int, spans: int, on: torch.device) -> None:
        """The device addresses of the buffers and of the kernel's descriptions (none: torch copies)."""
        device = _device_address()
        if device is None:
            return
        from . import upload_triton  # Triton is only needed (and present) where CUDA is

        desc = [torch.zeros(upload_triton.HEADER + 3 * spans, dtype=torch.int64, pin_memory=True)
                for _ in range(depth)]
        mapped = [device(t.data_ptr()) for t in self._host + desc]
        if None in mapped:
            say_unmapped()
            return
        self._desc_pinned = desc  # kept: the kernel reads them by address
        self._address, self._desc_address = mapped[:depth], mapped[depth:]
        self._desc = [t.numpy() for t in desc]
        self._head = [d[: upload_triton.HEADER] for d in self._desc]
        self._segments = [d[upload_triton.HEADER:].reshape(spans, 3) for d in self._desc]
        # compiled now (a header of zeros: nothing to move), not at the first steered step
        index = on.index if on.index is not None else torch.cuda.current_device()
        self._kernel = upload_triton.launcher(self._desc_address[0], index)
        self._by_driver = self._kernel is not upload_triton.launch

    @property
    def direct(self) -> bool:
        """Do the copies need no torch call (numpy on the CPU, the upload kernel on CUDA)?"""
        return self._cpu or self._desc is not None

    @property
    def how(self) -> str:
        """How :meth:`copy` moves the words: ``numpy`` (CPU), ``torch copies``, or the upload kernel
        launched by the driver (:mod:`.driver_launch`) or by Triton."""
        if self._cpu:
            return "numpy"
        if self._desc is None:
            return "torch copies"
        return f"the upload kernel, launched by {'the driver' if self._by_driver else 'Triton'}"

    def next(self) -> np.ndarray:
        """The next buffer, to fill on the host (its previous contents stay until overwritten)."""
        self._i = (self._i + 1) % len(self._host)
        return self._np[self._i]

    @property
    def expands(self) -> bool:
        """Can :meth:`copy` expand a token map on the device (the upload kernel)? Else the caller
        expands it on the host and copies it as a span."""
        return self._desc is not None

    def copy(self, spans: Sequence[Span], expansion: Expansion | None = None) -> None:
        """``spans`` of the current buffer into their device tensors, and the ``expansion`` (only
        where :attr:`expands`), enqueued on the current stream (the host does not wait)."""
        if self._desc is not None:
            head, segments, src = self._head[self._i], self._segments[self._i], self._address[self._i]
            for j, (start, stop, dst, at) in enumerate(spans):
                segments[j] = (dst.address + 4 * at, src + 4 * start, stop - start)
            programs = len(spans)
            if expansion is None:
                head[0] = programs
            else:
                e = expansion
                head[:] = (programs, e.states, e.query_starts, src + 4 * e.rows_at, e.tok.address, e.requests,
                           e.tokens, e.clear_to)
                programs += e.requests + 1
            self._kernel(self._desc_address[self._i], programs)
            return
        assert expansion is None, "expanded on the device only where the ring expands"
        for start, stop, dst, at in spans:
            if dst.host is not None:
                put(dst.host, at, self._np[self._i][start:stop])
                continue
            with torch.inference_mode():
                dst.spans.get(at, at + stop - start).copy_(self._spans[self._i].get(start, stop), non_blocking=True)
