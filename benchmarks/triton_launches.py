"""Benchmark only: where a Triton launch spends its host time, in an engine's own process.

Why: with hotwire's layers armed, vLLM's attention launch took about 15 µs longer in the profiled
forward steps while the same launch timed in a loop after the load did not (``docs/performance.md``,
"Session 25"). A Triton launch is Python (``JITFunction.run``: binding and specialising the
arguments, the kernel-cache lookup) around a launcher (``CudaLauncher.__call__``: for each pointer
argument a ``cuPointerGetAttribute`` check, then the driver's launch). Timing the two apart, kernel
by kernel, says which one grew; timing the pointer check on the tensors the forward hands the
attention kernel says whether it depends on where the memory lies.

* :func:`install` wraps both, once, before the load; :class:`Timers` switches them on and off,
  reports ``{kernel: {"calls", "run_us", "launcher_us"}}`` (µs per call; ``run_us`` is the whole
  ``JITFunction.run``, the launcher's time included) and keeps each kernel's last tensor arguments
  (:meth:`Timers.pointers`).
* :func:`pointer_check_us` times the driver's pointer check (through ctypes) for named tensors.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections import defaultdict
from typing import Any

CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3  # CUpointer_attribute in cuda.h


class Timers:
    def __init__(self) -> None:
        self.on = False
        self.kernel: str | None = None  # the kernel whose ``run`` is in progress
        self.calls: defaultdict[str, int] = defaultdict(int)
        self.run_ns: defaultdict[str, int] = defaultdict(int)
        self.launcher_ns: defaultdict[str, int] = defaultdict(int)
        self.last_args: dict[str, dict[str, Any]] = {}  # kernel: {argument name: tensor}, last call

    def report(self) -> dict[str, dict[str, float]]:
        return {k: {"calls": n, "run_us": round(self.run_ns[k] / n / 1e3, 2),
                    "launcher_us": round(self.launcher_ns[k] / n / 1e3, 2)}
                for k, n in sorted(self.calls.items(), key=lambda kv: -kv[1])}

    def pointers(self, kernels: int = 4) -> dict[str, Any]:
        """The tensor arguments of the ``kernels`` most launched kernels' last calls, by
        ``"kernel:argument"``."""
        top = sorted(self.calls, key=lambda k: -self.calls[k])[:kernels]
        return {f"{k}:{a}": t for k in top for a, t in self.last_args.get(k, {}).items()}


def kernel_name(jit: Any) -> str:
    """A ``JITFunction``'s kernel name (its function's, where it has none of its own)."""
    return getattr(jit, "__name__", None) or getattr(getattr(jit, "fn", None), "__name__", "?")


def install() -> Timers:
    """Wrap Triton's ``JITFunction.run`` and the active driver's launcher class (every kernel's
    launcher, made before or after). Raises where this Triton lays them out otherwise."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    timers = Timers()
    run = JITFunction.run

    @functools.wraps(run)
    def timed_run(self, *args, **kwargs):
        if not timers.on:
            return run(self, *args, **kwargs)
        name = kernel_name(self)
        outer, timers.kernel = timers.kernel, name
        names = getattr(self, "arg_names", None) or [str(i) for i in range(len(args))]
        timers.last_args[name] = {a: v for a, v in [*zip(names, args), *kwargs.items()] if hasattr(v, "data_ptr")}
        t = time.perf_counter_ns()
        try:
            return run(self, *args, **kwargs)
        finally:
            timers.run_ns[name] += time.perf_counter_ns() - t
            timers.calls[name] += 1
            timers.kernel = outer

    launcher_cls = driver.active.launcher_cls
    call = launcher_cls.__call__

    @functools.wraps(call)
    def timed_call(self, *args, **kwargs):
        if not timers.on or timers.kernel is None:
            return call(self, *args, **kwargs)
        t = time.perf_counter_ns()
        try:
            return call(self, *args, **kwargs)
        finally:
            timers.launcher_ns[timers.kernel] += time.perf_counter_ns() - t

    JITFunction.run = timed_run
    launcher_cls.__call__ = timed_call
    return timers


def pointer_check_us(tensors: dict[str, Any], repeat: int = 2000) -> dict[str, float]:
    """µs per ``cuPointerGetAttribute(DEVICE_POINTER)`` on each tensor's data pointer (the check
    Triton's launcher makes for every pointer argument), ctypes' own cost included (the same for
    every tensor)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    get = cuda.cuPointerGetAttribute
    get.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    get.restype = ctypes.c_int
    out = ctypes.c_uint64()
    ref = ctypes.byref(out)
    result = {}
    for name, t in tensors.items():
        ptr = t.data_ptr()
        if get(ref, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ptr) != 0:
            result[name] = float("nan")
            continue
        start = time.perf_counter_ns()
        for _ in range(repeat):
            get(ref, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ptr)
        result[name] = round((time.perf_counter_ns() - start) / repeat / 1e3, 3)
    return result
