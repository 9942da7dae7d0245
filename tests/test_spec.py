"""Request spec: parsing, refusals by reason, spans, canonical form and cache salt."""

import gc
import json
import tracemalloc

import numpy as np
import pytest

from hotwire.shared.spec import (
    MAX_ENTRIES,
    MAX_SPEC_CHARS,
    NO_END,
    SPEC_CACHE_BYTES,
    SPEC_CACHE_TEXTS,
    SpecError,
    cache_salt,
    canonical_json,
    f32_bits,
    parse_spec,
    valid_id,
)


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
    ('{"id": "x", "layer": 1, "scale": "nan"}', "valid number"),
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
    assert f32_bits(e.scale) == int(np.float32(scale).view(np.int32))


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


@pytest.mark.parametrize("entry", [
    {"id": "a", "layer": 1}, {"id": "v-1.x_2", "layer": 0, "scale": -0.0}, {"id": "a", "layer": 3, "scale": 1e-300},
    {"id": "a", "layer": 2, "scale": 3.4e38, "decode_only": True}, {"id": "a", "layers": [4, 2], "positions": [3, 9]},
    {"id": "a", "layers": "all", "mode": "norm", "scale": 0.25}, {"id": "a", "layer": 1, "mode": "ablate"},
    {"id": "a", "layer": 1, "mode": "clamp", "lo": -1.5}, {"id": "a", "layer": 1, "mode": "clamp", "lo": 0, "hi": 2},
    {"id": "a", "layer": 2, "positions": "prompt", "gate": {"probe": "p", "layer": 1, "threshold": -2, "scope": "prompt"}},
])
def test_an_entrys_canonical_text_is_its_canonical_form_as_sorted_compact_json(entry):
    """canonical_text writes the text field by field, for speed: it must be the encoder's."""
    (e,) = parse_spec(entry)
    assert e.canonical_text() == json.dumps(e.canonical(), sort_keys=True, separators=(",", ":"))
    spec = parse_spec([entry, {"id": "z", "layer": 0}])
    assert spec.reads == tuple(sorted({e.id, "z"} | ({e.gate.probe} if e.gate else set())))
    assert spec.relative_to_prompt == e.relative_to_prompt


@pytest.mark.parametrize("text", [
    '{"id": "a", "layer": 1}', '  [{"id": "a", "layer": 1, "scale": 2}]', b'[{"id": "a", "layer": 1}]',
    '[{"id": "a", "layer": 1, "layer": 2}]', '[{"id": "\\u0061", "layer": 1}]', '[{"id": "a", "layer": 1.0}]',
    '[{"id": "a", "layer": true}]', '[{"id": "a", "layer": "1"}]', '[{"id": "a", "layer": 1, "scale": NaN}]',
    '[{"id": "a", "layer": 1, "scale": 1e400}]', '[{"id": "a", "layer": 100000000000000000000000}]',
    '[{"id": "a", "layer": 1, "decode_only": 1}]', '[{"id": "a", "layers": [1, 1]}]', '[{"preset": "p"}]',
    '[{"id": "a", "layer": 1, "positions": [2, 1]}]', '[{"id": "a", "layer": 1, "positions": [0, 5]}]',
    "[]", "{}", "null", "3", '"a"', "[" + ",".join(['{"id": "a", "layer": 1}'] * 17) + "]",
    '[{"id": "a", "layer": 2, "gate": {"probe": "p", "layer": 1, "extra": 0}}]',
    '[{"id": "a", "layer": 1, "mode": "clamp", "lo": 2, "hi": 1}]', '[{"id": "a", "layer": 1}] x',
])
def test_the_one_pass_parse_takes_only_what_the_checking_parse_takes_the_same_way(text):
    """Specs are parsed in one pass by pydantic's JSON parser when it takes the text, else by
    json.loads and validation, which says why one is refused: the first must never take a text
    the second refuses, nor read one otherwise."""
    from hotwire.shared.spec import _parse_items, _valid_json

    fast = _valid_json(text)
    try:
        slow = _parse_items(json.loads(text))
    except (SpecError, ValueError):
        slow = None
    assert fast is None or tuple(fast) == tuple(slow)


def test_cache_salt_separates_configs_and_vector_versions():
    base = parse_spec({"id": "a", "layer": 1, "scale": 1.0})
    salts = {
        cache_salt(base),
        cache_salt(parse_spec({"id": "a", "layer": 1, "scale": 1.5})),
        cache_salt(parse_spec({"id": "a", "layer": 2, "scale": 1.0})),
        cache_salt(parse_spec({"id": "a", "layer": 1, "scale": 1.0, "positions": "prompt"})),
        cache_salt(base, {"a": "1/0:2"}),
        cache_salt(base, {"a": "1/0:4"}),
    }
    assert len(salts) == 6
    assert cache_salt(base, {"a": "1/0:2", "other": "1/3:2"}) == cache_salt(base, {"a": "1/0:2"})


