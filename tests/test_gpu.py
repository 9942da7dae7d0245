"""The invariants on a real GPU engine: vLLM 0.25.1 on the H200, torch.compile on, CUDA graphs
FULL_AND_PIECEWISE, both model runners. Run there with ``pytest -m gpu tests/test_gpu.py``.

Weights are vLLM's seeded dummy weights (``load_format="dummy"``) of a Qwen3 0.6B-shaped model
cut to 6 layers, so the steered and the plugin-free engine hold identical weights.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import engine_env, run_engine
from hotwire.tools.verify import STABLE_INDUCTOR

pytestmark = pytest.mark.gpu

LAYERS, HIDDEN = 6, 1024
ENGINE = dict(dtype="bfloat16", load_format="dummy", skip_tokenizer_init=True,
              attention_backend="TRITON_ATTN", max_model_len=2048, max_num_seqs=32,
              max_num_batched_tokens=256, seed=0,
              gpu_memory_utilization=0.1, kv_cache_memory_bytes=2 * 2**30,  # fixed: engines may share the GPU
              enable_prefix_caching=True,
              compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE",
                                  "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]})
RUNNERS = {"v2": "1", "v1": "0"}  # VLLM_USE_V2_MODEL_RUNNER
if importlib.util.find_spec("vllm") and not importlib.util.find_spec("vllm.v1.worker.gpu_model_runner"):
    del RUNNERS["v1"]  # vLLM 0.34 removed the V1 runner


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


if not _cuda():
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from hotwire.tools.tiny_model import write_config

    return write_config(tmp_path_factory.mktemp("gpu-model"), "qwen3-0.6b", num_hidden_layers=LAYERS)


@pytest.fixture(scope="module")
def vectors_dir(tmp_path_factory):
    from hotwire.shared.wire import encode_safetensors

    rng = np.random.default_rng(7)
    d = tmp_path_factory.mktemp("gpu-vectors")
    for name in ("v0", "v1", "v2"):
        (d / f"{name}.safetensors").write_bytes(encode_safetensors(rng.standard_normal(HIDDEN).astype(np.float32)))
    (d / "layered.safetensors").write_bytes(
        encode_safetensors(rng.standard_normal((LAYERS, HIDDEN)).astype(np.float32)))
    return d


def _rounds():
    rng = np.random.default_rng(3)

    def req(n, spec=None, max_tokens=16):
        return {"prompt_token_ids": rng.integers(100, 150000, n).tolist(), "max_tokens": max_tokens,
                "spec": spec, "logprobs": 0}

    a, b, c, long_, cached = req(12), req(20), req(7), req(600), req(700)
    s0 = {"id": "v0", "layer": 2, "scale": 4.0}
    s1 = [{"id": "v1", "layer": 1, "scale": 3.0}, {"id": "layered", "layer": 4, "scale": 2.0}]
    s2 = {"id": "v2", "layer": 3, "scale": -4.0, "decode_only": True}
    s3 = [{"id": "v0", "layer": 2, "mode": "ablate"}, {"id": "v1", "layers": [1, 3], "mode": "norm", "scale": 0.3},
          {"id": "v2", "layer": 4, "scale": 4.0, "gate": {"probe": "v0", "layer": 2, "threshold": 0.0}}]
    s4 = {"id": "v2", "layers": "all", "mode": "clamp", "lo": 2.0, "hi": 2.0}  # pinned: moves these weights

    def w(r, spec):
        return {**r, "spec": spec}

    return {
        "plain": [a, b, c, long_],
        "alone": [w(a, s0)],
        "crowd": [w(a, s0), w(b, s1), c, long_, w(c, s2)],
        "crowd_swapped": [w(a, s0), w(b, s2), w(c, s1), long_, c],  # same shapes, other batchmates
        "plain_again": [a, b, c, long_],
        "cache_steered": [w(cached, s0)],
        "cache_plain": [cached],
        "decode_batch": [w(req(16), (s0, s1, s3, s4)[i % 4]) if i % 3 else req(16) for i in range(24)],
        "modes": [w(a, s3), w(b, s4), c, long_],
        "modes_swapped": [w(a, s3), b, w(c, s4), long_],  # same shapes, other batchmates
    }


ROUNDS = _rounds()


@pytest.fixture(scope="module", params=list(RUNNERS))
def runs(request, tmp_path_factory, model, vectors_dir):
    flag = RUNNERS[request.param]
    job = {"model": str(model), "engine": ENGINE, "rounds": list(ROUNDS.values()), "graph_counts": True,
           "op_calls": True}

    def run(plugin: bool):
        tmp = tmp_path_factory.mktemp(f"{request.param}-{'steered' if plugin else 'plugin-free'}")
        # reduction configs chosen by rule, not by timing: the two engines start side by side and
        # must make the same choices (tests/test_e2e_serve.py)
        # the op's kernels switched per step in the graphs (graph_switch): every invariant below on them
        env = engine_env(tmp, HOTWIRE_VECTORS=str(vectors_dir), VLLM_USE_V2_MODEL_RUNNER=flag,
                         HOTWIRE_PROJECTION_LAYERS="all", HOTWIRE_GRAPH_SWITCH="1", **STABLE_INDUCTOR)
        res = run_engine(tmp, {**job, "plugin": plugin}, env, timeout=580)
        return dict(zip(ROUNDS, res["rounds"])), res

    with ThreadPoolExecutor(2) as pool:  # the two engines start side by side on the one GPU
        return dict(zip((True, False), pool.map(run, (True, False))))


def _steered(req) -> bool:
    return req["spec"] is not None


def test_plugin_loaded_only_where_asked(runs):
    assert runs[True][1]["hotwire"] and not runs[False][1]["hotwire"]


def test_a_steering_engine_logs_no_hotwire_error(runs):
    """In particular not "the engine core did not load hotwire" for the requests of vLLM's own
    kernel warm-up (V2 runner), which run before the engine core's sync starts."""
    errors = [line for line in runs[True][1]["log"].splitlines() if "ERROR" in line and "hotwire" in line]
    assert not errors, errors


