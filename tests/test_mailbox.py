"""Mailbox file: creation, fingerprint, startup slots, read-only views, engine restarts."""

import numpy as np

from hotwire.shared.mailbox import (ACTIVE, ANY_LAYER, FLAG_PINNED, FLAG_STARTUP, ControlMailbox,
                                    EngineMailbox, Fingerprint, MailboxView, clock_ns, dp_mailbox_path,
                                    rank_mailboxes)

FP = Fingerprint("my/model", n_layers=4, hidden=8, dtype="bfloat16")


def test_control_side_sees_the_engines_fingerprint_and_startup_slots(tmp_path):
    path = str(tmp_path / "e.mbx")
    engine = EngineMailbox.create(path, FP, n_slots=5)
    engine.publish_startup(0, "boot", ANY_LAYER, np.full(8, 2.0, np.float32))
    engine.set_armed([1, 2], entries=4)
    control = ControlMailbox.attach(path)
    assert control.fingerprint == FP and control.armed_layers() == [1, 2] and control.epoch == engine.epoch
    e = control.read_entry(0, with_row=True)
    assert (e.vector_id, e.state, e.layer) == ("boot", ACTIVE, ANY_LAYER)
    assert e.flags == FLAG_PINNED | FLAG_STARTUP and control.acked(0)
    np.testing.assert_array_equal(e.row, np.full(8, 2.0))


def test_each_dp_rank_has_its_own_mailbox_beside_rank_0s(tmp_path):
    base = tmp_path / "engine.mbx"
    assert dp_mailbox_path(str(base), 0) == str(base)
    assert dp_mailbox_path(str(base), 3) == f"{base}.dp3"
    assert rank_mailboxes(base) == {0: base}
    for name in ("engine.mbx.dp1", "engine.mbx.dp12", "engine.mbx.dp0", "engine.mbx.dp1.77.tmp",
                 "engine.mbx.dpx", "other.mbx.dp2", "engine.mbx.dp01"):
        (tmp_path / name).touch()
    assert rank_mailboxes(str(base)) == {0: base, 1: tmp_path / "engine.mbx.dp1",
                                         12: tmp_path / "engine.mbx.dp12"}


def test_the_engine_keeps_a_version_of_each_acked_vector_that_no_later_write_repeats(tmp_path):
    path = str(tmp_path / "e.mbx")
    engine = EngineMailbox.create(path, FP, n_slots=5)
    control = ControlMailbox.attach(path)

    def taken_in() -> dict[str, str]:
        for e in engine.pending()[1]:
            engine.ack(e)
        return engine.versions()

    control.write(0, "a", 1, np.zeros(8, np.float32), gen=3)
    control.write(1, "a", 2, np.zeros(8, np.float32), gen=4)
    control.write(2, "b", ANY_LAYER, np.zeros(8, np.float32), gen=1)
    assert set(engine.versions()) == set()  # written, not yet acked
    control.retire(2)
    first = taken_in()
    assert set(first) == {"a"} and first["a"].startswith(f"{engine.epoch:x}/")
    seen = {first["a"]}
    control.retire(0)
    control.retire(1)
    assert taken_in() == {}
    # a control API with a fresh catalog pushes "a" again: generation 1, the same slots
    fresh = ControlMailbox.attach(path)
    fresh.write(0, "a", 1, np.zeros(8, np.float32), gen=1)
    fresh.write(1, "a", 2, np.zeros(8, np.float32), gen=1)
    again = taken_in()["a"]
    assert again not in seen
    seen.add(again)
    fresh.write(1, "a", 2, np.ones(8, np.float32), gen=2)  # one layer's row replaced
    assert taken_in()["a"] not in seen


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
from hotwire.shared.mailbox import DIRECTORY, FREE, LAYOUT, MailboxError  # noqa: E402


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
    rig.step(new=[("r", {"hotwire": '{"id": "v", "layer": 1}'}, 3)])
    rig.idle()  # the heartbeat writes the references and counters: the file is found short
    assert "r" in rig.router.active  # still steering with what it holds
    assert rig.core.broken is not None and rig.counters.counts["mailbox_errors"] == 1
    rig.step(finished=["r"])  # no exception: the sync has stopped
    rig.idle()
    assert rig.control.replaced() and os.path.getsize(path) == size  # nothing wrote past the end
    with pytest.raises(MailboxError):
        rig.control.heartbeat_age_s() if size < 4096 else rig.control.directory
    with pytest.raises(MailboxError):
        ControlMailbox.attach(str(path))


