"""Argument types the commands share: layers, feature indices, scales, names."""

from __future__ import annotations

import argparse
import math

from hotwire.shared.importers.result import F32_MAX
from hotwire.shared.spec import ID_PATTERN, layer_ranges, valid_id

MAX_FEATURES = 4096  # an import of more features than an engine has slots is a typo


def parse_layers(text: str) -> list[int]:
    """``"10-12,20"`` -> ``[10, 11, 12, 20]``."""
    try:
        return layer_ranges(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected layers like 10-20,24") from None


def parse_features(text: str) -> list[int]:
    """``"1234,5678"``, ``"10-12"``; at most :data:`MAX_FEATURES`, counted before a range is
    expanded."""
    spans = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or int(hi or lo) < int(lo):
            raise argparse.ArgumentTypeError(f"{text!r}: expected feature indices like "
                                             "1234,5678 or 10-12")
        spans.append(range(int(lo), int(hi or lo) + 1))
    if not spans or sum(map(len, spans)) > MAX_FEATURES:
        raise argparse.ArgumentTypeError(f"{text!r}: name 1 to {MAX_FEATURES} features")
    return [feature for span in spans for feature in span]


def parse_scale(text: str) -> float:
    """A number finite in float32 (``-4``, ``0.5``), as a spec's ``scale`` must be."""
    try:
        scale = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not math.isfinite(scale) or abs(scale) > F32_MAX:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number finite in float32")
    return scale


def parse_name(text: str) -> str:
    """A vector id or preset name (:data:`~hotwire.shared.spec.ID_PATTERN`)."""
    if not valid_id(text):
        raise argparse.ArgumentTypeError(f"{text!r}: names match {ID_PATTERN}")
    return text
