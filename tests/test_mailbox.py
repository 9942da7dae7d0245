"""Mailbox file: creation, fingerprint, startup slots, read-only views, engine restarts."""

import numpy as np

from hotwire.shared.mailbox import (ACTIVE, ANY_LAYER, FLAG_PINNED, FLAG_STARTUP, ControlMailbox,
                                    EngineMailbox, Fingerprint, MailboxView)

FP = Fingerprint("my/model", n_layers=4, hidden=8, dtype="bfloat16")


def test_control_side_sees_the_engines_fingerprint_and_startup_slots(tmp_path):
    path = str(tmp_path / "e.mbx")
    engine = EngineMailbox.create(path, FP, n_slots=5)
    engine.publish_startup(0, "boot", ANY_LAYER, np.full(8, 2.0, np.float32))
    engine.set_armed([1, 2])
    control = ControlMailbox.attach(path)
    assert control.fingerprint == FP and control.armed_layers() == [1, 2] and control.epoch == engine.epoch
    e = control.read_entry(0, with_row=True)
    assert (e.vector_id, e.state, e.layer) == ("boot", ACTIVE, ANY_LAYER)
    assert e.flags == FLAG_PINNED | FLAG_STARTUP and control.acked(0)
    np.testing.assert_array_equal(e.row, np.full(8, 2.0))


def test_view_reads_a_version_of_each_active_vector_that_no_later_write_repeats(tmp_path):
    path = str(tmp_path / "e.mbx")
    EngineMailbox.create(path, FP, n_slots=5)
    control = ControlMailbox.attach(path)
    control.write(0, "a", 1, np.zeros(8, np.float32), gen=3)
    control.write(1, "a", 2, np.zeros(8, np.float32), gen=4)
    control.write(2, "b", ANY_LAYER, np.zeros(8, np.float32), gen=1)
    control.retire(2)
    view = MailboxView.open(path)
    first = view.versions()
    assert set(first) == {"a"} and first["a"].startswith(f"{view.epoch:x}/")
    seen = {first["a"]}
    control.retire(0)
    control.retire(1)
    # a control API with a fresh catalog pushes "a" again: generation 1, the same slots
    fresh = ControlMailbox.attach(path)
    fresh.write(0, "a", 1, np.zeros(8, np.float32), gen=1)
    fresh.write(1, "a", 2, np.zeros(8, np.float32), gen=1)
    again = view.versions()["a"]
    assert again not in seen
    seen.add(again)
    fresh.write(1, "a", 2, np.ones(8, np.float32), gen=2)  # one layer's row replaced
    assert view.versions()["a"] not in seen


def test_engine_restart_replaces_the_file_with_a_new_epoch(tmp_path):
    path = str(tmp_path / "e.mbx")
    first = EngineMailbox.create(path, FP, n_slots=5)
    control = ControlMailbox.attach(path)
    control.write(0, "a", 1, np.ones(8, np.float32), gen=1)
    assert not control.replaced()
    second = EngineMailbox.create(path, FP, n_slots=5)
    assert control.replaced() and second.epoch != first.epoch
    fresh = ControlMailbox.attach(path)
    assert fresh.read_entry(0, with_row=False).vector_id == "" and int(fresh.header["target_gen"]) == 0


# -- a corrupt or shrinking file (invariant 8) -------------------------------------------------

import os  # noqa: E402

import pytest  # noqa: E402

from engine_rig import Rig  # noqa: E402
from hotwire.shared.mailbox import DIRECTORY, FREE, MailboxError  # noqa: E402


def test_the_file_is_created_for_owner_and_group_only(tmp_path):
    Rig(tmp_path)
    assert os.stat(tmp_path / "e.mbx").st_mode & 0o777 == 0o660


def _scribble(path, slot: int, data: bytes) -> None:
    """What any local writer of the file can do."""
    with open(path, "r+b") as f:
        f.seek(4096 + DIRECTORY.itemsize * slot)
        f.write(data)


