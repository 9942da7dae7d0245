"""The ratio of two servers of one served run, round by round (simultaneous: a round is one window
of each, over the same seconds; sequential: the A B B A windows of each); or of several runs of the
same setup, pooled.

``serve_throughput.py`` reports every server against plugin-free; two hotwire kinds are compared
more closely with each other, in the same windows, which cancels what they share (the plugin, its
host work, the seconds they ran in):

    python benchmarks/pair_ratio.py benchmarks/results/h200-2026-12-05-s20-serve-c256-host-only.json \\
        hotwire_host_only hotwire

prints, per concurrency, the median over rounds of ``B tokens/s / A tokens/s`` and of the step-time
ratio, with the bootstrap 95 % interval ``serve_throughput.py`` uses (simultaneous: in blocks of
neighbouring windows; sequential: rounds drawn independently).

Why several runs: one run fits one device call (about 45 windows after the servers' start-up), and
its interval is about 3 % wide, where the served target needs one under 2 %. Runs of one setup
(the same servers side by side, model shape, engine arguments, load, vLLM and GPU, step phases
timed or not; :data:`SETUP`) pool their rounds:
``pair_ratio.py RUN1.json RUN2.json plugin_free hotwire``. Each run is resampled in its own blocks
(``serving.pooled_median_ci``); runs of different setups are refused, naming what differs. Two
sequential runs with the servers' pinned cores swapped (``--cores-order``) pool into a ratio that
follows the servers, not the cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean as mean

from serving import median, median_ci, pooled_median_ci

# what runs must share to pool their rounds (a result's keys)
SETUP = ("servers", "shape", "config", "engine", "design", "window_s", "prompt_len", "max_tokens_range",
         "steered_fraction", "spec_pool", "mps", "gpu_each", "env", "vllm", "gpu", "step_phases_timed")
# keys older results lack, and what they meant then (step phases were not timed before session 24;
# every server shared one GPU before session 37)
SETUP_DEFAULTS = {"step_phases_timed": False, "gpu_each": False}


def pair(samples: list[dict], a: str, b: str) -> dict[int, dict]:
    """Per concurrency: the rounds both servers ran in (warm-up left out) and their ratios, each of
    the server's mean over its windows of the round: one window a round simultaneous, two
    sequential (A B B A), as ``serve_throughput.py``'s own ratios."""
    rounds: dict[tuple[int, int], dict[str, list[dict]]] = {}
    for s in samples:
        if s["round"] >= 0:
            rounds.setdefault((s["concurrency"], s["round"]), {}).setdefault(s["server"], []).append(s)
    out: dict[int, dict] = {}
    for (c, _), w in sorted(rounds.items()):
        if a in w and b in w:
            row = out.setdefault(c, {"tokens": [], "steps": []})
            for key, name in (("tokens_per_s", "tokens"), ("step_ms", "steps")):
                row[name].append(over(mean([x[key] for x in w[b]]), mean([x[key] for x in w[a]])))
    return out


def block_for(result: dict) -> int:
    """The bootstrap's block: sequential rounds are drawn independently, as ``serve_throughput.py``
    draws them; simultaneous windows in blocks of ``BLOCK`` (neighbours may correlate)."""
    from serve_throughput import BLOCK

    return 1 if result.get("design") == "sequential" else BLOCK


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
                     f"{len(row['tokens'])} rounds; ms per step {median(row['steps']):.4f}")
    return lines


def pooled_report(results: list[dict], a: str, b: str, block: int) -> list[str]:
    """:func:`report` over several runs of one setup: per concurrency, the median of every run's
    rounds, the pooled interval, and each run's own median."""
    for key in SETUP:
        seen = {json.dumps(r.get(key, SETUP_DEFAULTS.get(key)), sort_keys=True) for r in results}
        if len(seen) > 1:
            raise SystemExit(f"the runs differ in {key!r} ({' vs '.join(sorted(seen))}): only runs of one setup pool")
    runs: dict[int, list[list[float]]] = {}
    for r in results:
        for c, row in pair(r["samples"], a, b).items():
            runs.setdefault(c, []).append(row["tokens"])
    lines = []
    for c, series in sorted(runs.items()):
        every = [v for run in series for v in run]
        lo, hi = pooled_median_ci(series, block)
        each = ", ".join(f"{median(run):.4f}" for run in series)
        lines.append(f"C={c}: {b}/{a} tokens/s {median(every):.4f} [{lo:.4f}-{hi:.4f}] over {len(every)} rounds "
                     f"of {len(series)} runs (each run: {each})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, nargs="+",
                    help="serve_throughput.py JSONs: one, or several runs of one setup to pool")
    ap.add_argument("a", help="the server in the denominator")
    ap.add_argument("b", help="the server in the numerator")
    args = ap.parse_args()
    results = [json.loads(p.read_text()) for p in args.results]
    if len(results) == 1:
        print("\n".join(report(results[0]["samples"], args.a, args.b, block_for(results[0]))))
    else:
        print("\n".join(pooled_report(results, args.a, args.b, block_for(results[0]))))


if __name__ == "__main__":
    main()
