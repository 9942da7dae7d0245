"""The engine core's mailbox sync (engine_plugin.core_sync): rows reach the bank and bind with the
next step, retirements are acked with exact references, torn writes wait, and every rank changes
at the same step (tests/engine_rig.py: one core, its ranks)."""

import json
import os
import time

import numpy as np
import pytest
import torch

from engine_rig import SLOTS, H, Rig, Step, make_rank, new_req
from hotwire.engine_plugin.file_watch import FileWatch
from hotwire.shared.mailbox import ANY_LAYER, HEARTBEAT_S


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def _spec(*entries):
    return {"hotwire": json.dumps(list(entries))}


def test_mailbox_rows_land_in_the_bank_and_bind(rig):
    row = np.arange(H, dtype=np.float32)
    rig.control.write(2, "v", ANY_LAYER, row, gen=5)
    rig.control.write(4, "w", 3, -row, gen=1)
    rig.idle()
    assert rig.control.in_sync() and rig.control.acked(2) and rig.control.acked(4)  # acked at once
    assert rig.registry.resolve("v", 1) is None and rig.tables.bank.abs().sum() == 0  # both change with a step
    rig.step()
    tables, registry = rig.tables, rig.registry
    assert torch.equal(tables.bank[3], torch.from_numpy(row)) and torch.equal(tables.bank[5], -torch.from_numpy(row))
    assert registry.resolve("v", 1) == 2 and registry.resolve("w", 3) == 4 and registry.resolve("w", 1) is None
    assert registry.versions == {"v": 5, "w": 1}


def test_retirement_is_acked_only_with_current_refs(rig):
    """Invariant 6: the control API may reuse a slot only when acked with no request on it."""
    control = rig.control
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("r", _spec({"id": "v", "layer": 1}), 3)])
    control.retire(0)
    rig.idle()
    assert control.acked(0) and not control.reusable(0)  # acked, but a request still holds it
    rig.step()
    assert rig.registry.resolve("v", 1) is None  # no new request can bind it
    rig.step(finished=["r"])
    assert not control.reusable(0)  # until the mailbox thread publishes the references
    rig.idle()
    assert control.reusable(0)


def test_a_waiting_retirement_gets_the_references_without_waiting_for_a_heartbeat(rig):
    """While a slot is acked retiring, every period writes references a step changed: the
    control API reuses the slot within a period of its last request leaving, not a heartbeat."""
    control = rig.control
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("r", _spec({"id": "v", "layer": 1}), 3)])
    control.retire(0)
    rig.idle()
    rig.step(finished=["r"])
    rig.core.poll()  # a period without the heartbeat
    assert control.reusable(0)


def test_the_mailbox_thread_polls_references_while_a_retirement_waits(rig):
    """The thread itself, not only its period: while an acked retirement waits on a request, the
    thread wakes every POLL_S (no file write wakes it), so the control API sees the slot free
    within a few periods of the request leaving, well before the next heartbeat."""
    from hotwire.engine_plugin.core_sync import POLL_S

    control = rig.control
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("r", _spec({"id": "v", "layer": 1}), 3)])
    control.retire(0)
    rig.idle()  # acked retiring, the request still holds the slot
    rig.core._thread.start()
    try:
        time.sleep(HEARTBEAT_S + 0.05)  # the thread's heartbeat has passed: the next is HEARTBEAT_S away
        assert not control.reusable(0)
        left = time.monotonic()
        rig.core.on_schedule(Step([], {"r"}))  # the request leaves: the step thread, no period
        while not control.reusable(0):
            assert time.monotonic() - left < HEARTBEAT_S / 2, "the references waited for the heartbeat"
            time.sleep(POLL_S / 4)
    finally:
        rig.core.close()
        rig.core._thread.join(1)


