"""Data parallelism end to end (CPU in CI): one control API feeds every DP rank of a real engine.

``vllm serve --data-parallel-size 2``: two engine cores (each with its worker), each creating its
own mailbox (``<path>``, ``<path>.dp1``). One push through the control API must reach both ranks,
and every steered request, whichever rank the API server sends it to, is steered alike.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import CPU_ENGINE, HIDDEN, requires_vllm
from control_harness import json_body
from servers import ControlApi, VllmServer, logs_on_failure, wait_for

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

DP2 = {**CPU_ENGINE, "data_parallel_size": 2, "data_parallel_backend": "mp"}
TOKEN = "dp-secret"
PROMPT, N = [5, 17, 42, 99, 3], 10
STEER = json.dumps({"id": "v", "layer": 2, "scale": 0.25})


@pytest.fixture(scope="module")
def dp_servers(request, tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("dp2")
    engine = VllmServer(tmp / "engine", tiny_model, DP2, VLLM_CPU_OMP_THREADS_BIND="0|1")
    control = ControlApi(tmp / "control", engine.mailbox, token=TOKEN)
    try:
        with logs_on_failure(request, engine, control):
            engine.start()
            control.start()
            yield engine, control
    finally:
        control.stop()
        engine.stop()


def _complete(engine: VllmServer, steer: str | None = None) -> list[int]:
    return engine.complete(PROMPT, steer, N)["token_ids"]


def _ranks(control: ControlApi) -> list[dict]:
    r = control.api().get("/steer/slots")
    assert r.status_code == 200, r.text
    return r.json()["ranks"]


def test_one_push_reaches_every_rank_and_both_steer(dp_servers):
    engine, control = dp_servers
    assert engine.mailbox.exists() and engine.mailbox.with_name(engine.mailbox.name + ".dp1").exists()
    wait_for(lambda: len([r for r in _ranks(control) if r["attached"]]) == 2, 30, "both ranks attached")
    v = (np.random.default_rng(5).standard_normal(HIDDEN) * 4).astype(np.float32)
    r = control.api().post("/steer/vectors", json=json_body("v", v))
    assert r.status_code == 201 and r.json()["resident"], r.text
    assert [rank["state"] for rank in r.json()["ranks"]] == ["resident", "resident"]

    plain = _complete(engine)
    with ThreadPoolExecutor(8) as pool:  # the API server spreads them over the two ranks
        got = list(pool.map(lambda _: _complete(engine, STEER), range(16)))
    assert all(tokens == got[0] for tokens in got) and got[0] != plain
    def steered() -> list[int]:  # counters are published with each rank's heartbeat (every 0.25 s)
        return [rank["engine"]["counters"]["steered_requests"] for rank in _ranks(control)]

    wait_for(lambda: sum(steered()) == 16, 5, "both ranks' heartbeats to publish the steered count")
    assert sum(steered()) == 16 and all(n > 0 for n in steered()), steered()
