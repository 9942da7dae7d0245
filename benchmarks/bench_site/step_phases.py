"""Benchmark only: where an engine core's step time goes, phase by phase, in any server of a run.

Why: at 256 in flight hotwire's steps are about 2 ms longer than plugin-free ones, while hotwire's
own counters see about 0.23 ms of it and a sampling profile spreads the rest thinly over vLLM's
frames. Timers around the engine core's phases, the same in every server, say in which phase a
longer step spends its time: scheduling, the runner's host work (by the step's CUDA-graph mode),
the sampler's launch, waiting for the GPU's output, the scheduler's update, the input queue, and
Python's garbage collector.

Phases (each: wall and this thread's CPU ns, and calls; a phase inside another counts in both):

=========================  ==========================================================================
``schedule``               the scheduler's ``schedule`` (hotwire's sync of a step inside it)
``execute_model``          the executor's call: for one GPU, in process, the runner's whole host work
``execute_model:<MODE>``   the same, by the step's CUDA-graph mode (``FULL``, ``PIECEWISE``, ``NONE``)
``prepare_inputs``         inside it, V2 runner (hotwire's routing inside it)
``prepare_attn``           inside it, V2 runner
``forward:<MODE>``         inside it, V2 runner: the model's forward (a FULL graph's replay; PIECEWISE
                           and NONE: the body of vLLM's forward context), by mode
``gpu:<MODE>``             the same forward on the GPU: from an event recorded before it to one after
                           (read once both have run, never waited on; ``wall`` only)
``sample_tokens``          the executor's sampler call
``wait_output``            waiting on a step's output (its future's ``result``): the GPU not done yet
``update_from_output``     the scheduler's update with a step's output
``input_queue``            the engine core's loop taking requests in (``_process_input_queue``)
``engine_step``            the loop's step (``_process_engine_step``): a step and its outputs handed on
``gc0``, ``gc1``, ``gc2``  Python's collections, by generation, wherever they ran
``hotwire:core``           where hotwire is loaded: its engine core's decision (inside ``schedule``)
``hotwire:schedule``       its rank's take of that decision (inside ``execute_model``)
``hotwire:batch``          its routing of the settled batch (inside ``prepare_inputs``)
``hotwire:admit``          the core's admission of one arriving request (inside ``hotwire:core``;
                           its calls a step: the arrivals)
``hotwire:route``          the routing's token map and uploads (inside ``hotwire:batch``)
``hotwire:op_launch``      its op's kernel launched from Python (steps without a full graph), on the
                           layers the step steers (the calls on the rest, one per armed layer, are
                           left untimed: timing each would add its clock reads to every such step)
=========================  ==========================================================================

The forwards (``forward:<MODE>``), the runner's whole call and the loop's step also count the step
thread's minor page faults (``faults``, per step): CPython (3.11+) keeps Python frames in 16 KiB
chunks, and a call that crosses a chunk's end maps a fresh chunk and unmaps it on return, every time
(session 28), which shows as faults where the same forward of another server has none. Only vLLM's
phases count them, the same in every server (each count is one more system call).

hotwire's own counters time its hooks in wall time only; here a hook's wall time beside its CPU
time says how much of it the step thread spent waiting (for the GIL, most likely) rather than working.
The rank's phases and the op's launches are timed where the runner shares the engine core's
process (one GPU).

``steps`` counts ``update_from_output`` calls (one per engine step that ran the model) and
``tokens`` the tokens those steps scheduled (``tokens:<MODE>`` by mode).

The engine core writes its totals since it started to ``$BENCH_PHASES_DIR/engine-core-<pid>.json``
at most once a second, from its step thread after a step. :func:`per_step` turns two readings
into time per step: both come from one file, so they need no clock shared with the reader.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.abc
import importlib.util
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

DUMP_S = 1.0
CORE = "vllm.v1.engine.core"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"

_wall: defaultdict[str, int] = defaultdict(int)
_cpu: defaultdict[str, int] = defaultdict(int)
_calls: defaultdict[str, int] = defaultdict(int)
_faults: defaultdict[str, int] = defaultdict(int)
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux
_mode: str | None = None  # the CUDA-graph mode of the step the runner is executing
_gc_start: list[int] = [0, 0]
_events: list[tuple[str, Any, Any]] = []  # (mode, start, end) CUDA events not yet read
_last_dump = 0.0


def _add(name: str, wall: int, cpu: int) -> None:
    _wall[name] += wall
    _cpu[name] += cpu
    _calls[name] += 1


def _minor_faults() -> int:
    """This thread's minor page faults so far (0 where the OS does not count them per thread)."""
    return 0 if _RUSAGE_THREAD is None else resource.getrusage(_RUSAGE_THREAD).ru_minflt