# -- the directory is not trusted ----------------------------------------------------------------

import contextlib  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from hotwire.shared import mailbox as mailbox_module  # noqa: E402

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes files of other users (os.chown)")
NOBODY = 65534  # a uid and gid that are not this process's


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root only")
    victim.chmod(0o600)
    return victim


def _unchanged(victim) -> bool:
    return victim.read_bytes() == b"root only" and victim.stat().st_mode & 0o777 == 0o600


def test_a_link_planted_where_a_temporary_file_could_be_is_not_followed(tmp_path):
    path = tmp_path / "e.mbx"
    victim = _victim(tmp_path)
    planted = tmp_path / f"e.mbx.{os.getpid()}.tmp"  # a name a creator could have used
    planted.symlink_to(victim)
    EngineMailbox.create(str(path), FP, n_slots=5)
    assert _unchanged(victim) and planted.is_symlink()
    assert not path.is_symlink() and ControlMailbox.attach(str(path)).fingerprint == FP


def test_the_temporary_file_is_created_exclusively(tmp_path, monkeypatch):
    """Even at a name someone guessed, the engine opens nothing that was there before."""
    victim = _victim(tmp_path)
    (tmp_path / "e.mbx.guessed.tmp").symlink_to(victim)
    monkeypatch.setattr(mailbox_module.secrets, "token_hex", lambda n: "guessed")
    with pytest.raises(MailboxError, match="HOTWIRE_MAILBOX"):
        EngineMailbox.create(str(tmp_path / "e.mbx"), FP, n_slots=5)
    assert _unchanged(victim) and not (tmp_path / "e.mbx").exists()


@as_root
@pytest.mark.parametrize("mode", [0o755, 0o777, 0o1777])
def test_a_directory_another_user_owns_is_refused(tmp_path, mode):
    directory = tmp_path / "hotwire"
    directory.mkdir()
    os.chown(directory, NOBODY, NOBODY)
    directory.chmod(mode)
    with pytest.raises(MailboxError, match=f"belongs to uid {NOBODY}.*HOTWIRE_MAILBOX"):
        EngineMailbox.create(str(directory / "e.mbx"), FP, n_slots=5)
    assert list(directory.iterdir()) == []


def test_a_directory_of_its_own_that_everyone_can_write_is_made_sticky(tmp_path):
    """As a kubelet emptyDir is made (0777): no one else may then rename or remove its files."""
    directory = tmp_path / "hotwire"
    directory.mkdir()
    directory.chmod(0o2777)
    EngineMailbox.create(str(directory / "e.mbx"), FP, n_slots=5)
    assert directory.stat().st_mode & 0o7777 == 0o3777
    assert ControlMailbox.attach(str(directory / "e.mbx")).fingerprint == FP


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("umask", [0o000, 0o077])
@pytest.mark.parametrize("group", [None, NOBODY])
def test_modes_are_set_whatever_the_umask(tmp_path, umask, group):
    if group is not None and os.geteuid() != 0:
        pytest.skip("gives files a group this user is not in (os.chown)")
    path = tmp_path / "run" / "hotwire" / "e.mbx"
    with _umask(umask):
        EngineMailbox.create(str(path), FP, n_slots=5, group=group)
    assert (tmp_path / "run").stat().st_mode & 0o7777 == 0o755
    made = path.parent.stat()
    assert made.st_mode & 0o7777 == (0o700 if group is None else 0o750)
    assert os.stat(path).st_mode & 0o7777 == 0o660
    if group is not None:
        assert made.st_gid == group and os.stat(path).st_gid == group
    assert sorted(p.name for p in path.parent.iterdir()) == ["e.mbx"]  # no temporary file left


def test_readers_refuse_a_link_at_the_mailbox_path(tmp_path):
    EngineMailbox.create(str(tmp_path / "real.mbx"), FP, n_slots=5)
    (tmp_path / "e.mbx").symlink_to(tmp_path / "real.mbx")
    with pytest.raises(MailboxError, match="symbolic link"):
        ControlMailbox.attach(str(tmp_path / "e.mbx"))
    with pytest.raises(MailboxError, match="symbolic link"):
        MailboxView.open(str(tmp_path / "e.mbx"))


