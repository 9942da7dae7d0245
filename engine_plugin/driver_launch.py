"""A kernel Triton compiled, launched again by the CUDA driver itself: ``cuLaunchKernel`` through
``ctypes.PyDLL``, which keeps the GIL.

Why. Triton's own launch (``kernel[grid](...)``) binds and specialises the arguments in Python,
looks the compiled kernel up, asks torch for the device and the stream, and lets the GIL go around
the driver's call: 15.5 µs of the step thread's time per launch on an H100 host against 9.2 µs
this way (``benchmarks/host_overhead.py``: ``upload_launch_by_triton``, ``upload_launch``), and
in a served engine vLLM's output thread may take the GIL in between, so the step thread then
waits for it back. A kernel whose arguments are a few words the caller already holds (the upload
kernel's one address, :mod:`.upload_triton`; the steering kernel's addresses and one stride,
:mod:`.steer_triton`, launched on every steered layer of a step run without a CUDA graph) needs
none of that once it is compiled.

Contract: :func:`launcher` takes what Triton's launch returned (its compiled kernel) and the size
of each of its leading parameters (``WORD``: an int64 value or a device address; ``HALF``: an
int32 value), and gives ``launch(grid, *words)``, which enqueues the kernel on the current stream
of the device it was compiled for with ``grid`` programs and ``words`` (non-negative integers) as
those parameters and says whether the driver took it (a refusal is logged; the caller falls back
to Triton's launch for good); or None where it cannot say so exactly, and the caller keeps
Triton's launch: the kernel needs scratch memory, a cluster, a cooperative or programmatic
launch, its parameters are not the sizes given (Triton specialised one away, or widened it), the
host is not little-endian, or the driver lacks ``cuFuncGetParamInfo`` (CUDA 12.4). The
parameters past ``words`` are the scratch pointers Triton adds to every kernel, passed null as
Triton passes them when the kernel needs no scratch. The caller owns the rest of what Triton's
launch would check: a compiled kernel is one specialisation of its arguments (dtypes, constexprs,
which integers and addresses are multiples of 16), so it is launched again only with arguments of
that same specialisation (:func:`.steer_triton.launch`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("vllm.hotwire")

WORD = 8  # bytes of an int64 value or a device address
HALF = 4  # bytes of an int32 value


@functools.cache
def libcuda() -> ctypes.PyDLL:
    """The CUDA driver, its functions called with the GIL held (one handle for every hotwire call
    into it); OSError where it cannot be loaded."""
    return ctypes.PyDLL("libcuda.so.1")


@functools.cache
def _driver() -> ctypes.PyDLL | None:
    """The CUDA driver with the functions a launch uses set up; None where it cannot be loaded or
    lacks one of them."""
    try:
        cuda = libcuda()
        launch, info = cuda.cuLaunchKernel, cuda.cuFuncGetParamInfo
    except (OSError, AttributeError) as e:
        log.info("hotwire: Triton launches the upload kernel (the CUDA driver: %s)", e)
        return None
    u32, ptr = ctypes.c_uint, ctypes.c_void_p
    launch.argtypes = (ptr, u32, u32, u32, u32, u32, u32, u32, ptr, ptr, ptr)
    info.argtypes = (ptr, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
    return cuda


def _params(function: int, cuda: ctypes.PyDLL) -> list[int]:
    """The size in bytes of each of the kernel's parameters, as the driver reads them."""
    sizes, offset, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    while cuda.cuFuncGetParamInfo(function, len(sizes), ctypes.byref(offset), ctypes.byref(size)) == 0:
        sizes.append(size.value)
    return sizes


def _unsupported(meta: Any) -> str | None:
    """Why the compiled kernel's metadata asks for more than a plain launch, or None."""
    for name, plain in (("num_ctas", 1), ("global_scratch_size", 0), ("profile_scratch_size", 0),
                        ("launch_cooperative_grid", False), ("launch_pdl", False)):
        if getattr(meta, name, plain) != plain:
            return f"{name}={getattr(meta, name)}"
    if tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in ((1, 1, 1), (1,), ()):
        return f"cluster_dims={meta.cluster_dims}"
    return None


class DriverLaunch:
    """``launch(grid, *words)``: ``grid`` programs of the compiled kernel, ``words`` its first
    parameters, on the current stream; one ``cuLaunchKernel``, no Python beyond this call. True
    when the kernel is enqueued; False, said in the log, where the driver refused it: the caller
    then launches it by Triton, and does so from then on (a refusal is not retried)."""

    def __init__(self, cuda: ctypes.PyDLL, function: int, threads: int, shared: int, params: int, device: int,
                 name: str):
        self._launch, self._function, self._threads, self._shared = cuda.cuLaunchKernel, function, threads, shared
        self._device, self._stream = device, torch._C._cuda_getCurrentRawStream
        # each parameter's value in an 8-byte slot; the driver reads a HALF parameter's first four
        # bytes, its low half on a little-endian host. The scratch pointers stay 0.
        self._words = (ctypes.c_uint64 * params)()
        self._pointers = (ctypes.c_void_p * params)(*(ctypes.addressof(self._words) + WORD * i for i in range(params)))
        self._at = ctypes.addressof(self._pointers)
        self._error_name, self._name = cuda.cuGetErrorName, name

    def __call__(self, grid: int, *words: int) -> bool:
        self._words[:len(words)] = words
        rc = self._launch(self._function, grid, 1, 1, self._threads, 1, 1, self._shared,
                          self._stream(self._device), self._at, None)
        if rc != 0:
            error = ctypes.c_char_p()
            self._error_name(rc, ctypes.byref(error))
            log.error("hotwire: the CUDA driver refused to launch %s (%s); Triton launches it from now on",
                      self._name, error.value.decode() if error.value else rc)
        return rc == 0


def launcher(compiled: Any, words: tuple[int, ...], device: int) -> Callable[..., bool] | None:
    """How to launch ``compiled`` (what Triton's launch on CUDA device ``device`` returned) again
    with leading parameters of ``words`` bytes each (``WORD`` or ``HALF``): a
    :class:`DriverLaunch`, or None (Triton's launch stays; said in the log at info: it is slower,
    not wrong)."""
    cuda = _driver()
    function, meta = getattr(compiled, "function", None), getattr(compiled, "metadata", None)
    name = getattr(compiled, "name", "a kernel")
    if cuda is None or not function or meta is None:  # no driver, or Triton's interpreter
        return None
    why = _unsupported(meta)
    sizes = _params(function, cuda) if why is None else []
    if why is None and (tuple(sizes[:len(words)]) != tuple(words) or any(s != WORD for s in sizes[len(words):])):
        why = f"parameters of {sizes} bytes, not {list(words)} and scratch pointers"
    if why is None and sys.byteorder != "little" and HALF in words:
        why = "a big-endian host"
    if why is not None:
        log.info("hotwire: Triton launches %s (%s)", name, why)
        return None
    threads = int(meta.num_warps) * int(getattr(meta, "warp_size", 32))
    return DriverLaunch(cuda, function, threads, int(meta.shared), len(sizes), device, name)