def test_the_mailbox_thread_sleeps_until_the_file_is_written(rig, monkeypatch):
    """Each wake-up of the mailbox thread takes the GIL from vLLM's step thread: an idle mailbox
    wakes it for the heartbeat only (it woke every 20 ms to look), and a control write is taken
    in at once."""
    periods = []
    poll = rig.core.poll
    monkeypatch.setattr(rig.core, "poll", lambda beat=False: (periods.append(beat), poll(beat))[1])
    rig.core._thread.start()
    try:
        time.sleep(1.0)
        idle = len(periods)
        written = time.monotonic()
        rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
        while not rig.control.in_sync():
            assert time.monotonic() - written < 0.2, "a write waited for the heartbeat"
            time.sleep(0.001)
    finally:
        rig.core.close()
        rig.core._thread.join(1)
    assert rig.control.acked(0)
    assert 2 <= idle <= 2 / HEARTBEAT_S, f"{idle} periods in a second without a write"


def test_a_file_watch_wakes_on_another_writer_and_sleeps_otherwise(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"\0" * 16)
    watch = FileWatch.open(str(path))
    assert watch is not None
    try:
        assert not watch.wait(0.05) and not watch.drain()
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b"x", 3)
        os.close(fd)
        t = time.monotonic()
        assert watch.wait(5) and time.monotonic() - t < 1
        assert watch.drain() and not watch.wait(0.05)  # drained: asleep again
    finally:
        watch.close()


