"""The prefix-cache salt (engine_plugin.salts) reads the vector versions of the engine's own
mailbox: with data parallelism that is its rank's ``<mailbox>.dpN``, so a vector replaced on one
rank changes that rank's salts, whatever another rank's mailbox holds (invariant 5)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from hotwire.engine_plugin import salts
from hotwire.engine_plugin.config import HotwireConfig
from hotwire.engine_plugin.core_sync import CoreSync
from hotwire.shared.mailbox import ANY_LAYER, ControlMailbox, EngineMailbox, Fingerprint, MailboxView
from hotwire.shared.spec import cache_salt, parse_spec

FP = Fingerprint("my/model", n_layers=4, hidden=8, dtype="bfloat16")
SPEC = json.dumps({"id": "v", "layer": 1, "scale": 2.0})
PROMPT_LEN = 5


def _salt() -> str | None:
    return salts.request_salt(SimpleNamespace(extra_args={"hotwire": SPEC}), PROMPT_LEN)


def _expected(path: str) -> str:
    view = MailboxView.open(path)
    try:
        return cache_salt(parse_spec(SPEC), view.versions(), PROMPT_LEN)
    finally:
        view.close()


def test_a_dp_ranks_salt_follows_its_own_mailbox(tmp_path, monkeypatch):
    base = tmp_path / "engine.mbx"
    monkeypatch.setenv("HOTWIRE_MAILBOX", str(base))
    monkeypatch.setattr(salts._versions, "path", None)
    EngineMailbox.create(str(base), FP, n_slots=4).set_armed([1])
    rank1 = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=1))
    CoreSync._open_mailbox(HotwireConfig.from_env(), rank1, FP, [1], [])  # rank 1's engine core
    own = f"{base}.dp1"
    row = np.ones(FP.hidden, np.float32)
    for path in (str(base), own):
        ControlMailbox.attach(path).write(0, "v", ANY_LAYER, row, gen=1)

    first = _salt()
    assert first == _expected(own) != _expected(str(base))
    ControlMailbox.attach(str(base)).write(1, "v", ANY_LAYER, 2 * row, gen=2)  # rank 0 only
    assert _salt() == first
    ControlMailbox.attach(own).write(1, "v", ANY_LAYER, 2 * row, gen=2)  # replaced on rank 1
    assert _salt() == _expected(own) != first
