"""Progress of the tools that take minutes (``hotwire verify``, ``hotwire demo``): each phase is
printed on stderr as it starts, with the seconds since the tool began, so stdout keeps only the
report::

    hotwire verify [  41.3 s] hotwire engine: start (load the model)

An engine that runs in a child process (:mod:`.jobs`) announces its phases on its stderr as
``hotwire-progress: <phase>`` lines (:func:`mark`); the parent reads them as they come and prints
them through its :class:`Progress`.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

MARK = "hotwire-progress: "


class Progress:
    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the tool began."""
        return time.perf_counter() - self.start

    def phase(self, text: str) -> None:
        print(f"{self.tool} [{self.elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)


def mark(text: str) -> None:
    """A child engine process's phase, for its parent to print (see :data:`MARK`)."""
    print(MARK + text, file=sys.stderr, flush=True)


def engine_mode(gpu: bool, eager: bool) -> str:
    """What starting an engine involves, for the start phase's text."""
    if eager:
        return "load the model"
    return "load the model, torch.compile, capture CUDA graphs" if gpu else "load the model, torch.compile"


def watch_engine(report: Callable[[str], None]) -> None:
    """Report the first torch.compile and the first CUDA-graph capture in this process.

    Best effort: an engine core in another process (vLLM's multiprocessing on) is not seen, and a
    torch without dynamo's compile callbacks reports no compile phase.
    """
    import torch

    seen: set[str] = set()

    def once(what: str) -> None:
        if what not in seen:
            seen.add(what)
            report(what)

    try:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(lambda *_: once("compile (torch.compile)"))
    except (ImportError, AttributeError):
        pass
    if torch.cuda.is_available():
        orig = torch.cuda.CUDAGraph.capture_begin

        def capture_begin(self, *a, **k):
            once("capture CUDA graphs")
            return orig(self, *a, **k)

        torch.cuda.CUDAGraph.capture_begin = capture_begin