@pytest.mark.timeout(60)  # without O_NONBLOCK the open waits for a writer forever
def test_readers_refuse_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "e.mbx")  # opening a FIFO for reading would wait for a writer
    with pytest.raises(MailboxError, match="not a regular file"):
        MailboxView.open(str(tmp_path / "e.mbx"))


def test_readers_refuse_a_directory_everyone_can_rearrange(tmp_path):
    directory = tmp_path / "shared"
    directory.mkdir()
    EngineMailbox.create(str(directory / "e.mbx"), FP, n_slots=5)
    directory.chmod(0o777)  # not sticky: anyone may have renamed their own file onto the path
    with pytest.raises(MailboxError, match="writable by every user and not sticky"):
        ControlMailbox.attach(str(directory / "e.mbx"))
    directory.chmod(0o1777)
    assert ControlMailbox.attach(str(directory / "e.mbx")).fingerprint == FP


@as_root
def test_readers_refuse_a_mailbox_planted_by_another_user(tmp_path):
    """A user who is neither this one, root, nor the directory's owner made the file."""
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o1777)
    directory.chmod(0o1777)
    EngineMailbox.create(str(directory / "e.mbx"), FP, n_slots=5)
    os.chown(directory / "e.mbx", NOBODY, NOBODY)
    with pytest.raises(MailboxError, match=f"owned by uid {NOBODY}, who does not own its directory"):
        ControlMailbox.attach(str(directory / "e.mbx"))