@pytest.mark.parametrize("garbage", [
    b"\xfe" * DIRECTORY.itemsize,  # even seqlock, unknown state, undecodable id
    (2).to_bytes(8, "little") + (1).to_bytes(8, "little") + (7).to_bytes(4, "little") + bytes(76),
])
def test_garbage_in_the_directory_is_rejected_not_obeyed(tmp_path, garbage):
    rig = Rig(tmp_path)
    rig.control.write(0, "good", ANY_LAYER, np.ones(8, np.float32), gen=1)
    _scribble(tmp_path / "e.mbx", 1, garbage)
    rig.control._bump()
    rig.step()
    assert rig.registry.bound() == {("good", ANY_LAYER): 0}
    assert rig.counters.counts["mailbox_rejected"] == 1 and rig.core.broken is None
    assert int(rig.control.engine["state"][1]) == FREE and rig.control.acked(1)  # acked as holding nothing


def test_a_seqlock_left_odd_is_rejected_once_it_is_stuck(tmp_path, monkeypatch):
    rig = Rig(tmp_path)
    _scribble(tmp_path / "e.mbx", 3, b"\xff" * DIRECTORY.itemsize)  # odd seq: a write in progress, forever
    rig.control._bump()
    rig.step()
    assert rig.counters.counts["mailbox_torn_reads"] == 1 and rig.counters.counts["mailbox_rejected"] == 0
    monkeypatch.setattr("hotwire.shared.mailbox.STUCK_S", 0.0)
    rig.step()
    assert rig.counters.counts["mailbox_rejected"] == 1 and rig.control.in_sync()


@pytest.mark.parametrize("field,value,why", [
    ("vector_id", b"c" * 63 + b"\n", "not valid"),
    ("layer", 99, "outside"),
    ("gen", 0, "not positive"),
])
def test_entries_that_break_the_contract_are_rejected(tmp_path, field, value, why, caplog):
    rig = Rig(tmp_path)
    rig.control.write(2, "v", 1, np.ones(8, np.float32), gen=1)
    entry = rig.control._entry(2)
    entry[field] = value
    rig.control._write_entry(2, entry, None)
    rig.control._bump()
    rig.step()
    assert rig.registry.bound() == {} and rig.counters.counts["mailbox_rejected"] == 1
    assert why in caplog.text


def test_a_row_that_is_not_finite_is_rejected(tmp_path):
    rig = Rig(tmp_path)
    row = np.ones(8, np.float32)
    row[3] = np.inf
    rig.control.write(0, "v", ANY_LAYER, row, gen=1)
    rig.step()
    assert rig.registry.bound() == {} and rig.counters.counts["mailbox_rejected"] == 1


@pytest.mark.parametrize("size", [0, 4096, 4096 + 100])
def test_a_truncated_file_stops_the_sync_and_kills_no_one(tmp_path, size):
    """A mapped file that shrinks raises SIGBUS on access (this process would die); read with
    pread, it is a short read: the engine keeps its vectors, the control side gets an error."""
    rig = Rig(tmp_path)
    path = tmp_path / "e.mbx"
    rig.control.write(0, "v", ANY_LAYER, np.ones(8, np.float32), gen=1)
    rig.step()
    os.truncate(path, size)
    rig.step(new=[("r", {"hotwire": '{"id": "v", "layer": 1}'}, 3)])  # refs change: a publish
    assert "r" in rig.router.active  # still steering with what it holds
    assert rig.core.broken is not None and rig.counters.counts["mailbox_errors"] == 1
    rig.step(finished=["r"])  # no exception: the sync has stopped
    with rig.core.lock:
        rig.core.apply()
    assert rig.control.replaced() and os.path.getsize(path) == size  # nothing wrote past the end
    with pytest.raises(MailboxError):
        rig.control.heartbeat_age_s() if size < 4096 else rig.control.directory
    with pytest.raises(MailboxError):
        ControlMailbox.attach(str(path))
