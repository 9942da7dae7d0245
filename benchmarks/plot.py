"""Step time vs batch size, plugin-free / idle / steered / two armed layers / eager, from kernel_time.py results.

One panel per model shape (one results file each); kernel time per decode step on a log scale,
so the eager line (what hook-based steering pays) fits beside the three that should coincide.
Needs matplotlib (not a project dependency).

    python benchmarks/plot.py benchmarks/results/h200-*-kernel-time-*.json --out docs/step-time.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STYLE = {"plugin_free": ("plugin-free", "k", "o"), "idle": ("hotwire idle", "tab:blue", "s"),
         "steered": ("hotwire all steered", "tab:green", "^"),
         "idle_2": ("hotwire idle, 2 layers armed", "tab:purple", "d"), "eager": ("eager, steered", "tab:red", "x")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    runs = [json.loads(p.read_text()) for p in args.results]
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        batches = [r["batch"] for r in run["rows"]]
        ms = []
        for cond, (label, color, marker) in STYLE.items():
            ys = [r[f"{cond}_kernel_us"] / 1e3 for r in run["rows"] if f"{cond}_kernel_us" in r]
            if len(ys) == len(batches):
                ax.plot(batches, ys, marker=marker, color=color, label=label)
                ms += ys
        cfg = run["config"]
        ax.set(xscale="log", yscale="log" if max(ms) > 10 * min(ms) else "linear",
               xlabel="batch (requests decoding)", ylabel="GPU kernel time per step (ms)",
               title=f"{run['shape']} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']})")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
    info = runs[0]["info"]
    fig.suptitle(f"hotwire decode step: {info['device']}, vLLM {info['vllm']}\n"
                 f"CUDA graphs {info['cudagraph_mode']}, {runs[0]['date'][:10]}", fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