def test_a_slot_reused_at_once_is_rebound_with_the_next_step(rig):
    """Retired, acked with no reference, rewritten before any step ran: the rank sees only the
    new vector, and its row, at the next step."""
    control = rig.control
    control.write(0, "old", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step()
    control.retire(0)
    rig.idle()
    assert control.reusable(0)
    control.write(0, "new", ANY_LAYER, np.full(H, 2.0, np.float32), gen=1)
    rig.idle()
    rig.step()
    assert rig.registry.bound() == {("new", ANY_LAYER): 0} == rig.core.registry.bound()
    assert torch.equal(rig.tables.bank[1], torch.full((H,), 2.0))


def test_a_reused_slot_does_not_show_its_previous_occupants_last_use(rig):
    control = rig.control
    control.write(0, "old", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("r", _spec({"id": "old", "layer": 1}), 3)])
    rig.step(finished=["r"])
    rig.idle()
    assert int(control.engine["last_used_ns"][0]) > 0
    control.retire(0)
    rig.idle()
    control.write(0, "new", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.idle()
    rig.step()
    rig.idle()
    assert int(control.engine["last_used_ns"][0]) == 0  # "new" has not been used yet


def test_torn_entry_is_skipped_until_the_write_completes(rig):
    control = rig.control
    control.write(1, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    seq_at = control._dir_off + 96 * 1  # directory entry 1 starts with its seqlock word
    seq = int(control.directory["seq"][1])
    control._write(seq_at, (seq + 1).to_bytes(8, "little"))  # a writer is mid-way
    control._bump()
    rig.step()
    assert rig.registry.resolve("v", 1) is None and not control.in_sync()
    assert rig.counters.counts["mailbox_torn_reads"] == 1
    control._write(seq_at, (seq + 2).to_bytes(8, "little"))  # write completes
    rig.step()
    assert rig.registry.resolve("v", 1) == 1 and control.in_sync()


def _churn(rig: Rig, step: int, rng: np.random.Generator) -> Step:
    """One step of mailbox changes (writes, replaces, retirements) and request traffic."""
    slot = step % SLOTS
    if step % 3 == 2:
        rig.control.retire(slot)
    else:
        rig.control.write(slot, f"v{step % 4}", ANY_LAYER, rng.standard_normal(H).astype(np.float32), gen=step + 1)
    return Step([new_req(f"r{step}", _spec({"id": f"v{step % 4}", "layer": 1}))],
                {f"r{step - 2}"} if step >= 2 else set())


def _same(a, b) -> bool:
    ra, rb = a.router, b.router
    return (ra.active == rb.active
            and torch.equal(a.tables.bank, b.tables.bank) and torch.equal(a.tables.route, b.tables.route))


def test_every_rank_changes_at_the_same_step(tmp_path):
    """Invariant 9: two ranks fed the same steps hold the same bindings, rows and routes after
    every step, while the mailbox changes between and during them."""
    rig, other, rng = Rig(tmp_path), make_rank("cpu"), np.random.default_rng(0)
    for step in range(12):
        out = _churn(rig, step, rng)
        rig.core.poll()
        rig.core.on_schedule(out)
        for rank in (rig.rank, other):
            rank.on_schedule(out)
            rank.router.commit()
        assert _same(rig.rank, other), step
        assert rig.core.registry.inflight.tolist() == rig.registry.inflight.tolist()


def test_a_rank_a_step_late_is_caught(tmp_path):
    """The check above can fail: with the ordering broken on purpose (one rank applies each
    step's change a step late, as a rank reading the mailbox on its own clock could), the ranks
    disagree after some step."""
    rig, late, rng = Rig(tmp_path), make_rank("cpu"), np.random.default_rng(0)
    held, agreed = None, []
    for step in range(12):
        out = _churn(rig, step, rng)
        rig.core.poll()
        rig.core.on_schedule(out)
        rig.rank.on_schedule(out)
        skewed = Step(out.scheduled_new_reqs, out.finished_req_ids)
        skewed.hotwire, held = held, out.hotwire
        late.on_schedule(skewed)
        for rank in (rig.rank, late):
            rank.router.commit()
        agreed.append(_same(rig.rank, late))
    assert not all(agreed)



def test_a_rank_says_the_core_lacks_hotwire_only_on_a_step_that_brings_requests(caplog):
    """vLLM's V2 runner profiles and warms up through ``execute_model`` with an empty scheduler
    output, before the engine core's sync starts: no error then, and the first real step without
    a decision is still reported."""
    rank = make_rank("cpu")
    with caplog.at_level("ERROR", logger="vllm.hotwire"):
        rank.on_schedule(Step())  # a dummy run: no requests, no decision
        assert "did not load hotwire" not in caplog.text
        rank.on_schedule(Step([new_req("r", None)]))  # a real step, and the core attached nothing
    assert caplog.text.count("did not load hotwire") == 1


def test_a_rank_says_nothing_of_the_core_during_vllms_warm_up(caplog):
    """vLLM's V2 runner warms its kernels up with steps that bring requests of its own, inside the
    worker's ``compile_or_warm_up_model`` and before the engine core's sync starts: the hook on it
    (hooks._patch_worker) keeps the rank quiet then, and the rank still speaks after it."""
    from hotwire.engine_plugin import hooks

    rank = make_rank("cpu")

    class Worker:  # as vLLM's: the runner, whose Steerer hotwire attached at load_model
        model_runner = type("Runner", (), {})()

        def compile_or_warm_up_model(self):
            rank.on_schedule(Step([new_req("warm-up", None)]))  # vLLM's request; no decision: no sync yet
            return "compiled"

    Worker.model_runner._hotwire = rank
    hooks._patch_worker(Worker)
    with caplog.at_level("ERROR", logger="vllm.hotwire"):
        assert Worker().compile_or_warm_up_model() == "compiled"
        assert "did not load hotwire" not in caplog.text and not rank.warming
        rank.on_schedule(Step([new_req("r", None)]))  # served, and still no decision: the core lacks hotwire
    assert caplog.text.count("did not load hotwire") == 1


class _Held:
    """A lock the mailbox thread holds: entering it is a step thread waiting on that thread."""

    def __enter__(self):
        raise AssertionError("the step waited on the mailbox thread's lock")

    def __exit__(self, *exc):
        return False


def test_a_steady_step_decides_nothing_without_the_lock_and_a_queued_change_waits_one_step(rig):
    """Most decode steps bring no request, finish none and find no change queued: the core
    decides nothing and never waits on the mailbox thread's lock there; a change queued while
    such a step is decided binds with the next one, as one queued after the lock would."""
    rig.step(new=[("r", _spec({"id": "v", "scale": 1.0}))])
    lock, rig.core.lock = rig.core.lock, _Held()
    steady = Step()
    rig.core.on_schedule(steady)
    rig.core.lock = lock
    assert steady.hotwire.delta is None and steady.hotwire.admitted == ()
    rig.control.write(1, "w", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.idle()
    assert rig.registry.resolve("w", 1) is None  # queued, not yet bound
    changed = rig.step()  # no request came or went, but a change is queued: decided under the lock
    assert changed.hotwire.delta is not None and rig.registry.resolve("w", 1) == 1
