"""``control_api.layer_lists.format_layers`` writes what ``shared.spec.layer_ranges`` reads:
the layer sets the CLI prints paste back into ``--layers``."""

from __future__ import annotations

import numpy as np
import pytest

from hotwire.control_api.layer_lists import format_layers
from hotwire.shared.spec import layer_ranges


@pytest.mark.parametrize("layers,text", [
    ([], ""), ([7], "7"), ([0, 1, 2, 5], "0-2,5"), (list(range(1, 30)), "1-29"),
    ([1, 3, 5], "1,3,5"), ([5, 4, 3, 9, 10], "3-5,9-10"), ([2, 2, 3], "2-3"),
    ([*range(1, 30), 31], "1-29,31"),
])
def test_layer_sets_print_as_ranges(layers, text):
    assert format_layers(layers) == text
    assert layer_ranges(text) == sorted(set(layers))


def test_the_round_trip_holds_for_any_set_and_any_written_form():
    rng = np.random.default_rng(0)
    for _ in range(500):
        layers = rng.choice(64, size=int(rng.integers(0, 40)), replace=True).tolist()
        assert layer_ranges(format_layers(layers)) == sorted(set(layers))
        text = format_layers(layers)
        assert format_layers(layer_ranges(text)) == text
    assert format_layers(layer_ranges("20, 1-3 ,2,4-5")) == "1-5,20"
