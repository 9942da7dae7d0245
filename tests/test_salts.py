"""The prefix-cache salt (engine_plugin.salts) as vLLM's ``Request`` gets it: from the versions the
engine core's own mailbox thread acked (with data parallelism, its rank's ``<mailbox>.dpN``:
a vector replaced on one rank changes that rank's salts, whatever another rank's mailbox holds),
with no file read when a request arrives, and for steered requests only (invariant 5)."""

from __future__ import annotations

import json
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch

from hotwire.engine_plugin import arrival, salts
from hotwire.engine_plugin.admission import Admission
from hotwire.engine_plugin.config import HotwireConfig
from hotwire.engine_plugin.core_sync import CoreSync
from hotwire.engine_plugin.counters import Counters
from hotwire.engine_plugin.delta import PendingDelta
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.stream_bound import StreamBudget
from hotwire.shared.mailbox import ANY_LAYER, ControlMailbox, EngineMailbox, Fingerprint
from hotwire.shared.spec import cache_salt, parse_spec

FP = Fingerprint("my/model", n_layers=4, hidden=8, dtype="bfloat16")
SPEC = json.dumps({"id": "v", "layer": 1, "scale": 2.0})
PROMPT_LEN = 5


def _salt() -> str | None:
    return salts.request_salt(SimpleNamespace(extra_args={"hotwire": SPEC}), PROMPT_LEN)


def _sync(box: EngineMailbox) -> CoreSync:
    """An engine core's sync on ``box``, as ``CoreSync.start`` makes it (without its thread)."""
    registry = Registry(box.n_slots)
    admission = Admission(registry, armed=[1], entries=2, requests=4, budget=StreamBudget.of(torch.bfloat16),
                          counters=None)
    sync = CoreSync(box, PendingDelta(FP.hidden, torch.bfloat16), registry, admission, Counters())
    salts.use_versions(lambda: sync.versions)
    return sync


@pytest.fixture(autouse=True)
def _no_versions():
    yield
    salts.use_versions(dict)


def test_a_dp_ranks_salt_follows_its_own_mailbox(tmp_path, monkeypatch):
    base = tmp_path / "engine.mbx"
    monkeypatch.setenv("HOTWIRE_MAILBOX", str(base))
    EngineMailbox.create(str(base), FP, n_slots=4).set_armed([1], entries=4)
    rank1 = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=1))
    sync = _sync(CoreSync._open_mailbox(HotwireConfig.from_env(), rank1, FP, [1], []))  # rank 1's engine core
    own = f"{base}.dp1"
    assert sync.box.path == own
    row = np.ones(FP.hidden, np.float32)
    for path in (str(base), own):
        ControlMailbox.attach(path).write(0, "v", ANY_LAYER, row, gen=1)
    assert _salt() == cache_salt(parse_spec(SPEC), {}, PROMPT_LEN)  # written, not yet taken in
    sync.poll()
    first = _salt()
    assert first == cache_salt(parse_spec(SPEC), sync.versions, PROMPT_LEN) and "v" in sync.versions
    ControlMailbox.attach(str(base)).write(1, "v", ANY_LAYER, 2 * row, gen=2)  # rank 0 only
    sync.poll()
    assert _salt() == first
    ControlMailbox.attach(own).write(1, "v", ANY_LAYER, 2 * row, gen=2)  # replaced on rank 1
    sync.poll()
    assert _salt() not in (first, None)


def _request_module() -> ModuleType:
    """A stand-in for ``vllm.v1.request`` whose ``Request`` records what it was built with."""
    module = ModuleType("fake_request")

    class Request:
        def __init__(self, request_id, prompt_token_ids, sampling_params, pooling_params=None,
                     prompt_embeds=None, cache_salt=None, priority=0):
            self.prompt_token_ids, self.cache_salt = prompt_token_ids, cache_salt

    module.Request = Request
    return module