@contextlib.contextmanager
def _clock(*names: str, faults: bool = False):
    """Time the body (wall and this thread's CPU) under each of ``names``, and under any name the
    body appends to the list it is given (one known only once the body has run); with ``faults``,
    count this thread's minor page faults in it too."""
    names = list(names)
    f = _minor_faults() if faults else 0
    w, c = time.perf_counter_ns(), time.thread_time_ns()
    try:
        yield names
    finally:
        wall, cpu = time.perf_counter_ns() - w, time.thread_time_ns() - c
        for name in names:
            _add(name, wall, cpu)
        if faults:
            f = _minor_faults() - f
            for name in names:
                _faults[name] += f


def _timed(name: str, fn, faults: bool = False):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        with _clock(name, faults=faults):
            return fn(*args, **kwargs)
    return timed


def _waited(out: Any) -> Any:
    """A step's output future, its ``result`` timed as ``wait_output``."""
    if callable(getattr(out, "result", None)):
        out.result = _timed("wait_output", out.result)
    return out


def _execute(fn):
    @functools.wraps(fn)
    def execute(scheduler_output, *args, **kwargs):
        global _mode
        _mode = None
        with _clock("execute_model", faults=True) as names:
            try:
                return _waited(fn(scheduler_output, *args, **kwargs))
            finally:
                if _mode is not None:  # the runner dispatched a mode (:func:`_dispatch`)
                    names.append(f"execute_model:{_mode}")
                    _calls[f"tokens:{_mode}"] += getattr(scheduler_output, "total_num_scheduled_tokens", 0)
    return execute


def _update(fn):
    @functools.wraps(fn)
    def update(scheduler_output, *args, **kwargs):
        _calls["steps"] += 1
        _calls["tokens"] += getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        return fn(scheduler_output, *args, **kwargs)
    return _timed("update_from_output", update)


def _dispatch(fn):
    """The V2 runner's choice of CUDA-graph mode for a step, noted for :func:`_execute`."""
    @functools.wraps(fn)
    def dispatch(*args, **kwargs):
        global _mode
        out = fn(*args, **kwargs)
        mode = getattr(out[0] if isinstance(out, tuple) else out, "cg_mode", None)
        _mode = getattr(mode, "name", None)
        return out
    return dispatch


@contextlib.contextmanager
def _forward(mode: str | None):
    """Time a forward as ``forward:<mode>`` on the host and, on CUDA, ``gpu:<mode>`` by events."""
    import torch

    start = end = None
    if torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    try:
        with _clock(f"forward:{mode}", faults=True):
            yield
    finally:
        if end is not None:
            end.record()
            _events.append((mode, start, end))


def read_events() -> None:
    """Add the GPU time of every forward whose end event has run (in order: stop at the first not)."""
    done = 0
    for mode, start, end in _events:
        if not end.query():
            break
        _add(f"gpu:{mode}", int(start.elapsed_time(end) * 1e6), 0)
        done += 1
    del _events[:done]


def _forward_context(fn):
    """vLLM's forward context, its body (the model's forward) timed (:func:`_forward`)."""
    @contextlib.contextmanager
    def timed(*args, **kwargs):
        with fn(*args, **kwargs) as ctx, _forward(_mode):
            yield ctx
    return timed


def _full_graph(fn):
    @functools.wraps(fn)
    def replay(*args, **kwargs):
        with _forward("FULL"):
            return fn(*args, **kwargs)
    return replay