def _as_user(uid: int, groups: list[int], fn) -> str:
    """``fn()`` in a child process running as ``uid`` in ``groups``: "ok" or its MailboxError."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups(groups)
            os.setgid(groups[0])
            os.setuid(uid)
            try:
                fn()
                answer = "ok"
            except (MailboxError, OSError) as e:
                answer = str(e)
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    return answer


@pytest.fixture
def open_dir():
    """A directory every user may traverse (pytest's own are private to this user)."""
    path = tempfile.mkdtemp(prefix="hotwire-mailbox-")
    os.chmod(path, 0o755)
    yield Path(path)
    shutil.rmtree(path)


@as_root
def test_a_control_api_in_the_engines_group_attaches_and_a_stranger_is_refused(open_dir):
    """The deployments of docker-compose.yml and deploy/k8s: the engine and its control API are
    different users, the control API in the mailbox's group (HOTWIRE_MAILBOX_GROUP)."""
    engine_uid, group, control_uid, stranger = 10101, 10102, 10103, 10104
    shm = open_dir / "shm"  # as /dev/shm: every user's, sticky
    shm.mkdir()
    shm.chmod(0o1777)
    path = shm / "hotwire" / "e.mbx"

    def make(at):
        return lambda: EngineMailbox.create(str(at), FP, n_slots=5, group=group)

    def attach(at):
        return lambda: ControlMailbox.attach(str(at))

    assert _as_user(engine_uid, [engine_uid, group], make(path)) == "ok"
    assert _as_user(control_uid, [group], attach(path)) == "ok"
    assert "Permission denied" in _as_user(stranger, [stranger], attach(path))
    planted = shm / "e.mbx"  # a mailbox straight in the shared directory, by someone in the group
    assert _as_user(stranger, [stranger, group], make(planted)) == "ok"
    answer = _as_user(control_uid, [group], attach(planted))
    assert f"owned by uid {stranger}, who does not own its directory" in answer


# -- one engine per mailbox ----------------------------------------------------------------------

ENGINE_ELSEWHERE = """
import sys, time
from hotwire.shared.mailbox import EngineMailbox, Fingerprint, clock_ns
box = EngineMailbox.create(sys.argv[1], Fingerprint("other/model", 4, 8, "bfloat16"), 5)
box.beat(clock_ns() - int(sys.argv[2]) * 10**9)
print("up", flush=True)
while sys.argv[2] == "0":
    box.beat()
    time.sleep(0.1)
"""


def _engine_elsewhere(path, beat_s_ago: int = 0) -> subprocess.Popen:
    """Another engine process with a mailbox at ``path``: beating (``beat_s_ago`` 0), or gone
    after one beat that long ago."""
    proc = subprocess.Popen([sys.executable, "-c", ENGINE_ELSEWHERE, str(path), str(beat_s_ago)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def _set_header(path, **fields) -> None:
    with open(path, "r+b") as f:
        for name, value in fields.items():
            dtype, offset = mailbox_module.HEADER.fields[name][:2]
            f.seek(offset)
            f.write(np.asarray(value, dtype=dtype).tobytes())


def test_a_mailbox_another_live_engine_beats_is_refused(tmp_path):
    path = tmp_path / "e.mbx"
    other = _engine_elsewhere(path)
    try:
        with pytest.raises(MailboxError, match=rf"another running engine \(pid {other.pid}, .*"
                                               r"its own HOTWIRE_MAILBOX"):
            EngineMailbox.create(str(path), FP, n_slots=5)
        assert MailboxView.open(str(path)).fingerprint.model == "other/model"  # left alone
    finally:
        other.kill()
        other.wait()


def test_a_mailbox_of_another_layout_is_refused_naming_both_layouts(tmp_path):
    """An engine and a control API (or API server) of different hotwire versions: said plainly."""
    path = tmp_path / "e.mbx"
    EngineMailbox.create(str(path), FP, n_slots=5)
    _set_header(path, layout=LAYOUT - 1)
    with pytest.raises(MailboxError, match=rf"layout {LAYOUT - 1}, this hotwire reads layout {LAYOUT}"):
        MailboxView.open(str(path))


def test_a_step_of_the_wall_clock_neither_silences_a_live_engine_nor_revives_a_dead_one(tmp_path, monkeypatch):
    """NTP or an operator may step the wall clock by minutes while an engine serves: its
    heartbeat's age, which readiness and every push's wait go by, must not move with it."""
    path = tmp_path / "e.mbx"
    engine = EngineMailbox.create(str(path), FP, n_slots=5)
    engine.beat()
    control = ControlMailbox.attach(str(path))
    wall = time.time_ns()
    for step_s in (3600, -3600):
        monkeypatch.setattr(time, "time_ns", lambda: wall + step_s * 10**9)
        assert control.heartbeat_age_s() < 1.0
    engine.beat(at_ns=clock_ns() - 60 * 10**9)  # an engine that stopped beating a minute ago
    monkeypatch.setattr(time, "time_ns", lambda: wall - 3600 * 10**9)
    assert control.heartbeat_age_s() > 59


def test_the_mailbox_of_an_engine_that_stopped_beating_is_replaced(tmp_path):
    """An engine restarting: its predecessor's heartbeat is old (its pid may even be reused)."""
    path = tmp_path / "e.mbx"
    _engine_elsewhere(path, beat_s_ago=60).wait()
    EngineMailbox.create(str(path), FP, n_slots=5)
    assert MailboxView.open(str(path)).fingerprint == FP


def test_a_fresh_mailbox_with_this_pid_but_not_made_here_is_refused(tmp_path):
    """Engines in two containers sharing the directory may both be pid 1: the pid alone does not
    make a mailbox this process's own."""
    path = tmp_path / "e.mbx"
    _engine_elsewhere(path, beat_s_ago=60).wait()
    _set_header(path, engine_pid=os.getpid(), heartbeat_ns=clock_ns())
    with pytest.raises(MailboxError, match="another running engine"):
        EngineMailbox.create(str(path), FP, n_slots=5)


def test_an_engine_core_that_cannot_create_its_mailbox_serves_without_registration(tmp_path, caplog):
    from types import SimpleNamespace

    from hotwire.engine_plugin.config import HotwireConfig
    from hotwire.engine_plugin.core_sync import CoreSync

    path = tmp_path / "e.mbx"
    other = _engine_elsewhere(path)
    try:
        cfg = HotwireConfig(mailbox=str(path))
        vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=0))
        assert CoreSync._open_mailbox(cfg, vllm_config, FP, [1], []) is None
    finally:
        other.kill()
        other.wait()
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "another running engine" in line and "HOTWIRE_MAILBOX" in line
    assert "runtime registration is off" in line
