"""Benchmark only: what the interpreter runs the forward with.

Why: with hotwire's layers armed, plain host code (a Triton launch's Python, small torch calls)
runs slower inside the forward than the same code timed in a loop after the load
(``docs/performance.md``, "Session 25"). Things that tax every frame or every call only while
they are active would do that: a trace or profile function, a ``sys.monitoring`` tool, Dynamo's
frame callback, a torch function or dispatch mode, another thread taking the GIL; or more
distinct compiled code to run (vLLM's compilation counters). Garbage collections are timed by
``bench_site/step_phases.py``: level with and without the plugin.

* :func:`snapshot` — that state, as JSON;
* :func:`in_forward` — the same state seen from inside the forward, at a Triton launch there, with
  small probes timed on the spot.
"""

from __future__ import annotations

import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def snapshot() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {
        "trace": repr(sys.gettrace()), "profile": repr(sys.getprofile()),
        "switch_interval_s": sys.getswitchinterval(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "thread_frames": _thread_frames(),
        "grad_enabled": torch.is_grad_enabled(), "inference_mode": torch.is_inference_mode_enabled(),
        "torch_function_modes": torch._C._len_torch_function_stack(),
        "torch_dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "gc_counts": list(gc.get_count()), "gc_thresholds": list(gc.get_threshold()),
        "gc_tracked": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count(),
    }
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+: tools that tax events while registered
    if monitoring is not None:
        state["monitoring_tools"] = {i: tool for i in range(6) if (tool := monitoring.get_tool(i))}
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback

        state["dynamo_frame_callback"] = repr(get_eval_frame_callback())
    except ImportError:
        pass
    counter = sys.modules.get("vllm.compilation.counter")
    if counter is not None:  # how many pieces inductor compiled: identical pieces share their code
        state["vllm_compilation"] = {k: v for k, v in vars(counter.compilation_counter).items() if v}
    return state


def _stack() -> dict[str, Any]:
    """This thread's Python frames, outermost first, with a size for each: its locals, cells,
    free variables and value stack, in slots (pointers). CPython (3.11+) keeps these frames in
    16 KiB chunks: a call that does not fit in the current chunk allocates the next one, and
    frees it on return, so calls made right at a chunk's end pay that every time. Two engines
    whose frames differ move that end; the sizes say where they differ."""
    frames, slots = [], 0
    f = sys._getframe(1)
    while f is not None:
        c = f.f_code
        size = c.co_nlocals + len(c.co_cellvars) + len(c.co_freevars) + c.co_stacksize
        frames.append(f"{c.co_name} {c.co_filename.rsplit('/', 2)[-1]}:{c.co_firstlineno} {size}")
        slots += size
        f = f.f_back
    frames.reverse()
    return {"slots": slots, "frames": frames}


def _thread_frames() -> dict[str, str]:
    """Where each other thread is: ``file:line function`` of its innermost frame."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {names.get(ident, str(ident)): f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}"
            for ident, f in sys._current_frames().items() if ident != threading.get_ident()}


def in_forward(kernel: str | None = None, probes: dict[str, Callable[[], Any]] | None = None,
               repeat: int = 50, inner: int = 100) -> tuple[dict[str, Any], Any]:
    """``(seen, undo)``: ``seen`` fills with :func:`snapshot` at the next Triton launch (of
    ``kernel`` only, when named: vLLM's attention kernel is launched inside the model's forward,
    where the first launch of a step is not), and with ``us_per_call``: each of ``probes`` timed
    right there (median over ``repeat`` timings of ``inner`` calls, µs a call), to set beside the
    same probes timed after the load. ``undo()`` removes the probe."""
    from triton.runtime.jit import JITFunction
    from triton_launches import kernel_name

    seen: dict[str, Any] = {}
    run = JITFunction.run

    def probed(self, *args, **kwargs):
        name = None if seen else kernel_name(self)
        if name is not None and (kernel is None or name == kernel):
            seen.update(snapshot(), kernel=name, stack=_stack())
            seen["us_per_call"] = {k: per_call_us(fn, repeat, inner) for k, fn in (probes or {}).items()}
        return run(self, *args, **kwargs)

    JITFunction.run = probed
    return seen, lambda: setattr(JITFunction, "run", run)


def per_call_us(fn: Callable[[], Any], repeat: int, inner: int = 100) -> float:
    """Median over ``repeat`` timings of ``inner`` calls of ``fn``, in µs per call."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter_ns() - t) / inner / 1e3)
    return round(statistics.median(times), 3)