def _collected(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_start[:] = [time.perf_counter_ns(), time.thread_time_ns()]
    else:
        _add(f"gc{info.get('generation', '?')}", time.perf_counter_ns() - _gc_start[0],
             time.thread_time_ns() - _gc_start[1])


def snapshot() -> dict:
    """This process's totals so far: a reading :func:`per_step` takes."""
    return {"pid": os.getpid(), "t": time.monotonic(), "calls": dict(_calls), "wall_ns": dict(_wall),
            "cpu_ns": dict(_cpu), "faults": dict(_faults)}


def dump(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot()))
    os.replace(tmp, path)


def _instrument(core: Any) -> None:
    """Wrap the phases on this engine core's own objects (the scheduler and executor exist now)."""
    scheduler, executor = core.scheduler, core.model_executor
    scheduler.schedule = _timed("schedule", scheduler.schedule)
    scheduler.update_from_output = _update(scheduler.update_from_output)
    executor.execute_model = _execute(executor.execute_model)
    sample = _timed("sample_tokens", executor.sample_tokens)
    executor.sample_tokens = lambda *args, **kwargs: _waited(sample(*args, **kwargs))
    runner = getattr(getattr(getattr(executor, "driver_worker", None), "worker", None), "model_runner", None)
    module = sys.modules.get(V2_RUNNER)
    if runner is not None and module is not None and isinstance(runner, getattr(module, "GPUModelRunner", ())):
        for name in ("prepare_inputs", "prepare_attn"):
            setattr(runner, name, _timed(name, getattr(runner, name)))
        if hasattr(module, "dispatch_cg_and_sync_dp"):
            module.dispatch_cg_and_sync_dp = _dispatch(module.dispatch_cg_and_sync_dp)
        if hasattr(module, "set_forward_context"):
            module.set_forward_context = _forward_context(module.set_forward_context)
        graphs = getattr(runner, "cudagraph_manager", None)
        if callable(getattr(graphs, "run_fullgraph", None)):
            graphs.run_fullgraph = _full_graph(graphs.run_fullgraph)
    gc.callbacks.append(_collected)
    _instrument_hotwire()
    if os.environ.get("BENCH_SYNC_DEBUG"):  # a warning in the server's log wherever torch synchronizes
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")


HOTWIRE = [  # (phase, module, owner in it or None for the module itself, function); the V2
    # runner's batch goes through on_states and route_states, the others' through on_batch and route
    ("hotwire:core", "hotwire.engine_plugin.core_sync", "CoreSync", "on_schedule"),
    ("hotwire:schedule", "hotwire.engine_plugin.engine", "Steerer", "on_schedule"),
    ("hotwire:batch", "hotwire.engine_plugin.engine", "Steerer", "on_batch"),
    ("hotwire:batch", "hotwire.engine_plugin.engine", "Steerer", "on_states"),
    ("hotwire:admit", "hotwire.engine_plugin.admission", "Admission", "admit"),
    ("hotwire:route", "hotwire.engine_plugin.routing", "Router", "route"),
    ("hotwire:route", "hotwire.engine_plugin.routing", "Router", "route_states"),
    ("hotwire:op_launch", "hotwire.engine_plugin.steer_triton", None, "launch"),
]


def _instrument_hotwire() -> None:
    """hotwire's hooks and its op's calls, timed where this process has imported them (an engine
    core with the plugin loaded has, once its engine is built: the op ran while vLLM captured)."""
    for name, module_name, owner, fn in HOTWIRE:
        module = sys.modules.get(module_name)
        target = module if owner is None or module is None else getattr(module, owner, None)
        if target is not None and callable(getattr(target, fn, None)):
            setattr(target, fn, _timed(name, getattr(target, fn)))


