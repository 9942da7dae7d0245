"""Layer lists as people read them, in messages and the CLI: ``[0, 1, 2, 5]`` is ``0-2,5``."""

from __future__ import annotations

from collections.abc import Sequence


def format_layers(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    spans: list[list[int]] = []
    for layer in sorted(layers):
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "none"
