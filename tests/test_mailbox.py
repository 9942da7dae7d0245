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


def test_view_reads_generations_of_active_slots(tmp_path):
    path = str(tmp_path / "e.mbx")
    EngineMailbox.create(path, FP, n_slots=5)
    control = ControlMailbox.attach(path)
    control.write(0, "a", 1, np.zeros(8, np.float32), gen=3)
    control.write(1, "a", 2, np.zeros(8, np.float32), gen=4)
    control.write(2, "b", ANY_LAYER, np.zeros(8, np.float32), gen=1)
    control.retire(2)
    assert MailboxView.open(path).generations() == {"a": 4}


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