def _patch_core(module: Any) -> None:
    folder = Path(os.environ["BENCH_PHASES_DIR"])
    init = module.EngineCore.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _instrument(self)

    module.EngineCore.__init__ = __init__
    proc = getattr(module, "EngineCoreProc", None)
    if proc is None:
        return
    proc._process_input_queue = _timed("input_queue", proc._process_input_queue)
    step = _timed("engine_step", proc._process_engine_step, faults=True)

    def engine_step(self):
        global _last_dump
        out = step(self)
        if _events:
            read_events()
        now = time.monotonic()
        if now - _last_dump >= DUMP_S:
            _last_dump = now
            folder.mkdir(parents=True, exist_ok=True)
            dump(folder / f"engine-core-{os.getpid()}.json")  # the engine core's pid (it may be forked)
        return out

    proc._process_engine_step = engine_step


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _patch_core(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the engine core's module as it is imported (before any plugin's hooks: this runs
    as Python starts)."""

    def find_spec(self, name, path, target=None):
        if name != CORE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    if CORE in sys.modules:
        _patch_core(sys.modules[CORE])
    else:
        sys.meta_path.insert(0, _Finder())


BENCH_SITE = Path(__file__).parent


def enable(work: Path, sync_debug: bool = False) -> Path:
    """Make every server started from now on time its engine core's phases (its processes import
    this folder's ``sitecustomize``); returns the folder the engine cores write to."""
    folder = work / "step-phases"
    os.environ["BENCH_PHASES_DIR"] = str(folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_SITE), os.environ.get("PYTHONPATH")]))
    if sync_debug:
        os.environ["BENCH_SYNC_DEBUG"] = "1"
    return folder


def read(folder: Path, pid: int) -> dict | None:
    """Engine core ``pid``'s latest totals, or None before its first dump."""
    try:
        return json.loads((folder / f"engine-core-{pid}.json").read_text())
    except (OSError, ValueError):
        return None


def per_step(a: dict, b: dict) -> dict:
    """Between two readings of one engine core: its steps, tokens per step, and each phase's wall
    and CPU µs per step and calls per step (``share``: of the wall time between the readings), and
    for the phases that count them the step thread's minor page faults per step (``faults``)."""
    steps = b["calls"].get("steps", 0) - a["calls"].get("steps", 0)
    seconds = b["t"] - a["t"]
    n = max(steps, 1)

    def d(kind: str, name: str) -> float:
        return b.get(kind, {}).get(name, 0) - a.get(kind, {}).get(name, 0)

    phases = {name: {"wall_us": round(d("wall_ns", name) / n / 1e3, 1), "cpu_us": round(d("cpu_ns", name) / n / 1e3, 1),
                     "calls": round(d("calls", name) / n, 3), "share": round(d("wall_ns", name) / 1e9 / max(seconds, 1e-9), 4),
                     **({"faults": round(d("faults", name) / n, 2)} if name in b.get("faults", {}) else {})}
              for name in sorted(b["wall_ns"])}
    counts = {name: round(d("calls", name) / n, 1) for name in sorted(b["calls"]) if name.startswith("tokens")}
    return {"steps": steps, "seconds": round(seconds, 2), "step_ms": round(1e3 * seconds / n, 3),
            "per_step": counts, "phases": phases}


def report(first: dict[str, dict | None], last: dict[str, dict | None]) -> dict[str, dict]:
    """Each server's phases per step between two readings (``{server: reading}``; a server with
    no reading at either is left out), printed as wall µs per step (CPU µs in brackets) side by side."""
    out = {name: per_step(first[name], last[name]) for name in first
           if first[name] is not None and last.get(name) is not None}
    names = list(out)
    if not names:
        return out
    print("step phases, wall µs per step (CPU µs in brackets): " + " | ".join(
        f"{n} {out[n]['step_ms']:.2f} ms, {out[n]['steps']} steps" for n in names), flush=True)
    for phase in sorted({p for n in names for p in out[n]["phases"]}):
        cells = [out[n]["phases"].get(phase) for n in names]
        print(f"  {phase:26s} " + "  ".join(f"{c['wall_us']:9.1f} [{c['cpu_us']:8.1f}]" if c else f"{'-':>20s}"
                                            for c in cells), flush=True)
    counted = sorted({p for n in names for p, c in out[n]["phases"].items() if "faults" in c})
    if counted:
        print("the step thread's minor page faults per step: " + " | ".join(names), flush=True)
        for phase in counted:
            cells = [out[n]["phases"].get(phase, {}).get("faults") for n in names]
            print(f"  {phase:26s} " + "  ".join(f"{c:9.2f}" if c is not None else f"{'-':>9s}" for c in cells),
                  flush=True)
    return out