def test_the_request_patch_salts_steered_requests_however_vllm_passes_the_arguments(monkeypatch):
    module = _request_module()
    arrival.patch_request(module)
    steered = SimpleNamespace(extra_args={"hotwire": SPEC})
    want = cache_salt(parse_spec(SPEC), {}, 3)
    by_name = module.Request(request_id="r", prompt_token_ids=[1, 2, 3], sampling_params=steered)
    by_position = module.Request("r", [1, 2, 3], steered, None, None, "user-salt")
    assert by_name.cache_salt == want
    assert by_position.cache_salt == f"user-salt|{want}"
    plain = module.Request("r", [1, 2, 3], SimpleNamespace(extra_args={"other": 1}), cache_salt="s")
    assert plain.cache_salt == "s"
    assert module.Request("r", [1], None).cache_salt is None  # pooling requests have no sampling params


def test_a_salted_request_drops_block_hashes_computed_before_its_salt():
    """vLLM 0.34's Request takes block hashes a frontend computed from the prompt and the salt it
    knew; a steered request's salt changes after that, so its hashes must be made again."""
    module = ModuleType("fake_request_034")

    class Request:
        def __init__(self, request_id, prompt_token_ids, sampling_params, cache_salt=None, block_hashes=None):
            self.cache_salt, self.block_hashes = cache_salt, block_hashes

    module.Request = Request
    arrival.patch_request(module)
    steered, plain = SimpleNamespace(extra_args={"hotwire": SPEC}), SimpleNamespace(extra_args=None)
    assert module.Request("r", [1, 2, 3], steered, block_hashes=[b"h0"]).block_hashes is None
    assert module.Request("r", [1, 2, 3], steered, None, [b"h0"]).block_hashes is None
    assert module.Request("r", [1, 2, 3], plain, block_hashes=[b"h0"]).block_hashes == [b"h0"]


def _config_module(*methods: str) -> ModuleType:
    """A stand-in for ``vllm.config.vllm`` whose ``VllmConfig`` has ``methods`` of the compile cache's
    key: ``compute_hash`` (up to vLLM 0.33), ``compile_factors`` (0.34)."""
    module = ModuleType("fake_config")
    body = {"compute_hash": lambda self, include_version=True: "0123abcd" * 4,
            "compile_factors": lambda self, include_version=True: {"model": {"name": "m"}, "version": "0.34.0"}}
    module.VllmConfig = type("VllmConfig", (), {"scheduler_config": SimpleNamespace(max_num_seqs=8),
                                                **{m: body[m] for m in methods}})
    return module


def test_the_compile_key_is_salted_in_whichever_form_vllm_computes_it(monkeypatch, caplog):
    monkeypatch.setenv("HOTWIRE_SLOTS", "64")
    old, new, both, neither = (_config_module(*m) for m in (("compute_hash",), ("compile_factors",),
                                                            ("compute_hash", "compile_factors"), ()))
    for module in (old, new, both, neither):
        salts.patch_config_hash(module)
        salts.patch_config_hash(module)  # once only, however often the module is patched
    h = old.VllmConfig().compute_hash()
    assert len(h) == 32 and h != "0123abcd" * 4
    factors = new.VllmConfig().compile_factors()
    assert factors == {"model": {"name": "m"}, "version": "0.34.0", "hotwire": salts.compile_salt(new.VllmConfig())}
    assert "slots=64" in factors["hotwire"]
    assert both.VllmConfig().compute_hash() == h and both.VllmConfig().compile_factors() == factors
    monkeypatch.setenv("HOTWIRE_SLOTS", "128")  # another table shape: another key
    assert old.VllmConfig().compute_hash() != h and new.VllmConfig().compile_factors() != factors
    with caplog.at_level("ERROR", logger="vllm.hotwire"):
        salts.patch_config_hash(_config_module())
    assert "neither compute_hash nor compile_factors" in caplog.text


def test_a_request_arrival_reads_no_file(tmp_path, monkeypatch):
    """The salt's versions come from memory: the engine core's input thread, which shares the
    step thread's GIL, makes no system call for them."""
    sync = _sync(EngineMailbox.create(str(tmp_path / "e.mbx"), FP, n_slots=4))
    ControlMailbox.attach(str(tmp_path / "e.mbx")).write(0, "v", ANY_LAYER, np.ones(FP.hidden, np.float32), gen=1)
    sync.poll()
    calls = []
    for name in ("pread", "stat", "open", "fstat"):
        real = getattr(__import__("os"), name)
        monkeypatch.setattr(f"os.{name}", lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    assert _salt() is not None and calls == []
