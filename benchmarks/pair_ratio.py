"""The ratio of two servers of one simultaneous served run, window by window.

``serve_throughput.py`` reports every server against plugin-free; two hotwire kinds are compared
more closely with each other, in the same windows, which cancels what they share (the plugin, its
host work, the seconds they ran in):

    python benchmarks/pair_ratio.py benchmarks/results/h200-2026-12-05-s20-serve-c256-host-only.json \\
        hotwire_host_only hotwire

prints, per concurrency, the median over windows of ``B tokens/s / A tokens/s`` and of the step-time
ratio, with the moving-block bootstrap 95 % interval ``serve_throughput.py`` uses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from serving import median, median_ci


def pair(samples: list[dict], a: str, b: str) -> dict[int, dict]:
    """Per concurrency: the windows both servers ran in (warm-up left out) and their ratios."""
    windows: dict[tuple[int, int], dict[str, dict]] = {}
    for s in samples:
        if s["round"] >= 0:
            windows.setdefault((s["concurrency"], s["round"]), {})[s["server"]] = s
    out: dict[int, dict] = {}
    for (c, _), w in sorted(windows.items()):
        if a in w and b in w:
            row = out.setdefault(c, {"tokens": [], "steps": []})
            row["tokens"].append(over(w[b]["tokens_per_s"], w[a]["tokens_per_s"]))
            row["steps"].append(over(w[b]["step_ms"], w[a]["step_ms"]))
    return out


def over(x: float, y: float) -> float:
    """``x / y``; NaN where ``y`` is 0 (a window in which a server generated nothing: only a
    ``--smoke`` run keeps one). ``serve_throughput``'s ratios to plugin-free use it too."""
    return x / y if y else float("nan")


def report(samples: list[dict], a: str, b: str, block: int) -> list[str]:
    """One line per concurrency: ``b / a`` tokens/s, its interval, and the step-time ratio."""
    lines = []
    for c, row in pair(samples, a, b).items():
        lo, hi = median_ci(row["tokens"], block)
        lines.append(f"C={c}: {b}/{a} tokens/s {median(row['tokens']):.4f} [{lo:.4f}-{hi:.4f}] over "
                     f"{len(row['tokens'])} windows; ms per step {median(row['steps']):.4f}")
    return lines


def main() -> None:
    from serve_throughput import BLOCK

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path, help="a serve_throughput.py --simultaneous JSON")
    ap.add_argument("a", help="the server in the denominator")
    ap.add_argument("b", help="the server in the numerator")
    args = ap.parse_args()
    print("\n".join(report(json.loads(args.result.read_text())["samples"], args.a, args.b, BLOCK)))


if __name__ == "__main__":
    main()