def test_cache_salt_covers_a_gates_probe_version():
    gated = parse_spec({"id": "a", "layer": 2, "gate": {"probe": "p", "layer": 1}})
    assert cache_salt(gated, {"a": "1/0:2", "p": "1/1:2"}) != cache_salt(gated, {"a": "1/0:2", "p": "1/1:4"})


@pytest.mark.parametrize("entry", [
    {"positions": "generated"}, {"decode_only": True}, {"positions": "prompt"},
    {"gate": {"probe": "a", "layer": 1, "scope": "prompt"}},
])
def test_cache_salt_covers_the_prompt_length_where_tokens_are_chosen_from_the_prompts_end(entry):
    spec = parse_spec({"id": "a", "layer": 1, **entry})
    assert cache_salt(spec, prompt_len=200) != cache_salt(spec, prompt_len=320)


@pytest.mark.parametrize("entry", [{}, {"positions": [0, 50]}, {"gate": {"probe": "a", "layer": 1}}])
def test_cache_salt_ignores_the_prompt_length_where_positions_do_not_depend_on_it(entry):
    spec = parse_spec({"id": "a", "layer": 1, **entry})
    assert cache_salt(spec, prompt_len=200) == cache_salt(spec, prompt_len=320)


# Hardening ---------------------------------------------------------------------------------

NEWLINE_ID = "c" * 64 + "\n"


def test_an_id_with_a_trailing_newline_is_not_an_id():
    assert valid_id("c" * 64) and not valid_id(NEWLINE_ID) and not valid_id("x\n")
    for raw in ({"id": NEWLINE_ID, "layer": 0}, json.dumps({"id": NEWLINE_ID, "layer": 0})):
        with pytest.raises(SpecError) as err:
            parse_spec(raw)
        assert err.value.reason == "malformed" and "id" in err.value.detail


def test_a_spec_text_over_the_size_cap_is_refused():
    text = '{"id": "x", "layer": 0}'
    (e,) = parse_spec(text + " " * (MAX_SPEC_CHARS - len(text)))
    assert e.id == "x"
    for too_long in (text + " " * (MAX_SPEC_CHARS + 1 - len(text)), (text + " " * 2**20).encode()):
        with pytest.raises(SpecError) as err:
            parse_spec(too_long)
        assert err.value.reason == "too_large"


def test_the_spec_cache_counts_what_many_entries_hold():
    """Short specs of many entries, each with its prefix-cache salt made (so its canonical texts
    are kept): the parsed entries, not the texts, are what the budget must count here."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1500):
            entries = [{"id": f"e{i}-{j}", "layer": j % 7, "scale": i + j / 8} for j in range(MAX_ENTRIES)]
            parse_spec(json.dumps(entries)).canonical
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < SPEC_CACHE_BYTES * 1.15, f"{retained / 2**20:.2f} MiB retained"


def test_the_spec_cache_keeps_few_objects_for_the_collector():
    """A new spec with every request (distinct vectors and scales): what the cache keeps is bounded
    by its text count, not only its bytes; each kept spec is objects every full collection walks."""
    gc.collect()
    before = len(gc.get_objects())
    for i in range(3000):
        parse_spec(json.dumps([{"id": f"v{i % 256}", "layer": 9, "scale": 0.5 + i / 64},
                               {"id": f"v{(i + 7) % 256}", "layer": 18, "scale": -0.25 - i / 64}]))
    gc.collect()
    kept = len(gc.get_objects()) - before
    # about 7 objects a kept two-entry spec: 1,800 for 256 texts (11,000 when 4 MiB alone bounded it)
    assert kept < 2500, f"{kept} objects kept for at most {SPEC_CACHE_TEXTS} texts"


def test_texts_spelling_the_same_spec_share_one_parsed_copy():
    text = '[{"id": "shared", "layer": 2, "scale": 0.5}]'
    first = parse_spec(text)
    assert parse_spec(text + " " * 100) is first
    assert parse_spec('[{"scale":0.5,"layer":2,"id":"shared"}]') is first
    # Order is kept: entries on one layer are summed in the order written.
    two = '[{"id": "a", "layer": 1}, {"id": "b", "layer": 1}]'
    swapped = '[{"id": "b", "layer": 1}, {"id": "a", "layer": 1}]'
    assert [e.id for e in parse_spec(swapped)] == ["b", "a"] != [e.id for e in parse_spec(two)]


def test_the_spec_cache_holds_a_bounded_number_of_bytes():
    """Padded specs (the attack run's: 120 specs of 1 MiB pinned 120 MB) stay within the
    cache's byte budget, as the allocator sees it."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):  # about 12 MB of distinct text, each just under the size cap
            parse_spec(json.dumps({"id": f"pad{i}", "layer": i % 7}) + " " * (8000 + 8 * i))
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < SPEC_CACHE_BYTES * 1.25, f"{retained / 2**20:.1f} MiB retained"
