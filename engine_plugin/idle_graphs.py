"""Graphs without the op, replayed on the steps in which no request is steered.

Why: inside a CUDA graph the op is one kernel per armed layer on every step, steered or not
(1.1–2.9 µs each on an H200: 1–4 % of a decode step with every layer armed). So every graph vLLM
captures is captured twice: as usual, and once more with the op launching nothing. A step whose
batch routes no token replays the second, so an idle engine runs the plugin-free kernels and
nothing else; a step with any steered token replays the first. Both are captured at start-up,
before serving: choosing one is host state, never a recapture (invariant 4). A step run without
a graph (a batch past the largest capture size) skips the op's launch the same way.

Contract:
  * :func:`want` — a steerer asks for the second capture (``HOTWIRE_IDLE_GRAPHS``, default on).
  * :func:`skipping` — the op launches nothing: this is an idle step, or the idle pass of a capture.
  * :func:`select` — the runner's per-step choice, made after the batch is routed, before the forward.
  * :func:`capture_twice` — wraps one capture pass of vLLM's; holders of graphs that pass captured
    get a second table, filled by the idle pass, and from then on look their graphs up in the
    table :func:`skipping` names (a class-level property: no per-step bookkeeping).

Graph holders are found by what they hold, not by vLLM version: an object whose
``concrete_cudagraph_entries`` (vLLM's ``CUDAGraphWrapper``: V1's FULL and PIECEWISE graphs,
V2's PIECEWISE) or ``graphs`` (the V2 runner's ``CudaGraphManager``: its FULL graphs) gained
entries in the first pass. A pass that captures anywhere else (micro-batched or breakable graphs)
is not doubled (:func:`doubling_unsafe`), and a second pass that fails or does not fill the same
keys undoes every split: the engine then runs with the op in every graph, as without this module.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vllm.hotwire")

TABLES = ("concrete_cudagraph_entries", "graphs")  # where known graph holders keep their graphs
CLEARS = ("clear_graphs", "release_graphs")  # and the methods with which they drop them
wanted = False  # a steerer in this process asked for graphs without the op (HOTWIRE_IDLE_GRAPHS)
_skip = False
_split_holders: "weakref.WeakSet[Any]" = weakref.WeakSet()
_off: str | None = None  # why graphs without the op are off in this process, once a pass failed


def skipping() -> bool:
    """True while the op must launch nothing (read by the op on every call)."""
    return _skip


def want(on: bool) -> None:
    """Capture graphs without the op from now on (``on``), or not."""
    global wanted
    wanted = on


def select(idle: bool) -> None:
    """Run the coming forward as an idle step (no token steered) or a steered one."""
    global _skip
    _skip = idle


@dataclass
class Stats:
    """What doubling the capture cost, summed over the passes (device memory as free memory lost)."""
    graphs: int = 0  # graphs captured without the op
    seconds: float = 0.0  # time their passes took
    bytes: int = 0  # device memory their passes took
    first_seconds: float = 0.0  # the same for vLLM's own passes, for comparison
    first_bytes: int = 0


STATS = Stats()


@functools.cache
def _two_tables(cls: type, attr: str) -> type:
    """``cls`` with ``attr`` resolved per step: the steered table or the idle one."""
    def get(self):
        return self.__dict__["_hotwire_tables"][_skip]

    def put(self, value):
        self.__dict__["_hotwire_tables"][_skip] = value

    ns: dict[str, Any] = {attr: property(get, put), "__module__": __name__, "_hotwire_attr": attr}
    for name in CLEARS:  # vLLM drops its graphs (memory profiling, elastic EP): both tables
        original = getattr(cls, name, None)
        if callable(original):
            def clearing(self, *args, _original=original, **kwargs):
                for table in self.__dict__["_hotwire_tables"]:
                    table.clear()
                return _original(self, *args, **kwargs)
            ns[name] = clearing
    return type(cls.__name__, (cls,), ns)


def _table(holder: Any) -> dict | None:
    for attr in TABLES:
        table = getattr(holder, attr, None)
        if isinstance(table, dict):
            return table
    return None


def _split(holder: Any) -> None:
    """Give ``holder`` its idle table (once)."""
    if "_hotwire_tables" in holder.__dict__:
        return
    attr = next(a for a in TABLES if isinstance(holder.__dict__.get(a), dict))
    holder.__dict__["_hotwire_tables"] = [holder.__dict__.pop(attr), {}]  # [steered, idle]: settable
    holder.__class__ = _two_tables(type(holder), attr)
    _split_holders.add(holder)


def _undo(why: str) -> None:
    """Every holder back to one table, the steered one, for good: a piecewise chain must never mix
    pieces captured in different passes."""
    global _off
    _off = why
    for holder in list(_split_holders):
        tables = holder.__dict__.pop("_hotwire_tables")
        cls = type(holder)
        holder.__class__ = cls.__mro__[1]
        holder.__dict__[cls._hotwire_attr] = tables[0]
    _split_holders.clear()
    STATS.graphs = 0
    log.error("hotwire: %s; every graph keeps the op (one launch per armed layer on idle steps too)", why)


def capture_twice(first_pass: Callable[[], Any], second_pass: Callable[[], Any],
                  holders: Callable[[], Iterable[Any]]) -> Any:
    """Run a capture pass as vLLM would (``first_pass``), then again without the op (``second_pass``)
    into the idle tables of the ``holders`` whose tables the first pass filled. Returns the first
    pass's result."""
    global _skip
    _skip = False
    if _off is not None:
        return first_pass()
    candidates = [h for h in holders() if _table(h) is not None]
    before = [set(_table(h)) for h in candidates]
    t0, free0 = time.perf_counter(), _free_bytes()
    result = first_pass()
    t1, free1 = time.perf_counter(), _free_bytes()
    grown = [(h, set(_table(h)) - keys) for h, keys in zip(candidates, before)]
    grown = [(h, keys) for h, keys in grown if keys]
    if not grown:
        return result
    for h, _ in grown:
        _split(h)
    _skip = True
    try:
        second_pass()
    except Exception as e:  # hotwire must never keep an engine from serving
        log.exception("hotwire: capturing graphs without the op failed")
        _undo(f"capturing graphs without the op failed ({type(e).__name__})")
        return result
    finally:
        _skip = False
    missing = sorted({type(h).__name__ for h, keys in grown if not keys <= set(h.__dict__["_hotwire_tables"][1])})
    if missing:
        _undo(f"the idle capture pass did not fill {missing} as the first pass did")
        return result
    STATS.graphs += sum(len(keys) for _, keys in grown)
    STATS.seconds += time.perf_counter() - t1
    STATS.bytes += free1 - _free_bytes()
    STATS.first_seconds += t1 - t0
    STATS.first_bytes += free0 - free1
    return result


def _free_bytes() -> int:
    import torch

    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def doubling_unsafe(runner: Any) -> str | None:
    """Why this runner's capture passes must not be doubled, or None when they may."""
    name = type(getattr(runner, "model", None)).__name__
    if name in ("UBatchWrapper", "BreakableCUDAGraphWrapper"):
        return f"its graphs are held by vLLM's {name}"
    if getattr(getattr(runner, "cudagraph_manager", None), "use_breakable_cg", False):
        return "its piecewise graphs are breakable graphs"
    return None
