"""Request spec: parsing, refusals by reason, spans, canonical form and cache salt."""

import json

import numpy as np
import pytest

from hotwire.shared.spec import MAX_ENTRIES, NO_END, SpecError, cache_salt, canonical_json, parse_spec


@pytest.mark.parametrize("raw", [
    '{"id": "x", "layer": 2, "scale": 1.5}',
    {"id": "x", "layer": 2, "scale": 1.5},
    [{"id": "x", "layer": 2, "scale": 1.5}],
    '[{"id": "x", "layer": 2, "scale": 1.5}]',
])
def test_string_dict_and_list_forms_parse_alike(raw):
    (e,) = parse_spec(raw)
    assert (e.id, e.layer, e.scale, e.where) == ("x", 2, 1.5, "all")


def test_original_wire_format_decode_only_means_generated_tokens():
    (e,) = parse_spec({"id": "tesla_car", "layer": 20, "scale": 1.5, "decode_only": True})
    assert e.where == "generated"
    assert e.span(prompt_len=7) == (7, NO_END)


@pytest.mark.parametrize("positions,span", [("all", (0, NO_END)), ("prompt", (0, 7)),
                                            ("generated", (7, NO_END)), ([3, 9], (3, 9))])
def test_positions_become_absolute_spans(positions, span):
    (e,) = parse_spec({"id": "x", "layer": 0, "positions": positions})
    assert e.span(prompt_len=7) == span


@pytest.mark.parametrize("raw,fragment", [
    ("{not json", "not JSON"),
    ('{"id": "x"}', "layer"),
    ('{"id": "x", "layer": -1}', "layer"),
    ('{"id": "bad id!", "layer": 1}', "id"),
    ('{"id": "x", "layer": 1, "scale": "nan"}', "finite"),
    ('{"id": "x", "layer": 1, "scale": 1e39}', "finite in float32"),  # a finite double, inf in float32
    ('{"id": "x", "layer": 1, "positions": [5, 2]}', "start < end"),
    ('{"id": "x", "layer": 1, "positions": "later"}', "positions"),
    ('{"id": "x", "layer": 1, "decode_only": true, "positions": "prompt"}', "decode_only"),
    ('{"id": "x", "layer": 1, "colour": "red"}', "colour"),
    ("[1, 2]", "object"),
])
def test_malformed_specs_are_refused_with_a_reason(raw, fragment):
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert err.value.reason == "malformed"
    assert fragment in err.value.detail


@pytest.mark.parametrize("scale", [1.0, -0.5, 1 / 3, 3.4e38, -1e-42, 0.0])
def test_scale_bits_are_the_float32_rounding(scale):
    (e,) = parse_spec({"id": "x", "layer": 0, "scale": scale})
    assert e.scale_bits() == int(np.float32(scale).view(np.int32))


def test_too_many_entries():
    with pytest.raises(SpecError) as err:
        parse_spec([{"id": "x", "layer": 0}] * (MAX_ENTRIES + 1))
    assert err.value.reason == "too_many_entries"


def test_spec_text_is_parsed_once_and_refusals_every_time():
    text = '[{"id": "x", "layer": 2, "scale": 0.25}, {"id": "y", "layer": 3}]'
    first = parse_spec(text)
    assert parse_spec(text) is first  # the engine parses each request's spec twice, per request
    assert parse_spec(json.loads(text)) == first and parse_spec(json.loads(text)) is not first
    for _ in range(2):  # a refused spec is refused again, not remembered as anything
        with pytest.raises(SpecError):
            parse_spec('{"id": "x", "layer": -1}')


def test_empty_list_is_not_steered():
    assert parse_spec("[]") == ()


def test_canonical_form_ignores_order_and_spelling():
    a = parse_spec([{"id": "a", "layer": 1, "decode_only": True}, {"id": "b", "layer": 2, "scale": 2}])
    b = parse_spec(json.dumps([{"id": "b", "layer": 2, "scale": 2.0},
                               {"id": "a", "layer": 1, "positions": "generated"}]))
    assert canonical_json(a) == canonical_json(b)
    assert cache_salt(a) == cache_salt(b)


def test_cache_salt_separates_configs_and_vector_generations():
    base = parse_spec({"id": "a", "layer": 1, "scale": 1.0})
    salts = {
        cache_salt(base),
        cache_salt(parse_spec({"id": "a", "layer": 1, "scale": 1.5})),
        cache_salt(parse_spec({"id": "a", "layer": 2, "scale": 1.0})),
        cache_salt(parse_spec({"id": "a", "layer": 1, "scale": 1.0, "positions": "prompt"})),
        cache_salt(base, {"a": 2}),
        cache_salt(base, {"a": 3}),
    }
    assert len(salts) == 6