def test_unsteered_bit_exact_with_plugin_free(runs):
    checked = 0
    for name, reqs in ROUNDS.items():
        for i, req in enumerate(reqs):
            if not _steered(req):
                assert runs[True][0][name][i] == runs[False][0][name][i], (name, i)
                checked += 1
    assert checked >= 15


def test_steering_fires(runs):
    for name in ("alone", "crowd", "cache_steered"):
        for i, req in enumerate(ROUNDS[name]):
            if _steered(req):
                assert runs[True][0][name][i]["tokens"] != runs[False][0][name][i]["tokens"], (name, i)
    for i, req in enumerate(ROUNDS["modes"]):  # a clamp may leave these weights' greedy tokens as they are
        if _steered(req):
            assert runs[True][0]["modes"][i]["logprobs"] != runs[False][0]["modes"][i]["logprobs"], i


def test_steered_request_ignores_batchmates(runs):
    """Same batch shape, batchmates steered differently: the request is bit-identical."""
    r = runs[True][0]
    assert r["crowd"][0] == r["crowd_swapped"][0]
    assert r["modes"][0] == r["modes_swapped"][0]  # projecting modes too


def test_steered_alone_and_in_batch(runs):
    r = runs[True][0]
    assert r["alone"][0]["tokens"] == r["crowd"][0]["tokens"]


def test_prefix_cache_isolated(runs):
    assert runs[True][0]["cache_plain"] == runs[False][0]["cache_plain"]


def test_no_recompile_no_recapture(runs):
    """Invariant 4: steering on/off/changes between requests are buffer updates only.

    Counted after warm-up and after every round: the steered engine compiles and captures
    exactly what the plugin-free engine does for the same batches (vLLM's V1 runner compiles
    one more shape range lazily, with or without the plugin), plus one graph without the op for
    each (``idle_graphs``, captured at start-up), and never recaptures.
    """
    steered, free = runs[True][1]["graph_counts"], runs[False][1]["graph_counts"]
    assert steered[0]["captures"] > 0
    assert [{**c, "idle_captures": 0} for c in steered] == free
    assert all(c["idle_captures"] == c["captures"] for c in steered)
    assert {c["captures"] for c in steered} == {steered[0]["captures"]}


def test_the_ops_calls_from_python_go_past_the_dispatcher(runs):
    """Steps run without a CUDA graph call the op from Python on every armed layer; on the GPU each
    call must reach the op's kernel past torch's dispatcher, which would let the GIL go (and in a
    served engine wait for vLLM's output thread to give it back)."""
    calls = runs[True][1]["op_calls"]
    assert calls["calls"] > 0  # the long prompts' prefill steps pass the largest capture size: no graph
    assert calls["direct"] == calls["calls"], calls


def test_the_ops_kernels_are_switched_in_every_graph_holding_them(runs):
    """Inside captured graphs the op's kernels run only on the layers a step's requests steer
    (``graph_switch``): the engine found every op launch of its capture as a graph node. The
    rounds above ran on those graphs (steered alone and in a batch alike, unsteered bit-exact)."""
    import re

    said = re.findall(r"switched per step to the layers requests steer in (\d+) captured graphs \((\d+) kernels\)(.*)",
                      runs[True][1]["log"])
    assert said, "the engine did not say it switches the op's kernels in its graphs"
    graphs, kernels, rest = said[-1]
    assert int(graphs) > 0 and int(kernels) >= int(graphs) and "not found" not in rest
