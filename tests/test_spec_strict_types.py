"""A spec's numbers are JSON numbers and its flags JSON booleans: nothing is coerced.

JSON has both types, and a client that sends ``true`` for a layer or ``"1.5"`` for a scale has
made a mistake the engine must report (``malformed``), not guess at: ``true`` as layer 1, or
``[true, false]`` as layers ``[1, 0]``, steers where nobody asked. Integers still serve where a
float is wanted (``"scale": 2``), and JSON lists where the model keeps tuples.
"""

from __future__ import annotations

import json

import pytest

from hotwire.shared.spec import SpecError, parse_spec

CLAMP = {"id": "v", "layer": 1, "mode": "clamp", "lo": -1.0, "hi": 1.0}
GATE = {"probe": "p", "layer": 0, "threshold": 0.5}

NOT_NUMBERS = {  # case -> (entry, the field the parser names)
    "layer true": ({"id": "v", "layer": True}, "layer"),
    "layer false": ({"id": "v", "layer": False}, "layer"),
    "layers of booleans": ({"id": "v", "layers": [True, False]}, "layers"),
    "a boolean among layers": ({"id": "v", "layers": [1, True]}, "layers"),
    "scale true": ({"id": "v", "layer": 1, "scale": True}, "scale"),
    "scale false": ({"id": "v", "layer": 1, "scale": False}, "scale"),
    "lo true": ({**CLAMP, "lo": True}, "lo"),
    "hi false": ({**CLAMP, "hi": False}, "hi"),
    "positions of booleans": ({"id": "v", "layer": 1, "positions": [False, True]}, "positions"),
    "gate layer true": ({"id": "v", "layer": 1, "gate": {**GATE, "layer": True}}, "gate.layer"),
    "gate threshold true": ({"id": "v", "layer": 1, "gate": {**GATE, "threshold": True}},
                            "gate.threshold"),
    "layer as text": ({"id": "v", "layer": "1"}, "layer"),
    "layers as text": ({"id": "v", "layers": ["1", "2"]}, "layers"),
    "scale as text": ({"id": "v", "layer": 1, "scale": "1.5"}, "scale"),
    "positions as text": ({"id": "v", "layer": 1, "positions": ["0", "4"]}, "positions"),
}
NOT_BOOLEANS = {
    "decode_only 1": {"id": "v", "layer": 1, "decode_only": 1},
    "decode_only 0": {"id": "v", "layer": 1, "decode_only": 0},
    "decode_only as text": {"id": "v", "layer": 1, "decode_only": "true"},
}


@pytest.mark.parametrize("as_text", [True, False], ids=["json text", "object"])
@pytest.mark.parametrize("case", NOT_NUMBERS)
def test_a_boolean_or_text_is_not_a_number(case, as_text):
    entry, field = NOT_NUMBERS[case]
    with pytest.raises(SpecError) as refused:
        parse_spec(json.dumps(entry) if as_text else entry)
    assert refused.value.reason == "malformed" and refused.value.detail.startswith(field), \
        refused.value.detail


@pytest.mark.parametrize("case", NOT_BOOLEANS)
def test_a_number_or_text_is_not_a_boolean(case):
    with pytest.raises(SpecError) as refused:
        parse_spec(json.dumps(NOT_BOOLEANS[case]))
    assert refused.value.reason == "malformed" and refused.value.detail.startswith("decode_only")


def test_integers_serve_as_floats_and_lists_as_tuples():
    [add, clamp, gated] = parse_spec(json.dumps([
        {"id": "a", "layers": [2, 3], "scale": 2, "positions": [0, 4], "decode_only": False},
        {"id": "b", "layer": 1, "mode": "clamp", "lo": -1, "hi": 1},
        {"id": "c", "layer": 2, "gate": {"probe": "p", "layer": 1, "threshold": 0}},
    ]))
    assert (add.layers, add.scale, add.positions) == ((2, 3), 2.0, (0, 4))
    assert type(add.scale) is float and (clamp.lo, clamp.hi) == (-1.0, 1.0)
    assert gated.gate.threshold == 0.0 and gated.gate.layer == 1
    [flag] = parse_spec('{"id": "a", "layer": 0, "decode_only": true}')
    assert flag.decode_only is True and flag.where == "generated"
