"""The sweep as a PNG: effect, KL and perplexity against scale, one line per layer, the
recommended point marked and the KL budget drawn. Needs matplotlib, which hotwire does not
depend on: without it :func:`plot` raises :class:`PlotUnavailable` saying how to get it, and the
sweep writes its JSON alone.
"""

from __future__ import annotations

from pathlib import Path

from .sweep import SweepReport


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot(report: SweepReport, out: Path) -> Path:
    """Write the plot of ``report`` to ``out``; returns ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("no plot: matplotlib is not installed (pip install matplotlib); "
                              "the JSON has every point") from None
    fig, axes = plt.subplots(3, 1, figsize=(7, 8.5), sharex=True)
    rows = (("effect", _effect_label(report)), ("kl", "KL from unsteered (nats/token)"),
            ("perplexity", "perplexity of the neutral text"))
    layers = list(dict.fromkeys(p.layer for p in report.points))
    for ax, (field, label) in zip(axes, rows):
        for layer in layers:
            points = sorted((p for p in report.points if p.layer == layer), key=lambda p: p.scale)
            ax.plot([p.scale for p in points], [getattr(p, field) for p in points], marker="o",
                    ms=4, label="preset" if layer is None else f"layer {layer}")
        chosen = report.recommendation
        if chosen is not None:
            ax.plot([chosen.scale], [getattr(chosen, field)], marker="*", ms=16, color="crimson",
                    ls="none", zorder=5, label="recommended" if field == "effect" else None)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].axhline(report.kl_budget, color="crimson", ls="--", lw=1,
                    label=f"KL budget {report.kl_budget:g}")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    axes[-1].set_xlabel("scale")
    target = report.target.get("vector") or report.target.get("preset")
    title = f"{target} on {report.model}"
    if chosen is not None:
        title += f": scale {chosen.scale:g}" + ("" if chosen.layer is None else
                                                 f" at layer {chosen.layer}")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _effect_label(report: SweepReport) -> str:
    kind = report.effect.get("kind")
    if kind == "words":
        return f"log P(words | '{report.effect.get('stem', '')}')"
    if kind == "ab":
        return "P(matching answer)"
    return f"mean {report.effect.get('function', 'score')}"
