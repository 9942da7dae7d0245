"""Layer lists as people read and type them, in messages and the CLI: ``[0, 1, 2, 5]`` is
``0-2,5``, the syntax ``--layers`` and ``HOTWIRE_LAYERS`` take.

:func:`format_layers` is the inverse of :func:`hotwire.shared.spec.layer_ranges` up to order and
repeats: ``layer_ranges(format_layers(xs)) == sorted(set(xs))``.
"""

from __future__ import annotations

from collections.abc import Iterable


def format_layers(layers: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: sorted, each run of consecutive layers as ``a-b``, a
    layer named twice once; ``""`` for none."""
    spans: list[list[int]] = []
    for layer in sorted(set(layers)):
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
