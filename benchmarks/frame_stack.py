"""Benchmark only: what a Python call costs at each depth of the frame stack.

Why: CPython (3.11+) keeps Python frames in 16 KiB chunks. A call whose frame does not fit in
the current chunk allocates the next one, and its return frees it again, so a call made right at
a chunk's end pays an allocation and a free every time. Inside vLLM's forward that made every
Triton launch slower once hotwire's op gave the compiled forward 28 more inputs, one more stack
slot each (``docs/performance.md``, "Session 28"). This shows the effect in a plain interpreter:
the same three nested calls, timed under ever deeper stacks of padding frames; a few depths are
many times slower than the rest.

    python3 benchmarks/frame_stack.py [--depths 1500] [--locals 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _c(x: int) -> int:
    return x


def _b(x: int) -> int:
    return _c(x) + 1


def _a(x: int) -> int:
    return _b(x) * 2


def three_calls_ns(repeat: int = 20, inner: int = 200) -> float:
    """Median ns of ``_a(1)`` (three nested calls) over ``repeat`` timings of ``inner`` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        for _ in range(inner):
            _a(1)
        times.append((time.perf_counter_ns() - t) / inner)
    return statistics.median(times)


def padded(locals_per_frame: int, bottom=three_calls_ns):
    """``pad(n)``: ``bottom()`` (by default :func:`three_calls_ns`) called under ``n`` frames of
    ``locals_per_frame`` locals, its result returned."""
    body = "".join(f"    v{i} = 0\n" for i in range(locals_per_frame))
    source = f"def pad(n):\n{body}    return pad(n - 1) if n else bottom()\n"
    space = {"bottom": bottom}
    exec(source, space)
    return space["pad"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, default=1500, help="padding frames, from 0 to this")
    p.add_argument("--locals", type=int, default=5, help="locals in each padding frame")
    args = p.parse_args()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 2 * args.depths + 100))
    pad = padded(args.locals)
    ns = [pad(n) for n in range(args.depths)]
    median = statistics.median(ns)
    slow = {n: round(t, 1) for n, t in enumerate(ns) if t > 2 * median}
    print(json.dumps({"python": sys.version.split()[0], "median_ns": round(median, 1),
                      "slow_depths_ns": slow}, indent=1))


if __name__ == "__main__":
    main()
