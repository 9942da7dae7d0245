"""The invariants of docs/architecture.md on a real vLLM engine (CPU in CI), against a plugin-free
run and a plain transformers forward with a hook.

One steered engine and one plugin-free engine run the same batches (rounds); each test checks
one invariant on those results. Batches use a 64-token budget with prompts up to ~190 tokens,
so long prompts are chunked and steps mix prefill and decode tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CPU_ENGINE, LAYERS, engine_env, requires_vllm, run_engine

pytestmark = [requires_vllm, pytest.mark.vllm]

SHORT = ["The quick brown fox", "Paris is the capital of", "Once upon a time, a small",
         "Electric cars, rockets and"]
LONG = "Steering vectors nudge a language model toward a concept. " * 6
LONG2 = "Paris is the capital of France, and Tokyo is the capital of Japan. " * 5
CACHED = LONG2 * 3  # > 2 KV blocks of 128 tokens (the CPU block size), so blocks are shared
BOOST = {"id": "boost", "layer": 1, "scale": 1.5}
STACK = [{"id": "a", "layer": 2}, {"id": "b", "layer": 2}]
POSITION_SPECS = {
    "decode_only": {"id": "boost", "layer": 1, "scale": 2.0, "decode_only": True},
    "prompt": {"id": "boost", "layer": 1, "scale": 2.0, "positions": "prompt"},
    "range": {"id": "boost", "layer": 1, "scale": 2.0, "positions": [3, 9]},
    "layered": [{"id": "layered", "layer": 0, "scale": 0.5}, {"id": "layered", "layer": 3, "scale": 1.0},
                {"id": "boost", "layer": 3, "scale": -0.5}],
}
BAD_SPECS = {  # spec -> the reason it is counted under
    "not json {": "unsteered_malformed",
    '{"id": "boost", "layer": 1, "scale": "inf"}': "unsteered_malformed",
    '{"id": "nope", "layer": 1}': "unsteered_unknown_id",
    '{"id": "wrongshape", "layer": 1}': "unsteered_unknown_id",  # its file was refused at start
    '{"id": "boost", "layer": 99}': "unsteered_unarmed_layer",
    '[{"id": "boost", "layer": 1}, {"id": "a", "layer": 1}, {"id": "b", "layer": 1}, '
    '{"id": "boost", "layer": 1}, {"id": "a", "layer": 1}]': "unsteered_too_many_entries",
}
MODE_SPECS = {  # every mode, alone, on many layers, and stacked on one layer with an add
    "ablate": {"id": "boost", "layer": 1, "mode": "ablate"},
    "norm_layers": {"id": "a", "layers": [1, 2], "mode": "norm", "scale": 0.5},
    "clamp_all": {"id": "boost", "layers": "all", "mode": "clamp", "lo": -0.5, "hi": 0.5, "positions": "generated"},
    "stacked": [{"id": "a", "layer": 2, "mode": "ablate"}, {"id": "b", "layer": 2, "mode": "norm", "scale": -0.4},
                {"id": "layered", "layer": 2, "scale": 0.5},
                {"id": "boost", "layer": 3, "mode": "clamp", "lo": 2.0, "hi": 2.0, "positions": [2, 40]}],
    "gated": [{"id": "boost", "layer": 2, "scale": 3.0, "gate": {"probe": "a", "layer": 1, "threshold": 0.0}},
              {"id": "b", "layer": 1, "mode": "ablate", "gate": {"probe": "a", "layer": 1, "threshold": 0.0}},
              {"id": "a", "layer": 3, "scale": -2.0, "gate": {"probe": "layered", "layer": 1, "threshold": 0.0}}],
    # prompt gates: decided on the prompt's last token, one that opens and one that stays closed
    "prompt_open": {"id": "boost", "layer": 2, "scale": 3.0,
                    "gate": {"probe": "a", "layer": 1, "threshold": -1e30, "scope": "prompt"}},
    "prompt_closed": {"id": "boost", "layer": 2, "scale": 3.0,
                      "gate": {"probe": "a", "layer": 2, "threshold": 1e30, "scope": "prompt"}},
}
BAD_SPECS.update({
    '{"id": "boost", "layer": 1, "mode": "clamp", "lo": 1, "hi": 0}': "unsteered_bad_params",
    '{"id": "zero", "layer": 1, "mode": "ablate"}': "unsteered_zero_vector",
    '[{"id": "boost", "layer": 1}, {"preset": "calm"}]': "unsteered_preset_unresolved",
    '{"id": "boost", "layer": 1, "gate": {"probe": "a", "layer": 2}}': "unsteered_bad_params",
    '{"id": "boost", "layer": 1, "gate": {"probe": "zero", "layer": 1}}': "unsteered_zero_vector",
    '{"id": "boost", "layer": 0, "mode": "ablate"}': "unsteered_unarmed_projection",  # layer 0 reads no stream
    '{"id": "boost", "layer": 2, "gate": {"probe": "a", "layer": 0}}': "unsteered_unarmed_projection",
})
MAX_TOKENS = 10
# Follow-up turns under selectors relative to the prompt's end: turn 2's prompt is turn 1's prompt
# and answer, so KV blocks turn 1 computed with its answer steered as generated (or unsteered)
# tokens hold what turn 2 steers as prompt (or does not).
TURN_SPECS = [{"id": "boost", "layer": 1, "scale": 2.0, "decode_only": True},
              {"id": "boost", "layer": 1, "scale": 2.0, "positions": "prompt"}]
PROJECTING = {1, 2, 3}  # HOTWIRE_PROJECTION_LAYERS of the steered engine


def _rounds(tok) -> dict[str, list[dict]]:
    def req(text, spec=None, n=MAX_TOKENS):
        return {"prompt_token_ids": tok(text).input_ids, "max_tokens": n, "spec": spec, "logprobs": 0}

    rounds = {
        "plain": [req(SHORT[0]), req(SHORT[1]), req(LONG)],
        "mixed": [req(SHORT[0], BOOST), req(SHORT[1]), req(LONG), req(LONG2, {"id": "layered", "layer": 2})],
        "alone": [req(SHORT[0], BOOST)],
        "crowd": [req(SHORT[2]), req(SHORT[3], {"id": "a", "layer": 3}), req(SHORT[0], BOOST), req(LONG),
                  req(SHORT[1], POSITION_SPECS["layered"])],
        "bad": [req(SHORT[0], spec) for spec in BAD_SPECS] + [req(SHORT[1])],
        "stack": [req(SHORT[2], STACK)],
        "summed": [req(SHORT[2], {"id": "a_plus_b", "layer": 2})],
        "positions": [req(SHORT[1], spec) for spec in POSITION_SPECS.values()],
        "cache_steered": [req(CACHED, {"id": "boost", "layer": 0, "scale": 2.0})],
        "cache_plain": [req(CACHED)],
        "cache_steered_again": [req(CACHED, {"id": "boost", "layer": 0, "scale": 2.0})],
        "modes": [req(SHORT[0], MODE_SPECS["ablate"]), req(SHORT[1]), req(SHORT[2], MODE_SPECS["norm_layers"]),
                  req(LONG, MODE_SPECS["clamp_all"]), req(SHORT[3], MODE_SPECS["stacked"]),
                  req(LONG2, MODE_SPECS["gated"]), req(SHORT[0], MODE_SPECS["prompt_open"]),
                  req(SHORT[0], MODE_SPECS["prompt_closed"])],
        "modes_alone": [req(SHORT[3], MODE_SPECS["stacked"])],
    }
    first = tok(CACHED).input_ids[:200]  # turn 1 ends inside the second 128-token block
    rounds["turn1"] = [{"prompt_token_ids": first, "max_tokens": 100, "spec": s} for s in TURN_SPECS]
    after = len(rounds) - 1
    more = tok(" And then?").input_ids
    for name, salt in (("turn2", {}), ("turn2_unshared", {"cache_salt": "own"})):
        rounds[name] = [{**req(SHORT[0], s), "prompt_token_ids": more, "after": [after, i], **salt}
                        for i, s in enumerate(TURN_SPECS)]
    return rounds


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="module")
def rounds(tok):
    return _rounds(tok)


def _job(model, rounds, plugin: bool, engine=CPU_ENGINE) -> dict:
    return {"model": str(model), "engine": engine, "plugin": plugin, "rounds": list(rounds.values())}


def _named(out: dict, rounds: dict) -> dict[str, list[dict]]:
    return dict(zip(rounds, out["rounds"]))


@pytest.fixture(scope="module")
def steered(tmp_path_factory, tiny_model, vectors_dir, rounds):
    tmp = tmp_path_factory.mktemp("steered")
    env = engine_env(tmp, HOTWIRE_VECTORS=str(vectors_dir), HOTWIRE_PROJECTION_LAYERS="1-3")  # PROJECTING
    out = run_engine(tmp, _job(tiny_model, rounds, True), env)
    return _named(out, rounds), out


@pytest.fixture(scope="module")
def plugin_free(tmp_path_factory, tiny_model, rounds):
    tmp = tmp_path_factory.mktemp("plugin-free")
    out = run_engine(tmp, _job(tiny_model, rounds, False), engine_env(tmp))
    return _named(out, rounds), out


def _is_steered(req: dict) -> bool:
    spec = req["spec"]
    return spec is not None and not (isinstance(spec, str) and spec in BAD_SPECS)


def test_plugin_loaded_only_where_asked(steered, plugin_free):
    assert steered[1]["hotwire"] is True
    assert plugin_free[1]["hotwire"] is False


def test_unsteered_requests_equal_plugin_free_run(steered, plugin_free, rounds):
    """Invariant 1: every unsteered request, batchmates of steered ones and requests whose spec
    was refused included, gives exactly the plugin-free tokens and logprobs."""
    checked = 0
    for name, reqs in rounds.items():
        for i, req in enumerate(reqs):
            if _is_steered(req):
                continue
            got, want = steered[0][name][i], plugin_free[0][name][i]
            assert got["tokens"] == want["tokens"], (name, i)
            assert got["logprobs"] == want["logprobs"], (name, i)
            checked += 1
    assert checked >= 12


def test_steering_changes_output(steered, plugin_free, rounds):
    for name in ("mixed", "alone", "crowd", "stack", "summed", "cache_steered"):
        for i, req in enumerate(rounds[name]):
            if _is_steered(req):
                assert steered[0][name][i]["tokens"] != plugin_free[0][name][i]["tokens"], (name, i)


def test_steered_output_same_alone_and_in_batch(steered):
    """Invariant 2: the same steered request alone, in a mixed batch and in a crowded batch."""
    alone = steered[0]["alone"][0]
    for name, i in (("mixed", 0), ("crowd", 2)):
        other = steered[0][name][i]
        assert other["tokens"] == alone["tokens"], name
        np.testing.assert_allclose(other["logprobs"], alone["logprobs"], atol=1e-4)


def test_every_mode_steers_and_is_the_same_alone_and_in_batch(steered, plugin_free, rounds):
    """Each mode changes what its request computes; the stacked one is the same alone (invariant 2)."""
    for i, req in enumerate(rounds["modes"]):
        got, free = steered[0]["modes"][i], plugin_free[0]["modes"][i]
        if req["spec"] is MODE_SPECS["prompt_closed"]:
            assert got == free  # the prompt gate stayed closed: the request ran as unsteered
        elif _is_steered(req):
            assert got["logprobs"] != free["logprobs"], i
    alone, batched = steered[0]["modes_alone"][0], steered[0]["modes"][4]
    assert alone["tokens"] == batched["tokens"]
    np.testing.assert_allclose(alone["logprobs"], batched["logprobs"], atol=1e-4)


def test_two_entries_on_a_layer_add_up(steered):
    stacked, summed = steered[0]["stack"][0], steered[0]["summed"][0]
    assert stacked["tokens"] == summed["tokens"]
    np.testing.assert_allclose(stacked["logprobs"], summed["logprobs"], atol=1e-4)


def test_refused_specs_are_counted_by_reason(steered, rounds):
    counters = steered[1]["counters"]
    for reason in set(BAD_SPECS.values()):
        assert counters[reason] == list(BAD_SPECS.values()).count(reason), reason
    n_steered = sum(_is_steered(r) for reqs in rounds.values() for r in reqs)
    assert counters["steered_requests"] == n_steered
    assert "runs unsteered (unknown_id): no vector 'nope' for layer 1" in steered[1]["log"]


def test_steps_and_host_time_reach_the_mailbox(steered, rounds):
    """Every engine step is counted (each round takes at least its longest request's steps),
    with hotwire's host time on them."""
    counters = steered[1]["counters"]
    min_steps = sum(max(r.get("max_tokens", 8) for r in reqs) for reqs in rounds.values())
    assert counters["steps"] >= min_steps
    assert 0 < counters["host_ns"] < counters["steps"] * 10**7  # under 10 ms a step on CPU
    # by hook: the engine core's and the rank's (same process here), adding up to the total
    hooks = [counters[f"host_ns_{h}"] for h in ("core", "schedule", "batch")]
    assert all(ns > 0 for ns in hooks) and sum(hooks) == counters["host_ns"]
    # every round's arrivals and departures are changed steps; its steady decode steps are not
    assert len(rounds) <= counters["steps_changed"] < counters["steps"] - len(rounds)
    assert 0 < counters["host_ns_changed"] < counters["host_ns"]
    assert counters["heartbeat_ns"] > 0


def test_bad_startup_files_are_named_and_skipped(steered):
    log = steered[1]["log"]
    for name in ("wrongshape.safetensors", "hasnan.safetensors", "garbage.safetensors"):
        assert f"{name}: " in log and "skipping" in log, name
    assert "armed 4/4 decoder layers" in log


def test_prefix_cache_never_mixes_steering_configs(steered, plugin_free):
    """Invariant 5: an unsteered request after a steered one with the same long prompt gets the
    unsteered tokens; the steered one repeated gets its own again."""
    s = steered[0]
    assert s["cache_plain"][0]["tokens"] == plugin_free[0]["cache_plain"][0]["tokens"]
    assert s["cache_plain"][0]["logprobs"] == plugin_free[0]["cache_plain"][0]["logprobs"]
    assert s["cache_steered_again"][0]["tokens"] == s["cache_steered"][0]["tokens"]


def test_a_follow_up_turn_never_reuses_blocks_steered_for_another_prompt_end(steered):
    """Invariant 5 across chat turns: turn 2 carries turn 1's answer in its prompt; with the same
    spec it gives what it gives with no block shared."""
    s = steered[0]
    for shared, own in zip(s["turn2"], s["turn2_unshared"]):
        assert shared["tokens"] == own["tokens"]
        np.testing.assert_allclose(shared["logprobs"], own["logprobs"], atol=1e-4)


# -- the math, against transformers ------------------------------------------------------------

def _hf_change(h, vec, e):
    """What entry ``e`` adds to the stream ``h [T, H]``: its mode's formula (docs/architecture.md,
    invariant 3)."""
    import torch

    v = torch.from_numpy(vec).to(h.dtype)
    u = v / v.norm()
    proj = (h @ u)[:, None]  # [T, 1]
    if e.mode == "add":
        return e.scale * v.expand_as(h)
    if e.mode == "norm":
        return e.scale * h.norm(dim=-1, keepdim=True) * u
    if e.mode == "ablate":
        return -e.scale * proj * u
    lo = -torch.inf if e.lo is None else e.lo
    hi = torch.inf if e.hi is None else e.hi
    return (proj.clamp(lo, hi) - proj) * u


def _hf_greedy(model, prompt_ids, n_new, terms, probes=None):
    """Greedy decode with forward hooks at the end of each layer applying each term's mode on the
    absolute positions ``[lo, hi)``; all terms of a layer read the layer's own output stream.
    ``terms``: [(layer, vec [H], entry, lo, hi)]; ``probes``: {gate: probe vector [H]}, each
    gate evaluated on its layer's output before that layer's terms apply."""
    import torch

    probes = probes or {}
    opened = {}  # gate -> [T] bool, this forward's
    handles = []
    for layer in sorted({t[0] for t in terms} | {g.layer for g in probes}):
        mine = [t for t in terms if t[0] == layer]

        def hook(module, args, out, mine=mine, layer=layer):
            h = out[0] if isinstance(out, tuple) else out
            pos = torch.arange(h.shape[1])
            for gate, p in probes.items():
                if gate.layer == layer:
                    p = torch.from_numpy(p).to(h.dtype)
                    opened[gate] = h[0] @ (p / p.norm()) > gate.threshold
                    if gate.scope == "prompt":  # decided on the prompt's last token, for all
                        opened[gate] = opened[gate][len(prompt_ids) - 1].expand(h.shape[1])
            add = torch.zeros_like(h[0])
            for _, vec, e, lo, hi in mine:
                mask = ((pos >= lo) & (pos < hi))
                if e.gate is not None:
                    mask = mask & opened[e.gate]
                add = add + mask.to(h.dtype)[:, None] * _hf_change(h[0], vec, e)
            h = h + add
            return (h, *out[1:]) if isinstance(out, tuple) else h

        handles.append(model.model.layers[layer].register_forward_hook(hook))
    ids, logprobs = list(prompt_ids), []
    try:
        with torch.no_grad():
            for _ in range(n_new):
                logits = model(torch.tensor([ids])).logits[0, -1].double()
                lp = torch.log_softmax(logits, -1)
                nxt = int(lp.argmax())
                logprobs.append(float(lp[nxt]))
                ids.append(nxt)
    finally:
        for h in handles:
            h.remove()
    return ids[len(prompt_ids):], logprobs


def _terms(spec, vectors, prompt_len):
    from hotwire.shared.spec import parse_spec

    out = []
    for e in parse_spec(spec):
        vec = vectors[e.id]
        lo, hi = e.span(prompt_len)
        if e.gate is not None and e.gate.scope == "prompt":
            lo = max(lo, prompt_len - 1)  # steered from the deciding token on
        for layer in e.targets(set(range(LAYERS)) if e.mode == "add" else PROJECTING):
            row = vec[layer] if vec.ndim == 2 else vec
            out.append((layer, row, e, lo, hi))
    return out


def _probes(spec, vectors):
    from hotwire.shared.spec import parse_spec

    probes = {}
    for e in parse_spec(spec):
        if e.gate is not None:
            vec = vectors[e.gate.probe]
            probes[e.gate] = vec[e.gate.layer] if vec.ndim == 2 else vec
    return probes


def test_gates_open_for_some_tokens_and_are_counted(steered):
    """The gated request's gates opened for some of its tokens, a prompt gate once or never, and
    the counts reached the log and the mailbox's counter."""
    import re

    counts = [list(map(int, re.findall(r"gate \d+: (\d+)", line)))
              for line in steered[1]["log"].splitlines() if "its gates opened for" in line]
    assert [0] in counts and [1] in counts  # the prompt gates: decided once, closed and open
    token_gates = [c for c in counts if len(c) == 2]  # the gated request: two token gates
    assert token_gates and all(0 < n for c in token_gates for n in c)
    assert steered[1]["counters"]["gate_opened_tokens"] == sum(map(sum, counts))


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model), torch_dtype=torch.float32).eval()


@pytest.mark.parametrize("name", ["alone", "stack", "positions", "mixed", "crowd", "modes"])
def test_math_matches_transformers_hook(name, steered, rounds, vectors, hf_model):
    """Invariant 3: each entry's mode applied to the residual stream (``h_L += scale * v_L`` for an
    add), on the chosen positions and layers."""
    checked = 0
    for i, req in enumerate(rounds[name]):
        if not _is_steered(req):
            continue
        prompt = req["prompt_token_ids"]
        tokens, logprobs = _hf_greedy(hf_model, prompt, MAX_TOKENS, _terms(req["spec"], vectors, len(prompt)),
                                      _probes(req["spec"], vectors))
        got = steered[0][name][i]
        assert got["tokens"] == tokens, (name, i)
        np.testing.assert_allclose(got["logprobs"], logprobs, atol=2e-3, rtol=0)
        checked += 1
    assert checked
