"""Invariant 8 end to end: what an attacker can send or write harms no one else.

Real processes as deployed (``vllm serve`` with the plugin in vLLM's multiprocess layout, and
``hotwire control-api`` on its mailbox), on CPU, or on a GPU with ``HOTWIRE_E2E_GPU=1``. Expected outputs come from the same server before the
attack: an unsteered request must keep its tokens, a steered one its steered tokens.

- spec attack: entries whose ``|scale| * max|v|`` overflows the stream, and a spec of small
  entries on every layer whose sum does, sent beside unsteered requests and followed by fresh
  ones (they poisoned the KV cache on CPU before the fix);
- mailbox attack: garbage written into the directory region, then the file truncated to one
  page (a ``UnicodeDecodeError`` killed the server; the shrink killed the worker and the control
  API with SIGBUS, both reading a memory map).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import HIDDEN, requires_vllm
from control_harness import json_body
from hotwire.shared.mailbox import DIRECTORY, HEADER_BYTES, ControlMailbox
from servers import ControlApi, VllmServer, logs_on_failure, wait_for
from test_e2e_serve import ENGINE, ENGINE_ENV  # CPU, or as deployed on a GPU (HOTWIRE_E2E_GPU=1)

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

TOKEN = "attack-secret"
N = 8
STEER = json.dumps({"id": "v", "layer": 2, "scale": 0.25})
OVERFLOWS = [json.dumps({"id": "v", "layer": 1, "scale": s}) for s in (3.4e38, -3.4e38, 1e38)] + [
    json.dumps([{"id": "v", "layers": "all", "scale": 8e35}] * 4)]  # each entry small, the spec not


@pytest.fixture(scope="module")
def served(request, tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("attacks")
    engine = VllmServer(tmp / "engine", tiny_model, ENGINE, **ENGINE_ENV)
    control = ControlApi(tmp / "control", engine.mailbox, token=TOKEN)
    try:
        with logs_on_failure(request, engine, control):
            engine.start()
            control.start()
            v = (np.random.default_rng(7).standard_normal(HIDDEN) * 4).astype(np.float32)
            r = control.api().post("/steer/vectors", json=json_body("v", v))
            assert r.status_code == 201, r.text
            yield engine, control
    finally:
        control.stop()
        engine.stop()


def _complete(engine: VllmServer, prompt: list[int], steer: str | None = None) -> list[int]:
    return engine.complete(prompt, steer, N)["token_ids"]


PROMPTS = [[5, 17, 42, 99, 3], [11, 12, 13], [200, 100, 50, 25, 12, 6], [7] * 9]


@pytest.fixture(scope="module")
def baseline(served):
    engine, _ = served
    return ({tuple(p): _complete(engine, p) for p in PROMPTS},
            {tuple(p): _complete(engine, p, STEER) for p in PROMPTS})


def _counters(control: ControlApi) -> dict[str, int]:
    r = control.api().get("/steer/slots")
    assert r.status_code == 200, r.text
    return r.json()["engine"]["counters"]


def test_overflowing_scales_beside_victims_harm_none_of_them(served, baseline):
    engine, control = served
    plain, _ = baseline
    jobs = [(p, None) for p in PROMPTS] + [(PROMPTS[i % 4], s) for i, s in enumerate(OVERFLOWS)]
    for _ in range(3):  # concurrent: attackers and victims share the engine's batches
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda job: _complete(engine, *job), jobs))
        for (prompt, steer), tokens in zip(jobs, got):
            assert tokens == plain[tuple(prompt)], (prompt, steer)  # attackers run unsteered too
    for p in PROMPTS:  # fresh requests after the attack
        assert _complete(engine, p) == plain[tuple(p)]
    wait_for(lambda: _counters(control)["unsteered_out_of_range"] >= 3 * len(OVERFLOWS), 10,
             "the refusals counted")


def test_a_corrupt_then_truncated_mailbox_kills_neither_side(served, baseline):
    engine, control = served
    plain, steered = baseline
    box = engine.mailbox
    with open(box, "r+b") as f:  # garbage over two directory entries (seqlock even: "complete")
        f.seek(HEADER_BYTES + DIRECTORY.itemsize * 6)
        f.write(b"\xfe" * 2 * DIRECTORY.itemsize)
    _bump(box)  # what a writer does after a directory write: the engine looks again
    wait_for(lambda: _counters(control)["mailbox_rejected"] == 2, 20, "the engine rejecting both")
    for p in PROMPTS:
        assert _complete(engine, p) == plain[tuple(p)]
        assert _complete(engine, p, STEER) == steered[tuple(p)]

    os.truncate(box, 4096)  # one page: the header alone
    for p in PROMPTS:  # the engine serves on, steering with the vector it holds
        assert _complete(engine, p) == plain[tuple(p)]
        assert _complete(engine, p, STEER) == steered[tuple(p)]
    assert engine.died() is None and control.died() is None
    assert control.get_ok("/healthz")
    wait_for(lambda: not control.get_ok("/readyz"), 20, "the control API to go unready")
    r = control.http().get("/readyz")
    assert r.status_code == 503 and r.json()["reason"], r.text
    # the engine's mailbox thread finds the truncation at its next heartbeat, which may come after
    # the control API's readiness check: wait for its one line (anywhere in the log)
    said = f"mailbox {box} is unusable"
    wait_for(lambda: said in engine.log_tail(10**8), 20, "the engine saying its mailbox is unusable")


def _bump(box) -> None:
    """Bump ``target_gen``, as the control API does after every directory write."""
    mb = ControlMailbox.attach(str(box))
    try:
        mb._bump()
    finally:
        mb.close()
