"""Invariant 8 on a real vLLM engine (CPU in CI): no request's spec harms another request.

An attacker sends scales that are finite in float32 but overflow the residual stream (and a
vector of huge values at a modest scale), and specs whose entries are each small but whose
whole can overflow it (one entry on every layer, repeated; an add that a later ``ablate`` or
``norm`` multiplies), beside unsteered victims, and fresh requests follow in later batches.
Every victim and every later request must give exactly the plugin-free tokens, and the
attacker's specs are refused as ``out_of_range`` (the request runs unsteered).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CPU_ENGINE, HIDDEN, engine_env, requires_vllm, run_engine

pytestmark = [requires_vllm, pytest.mark.vllm]

ATTACKS = [
    {"id": "unit", "layer": 1, "scale": 3.4e38},
    {"id": "unit", "layer": 2, "scale": -3.4e38},
    {"id": "unit", "layer": 0, "scale": 1e38},
    {"id": "huge", "layer": 1, "scale": 2.0},
    [{"id": "unit", "layers": "all", "scale": 1e37}] * 4,
    [{"id": "unit", "layer": 0, "scale": 1e37}, {"id": "unit", "layer": 1, "mode": "ablate", "scale": -64}],
    [{"id": "unit", "layer": 0, "scale": 1e37}, {"id": "unit", "layer": 1, "mode": "norm", "scale": 64}],
]
PROMPTS = ["The quick brown fox", "Paris is the capital of", "Once upon a time, a small",
           "Electric cars, rockets and"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def attack_vectors(tmp_path_factory):
    from hotwire.shared.wire import encode_safetensors

    d = tmp_path_factory.mktemp("attack-vectors")
    (d / "unit.safetensors").write_bytes(encode_safetensors(np.ones(HIDDEN, np.float32)))
    (d / "huge.safetensors").write_bytes(encode_safetensors(np.full(HIDDEN, 3e38, np.float32)))
    return d


def _rounds(tok) -> list[list[dict]]:
    def req(text, spec=None):
        return {"prompt_token_ids": tok(text).input_ids, "max_tokens": MAX_TOKENS, "spec": spec}

    beside = [req(p) for p in PROMPTS] + [req(PROMPTS[i % 4], a) for i, a in enumerate(ATTACKS)]
    later = [req(p) for p in PROMPTS]
    return [beside, beside, later, later]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, attack_vectors):
    from transformers import AutoTokenizer

    rounds = _rounds(AutoTokenizer.from_pretrained(str(tiny_model)))
    out = {}
    for plugin in (True, False):
        tmp = tmp_path_factory.mktemp("armed" if plugin else "plugin-free")
        env = (engine_env(tmp, HOTWIRE_VECTORS=str(attack_vectors), HOTWIRE_PROJECTION_LAYERS="all") if plugin
               else engine_env(tmp))
        out[plugin] = run_engine(tmp, {"model": str(tiny_model), "engine": CPU_ENGINE,
                                       "plugin": plugin, "rounds": rounds}, env)
    return rounds, out[True], out[False]


def _same(runs, attackers: bool) -> int:
    rounds, armed, plugin_free = runs
    checked = 0
    for r, batch in enumerate(rounds):
        for i, req in enumerate(batch):
            if (req["spec"] is not None) == attackers:
                assert armed["rounds"][r][i]["tokens"] == plugin_free["rounds"][r][i]["tokens"], (r, i)
                checked += 1
    return checked


def test_overflowing_entries_harm_no_batchmate_and_no_later_request(runs):
    assert _same(runs, attackers=False) == 4 * len(PROMPTS)


def test_overflowing_entries_are_refused_and_counted(runs):
    _, armed, _ = runs
    assert _same(runs, attackers=True) == 2 * len(ATTACKS)  # refused: they run unsteered
    assert armed["counters"]["unsteered_out_of_range"] == 2 * len(ATTACKS)
    assert armed["counters"]["steered_requests"] == 0
    assert "runs unsteered (out_of_range)" in armed["log"]
