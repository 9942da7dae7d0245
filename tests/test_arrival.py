"""A steered request's arrival (engine_plugin.arrival): its spec is resolved as vLLM makes its
``Request`` (on the engine core's input thread), and the step that admits it finds the resolution,
against the bindings of the step (tests/engine_rig.py: one core, its ranks, a real mailbox)."""

import json
import logging
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from engine_rig import H, Rig
from hotwire.engine_plugin import arrival
from hotwire.engine_plugin.admission import Admission
from hotwire.shared.mailbox import ANY_LAYER

SPEC = {"hotwire": json.dumps({"id": "v", "layer": 1, "scale": 2.0})}


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step()  # the vector bound
    arrival.use_core(rig.core.prepare)  # as CoreSync.start does
    yield rig
    arrival.use_core(None)


@pytest.fixture
def resolutions(monkeypatch):
    """How many times a spec was resolved (Admission._resolve), whoever asked."""
    calls = []
    resolve = Admission._resolve

    def counted(self, *args):
        calls.append(args)
        return resolve(self, *args)

    monkeypatch.setattr(Admission, "_resolve", counted)
    return calls


def _requests() -> ModuleType:
    """A stand-in for ``vllm.v1.request``, patched as hotwire patches vLLM's."""
    module = ModuleType("fake_request")

    class Request:
        def __init__(self, request_id, prompt_token_ids, sampling_params, prompt_embeds=None, cache_salt=None):
            self.request_id, self.cache_salt = request_id, cache_salt

    module.Request = Request
    arrival.patch_request(module)
    return module


def _arrive(module: ModuleType, req_id: str, extra_args: dict, prompt_len: int = 3):
    return module.Request(req_id, list(range(prompt_len)), SimpleNamespace(extra_args=extra_args))


def test_a_spec_resolved_as_its_request_arrives_is_not_resolved_again_at_its_step(rig, resolutions):
    _arrive(_requests(), "r", SPEC)
    assert len(resolutions) == 1  # on arrival
    rig.step(new=[("r", SPEC, 3)])
    assert len(resolutions) == 1  # the step found it
    assert rig.router.active["r"].slots == (0,)
    assert rig.router.active["r"].terms[0].a == np.float32(2.0).view(np.int32)


def test_a_binding_changed_between_arrival_and_step_is_admitted_against_the_bindings_of_the_step(rig):
    _arrive(_requests(), "r", SPEC)
    rig.control.write(1, "v", ANY_LAYER, 2 * np.ones(H, np.float32), gen=2)  # replaced: slot 1 serves v
    rig.step(new=[("r", SPEC, 3)])
    assert rig.router.active["r"].slots == (1,)


def test_an_unsteered_or_refused_request_arrives_as_it_would_without_hotwire(rig, resolutions):
    module = _requests()
    plain = _arrive(module, "p", {"other": 1})
    unknown = _arrive(module, "u", {"hotwire": json.dumps({"id": "nope", "layer": 1})})
    assert plain.cache_salt is None and unknown.cache_salt  # salted: it names steering
    rig.step(new=[("p", {"other": 1}, 3), ("u", {"hotwire": json.dumps({"id": "nope", "layer": 1})}, 3)])
    assert not rig.router.active and rig.counters.counts["unsteered_unknown_id"] == 1  # refused once, at the step


def test_a_failure_resolving_ahead_leaves_every_request_to_its_step(rig, resolutions, caplog):
    def broken(extra_args, prompt_len):
        raise RuntimeError("boom")

    arrival.use_core(broken)
    module = _requests()
    with caplog.at_level(logging.ERROR, logger="vllm.hotwire"):
        first = _arrive(module, "r1", SPEC)
        _arrive(module, "r2", SPEC)
    assert first.cache_salt  # the request is made, salted, as without the head start
    assert sum("resolving a spec as its request arrived failed" in r.message for r in caplog.records) == 1
    rig.step(new=[("r1", SPEC, 3), ("r2", SPEC, 3)])
    assert set(rig.router.active) == {"r1", "r2"} and len(resolutions) == 1  # resolved at the step, once
