"""torch.compile on (vLLM's inductor path on CPU): the op lives inside the compiled graph.

Invariant 4 on CPU: steering switched on, off and between vectors compiles nothing beyond what
a plugin-free engine compiles for the same batches; unsteered output stays bit-exact with it.
Only ``HOTWIRE_LAYERS=1,2`` are armed here, so a spec on layer 3 is refused and counted.
"""

from __future__ import annotations

import pytest

from conftest import CPU_ENGINE, engine_env, requires_vllm, run_engine

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["The quick brown fox", "Paris is the capital of", "Once upon a time, a small"]
SPECS = [None, {"id": "boost", "layer": 1, "scale": 2.0}, None, {"id": "layered", "layer": 2},
         [{"id": "boost", "layers": [1, 2], "mode": "ablate", "scale": 2.0},  # the projecting modes
          {"id": "a", "layer": 2, "mode": "clamp", "lo": 4.0}, {"id": "b", "layer": 1, "mode": "norm", "scale": 1.0},
          {"id": "a", "layer": 2, "scale": 3.0, "gate": {"probe": "b", "layer": 1}}],  # and a gate
         {"id": "boost", "layer": 3}]  # last: an unarmed layer


@pytest.fixture(scope="module")
def rounds(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    return [[{"prompt_token_ids": tok(p).input_ids, "max_tokens": 8, "logprobs": 0,
              "spec": spec if i == 0 else None} for i, p in enumerate(PROMPTS)] for spec in SPECS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, vectors_dir, rounds):
    engine = {**CPU_ENGINE, "enforce_eager": False}
    out = {}
    for plugin in (True, False):
        tmp = tmp_path_factory.mktemp("compiled-steered" if plugin else "compiled-free")
        env = engine_env(tmp, HOTWIRE_VECTORS=str(vectors_dir), HOTWIRE_LAYERS="1,2", HOTWIRE_PROJECTION_LAYERS="1,2")
        out[plugin] = run_engine(tmp, {"model": str(tiny_model), "engine": engine, "plugin": plugin,
                                       "rounds": rounds, "graph_counts": True, "op_calls": True}, env)
    return out


def test_compiled_graph_count_matches_plugin_free_every_round(runs):
    steered, free = runs[True]["graph_counts"], runs[False]["graph_counts"]
    assert steered[0]["compiles"] >= 1
    assert steered == free


def test_compiled_unsteered_bit_exact_and_steering_fires(runs):
    for r, spec in enumerate(SPECS):
        for i in range(len(PROMPTS)):
            got, want = runs[True]["rounds"][r][i], runs[False]["rounds"][r][i]
            steered = i == 0 and spec is not None and r != len(SPECS) - 1
            if steered:
                assert got["tokens"] != want["tokens"], (r, i)
            else:
                assert got == want, (r, i)


def test_only_chosen_layers_are_armed(runs):
    assert "armed 2/4 decoder layers" in runs[True]["log"]
    assert runs[True]["counters"]["unsteered_unarmed_layer"] == 1


def test_every_call_of_the_op_in_the_compiled_forward_goes_past_the_dispatcher(runs):
    """A forward run without a CUDA graph (every CPU step) calls the op from Python on each armed
    layer; the dispatcher would let the GIL go on each call, so each must go straight to the op's
    kernel (``steer_op._call_past_the_dispatcher``): vLLM runs its forward in inference mode, with no
    dispatch or function mode and no profiler on."""
    calls = runs[True]["op_calls"]
    assert calls["calls"] > 0
    assert calls["direct"] == calls["calls"], calls
