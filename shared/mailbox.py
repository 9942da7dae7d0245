"""Shared-memory mailbox between the control API (writer) and one engine (reader).

State-based, not message-based: the file *is* the desired slot table. The engine creates it at
start (fingerprinted with its model), the control API attaches and writes slots; the engine
applies whatever differs from what it last applied, at a step boundary, and publishes its acks,
per-slot in-flight references, a heartbeat and counters. Restarting either side is therefore
idempotent: the control API re-reads the table, the engine re-creates it (new ``epoch``) and the
control API pushes its catalog again.

Layout (little endian; a file in a tmpfs such as /dev/shm)::

    [0, 4096)              header          HEADER dtype
    [4096, +96*S)          directory       DIRECTORY dtype, written by the control API
    [.., +32*S)            engine table    ENGINE dtype, written by the engine
    [64-aligned, +4*S*H)   rows            float32 [S, H], written by the control API

Access: ``pread``/``pwrite`` on a file descriptor, never a memory map. A mapped file that
another process truncates raises SIGBUS on the next access and kills the process; a read of a
truncated file is merely short, and becomes a :class:`MailboxError`. Each side keeps what only it
writes (the engine its table and counters) in memory and writes it out; everything read is a
copy, and everything the engine reads is validated before it is applied (invariant 8): a corrupt
entry is rejected, counted and acknowledged as free, never obeyed.

Consistency: each directory entry carries a seqlock ``seq``. A writer makes it odd, writes the
entry and its row, makes it even again, then bumps ``header.target_gen``. A reader copies entry
and row and keeps the copy only if ``seq`` was even and unchanged around the copy, so it never
applies a half-written row. Each ``pwrite`` is a system call, so the writes are seen in order.

Permissions and trust: the file is created ``0660`` (owner and group), optionally chowned to a
group (``HOTWIRE_MAILBOX_GROUP``): the control API must run as the engine's user or in that
group. Whoever can replace the file can feed either side, so neither trusts the directory blindly.
The engine makes a missing directory ``0700`` (``0750`` and the group's with a group) whatever the
umask, refuses one that another user owns, gives one of its own that every user can write the
sticky bit (a kubelet ``emptyDir`` may be ``0777``: no one else can then rename or remove its
files), and writes the file under a random name opened with ``O_EXCL | O_NOFOLLOW`` before
renaming it into place. Every reader opens the file with ``O_NOFOLLOW`` and refuses anything but
a regular file that is owned by its user or root in a directory its user or root owns, or, for a
reader in the engine's group, owned by the directory's owner (the engine, which made it).

One engine per file: :meth:`EngineMailbox.create` refuses a path whose mailbox another engine
still beats (a heartbeat under :data:`LIVE_S` old, written by a process other than this one), so
two engines on one host left on the default path fail loudly instead of sharing a slot table. The
heartbeat, not the pid, says who is alive: engines in containers sharing the directory may have
the same pid (each its namespace's 1), and a pid seen from another namespace proves nothing.

Slot life cycle (invariant 6, two-phase eviction)::

    FREE --write--> ACTIVE --retire--> RETIRING --engine ack + inflight==0--> reusable

The engine stops binding new requests to a RETIRING slot when it applies it and acks it by
publishing ``applied_seq == seq``. The control API reuses a slot only once it is acked and its
``inflight`` count is zero; the GPU row is overwritten on the compute stream, after any step
that could still read it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .engine_counters import ENGINE_COUNTERS
from .spec import valid_id
from .wire import ModelShape, dtype_max

DEFAULT_MAILBOX = "/dev/shm/hotwire/engine.mbx"  # where the engine creates it, and the control API looks
MAGIC = b"HOTWIRE\x01"
LAYOUT = 2  # 2: the engine publishes its projection layers and entries per layer
HEADER_BYTES = 4096

FREE, ACTIVE, RETIRING = 0, 1, 2
STATE_NAMES = {FREE: "free", ACTIVE: "active", RETIRING: "retiring"}
FLAG_PINNED = 1  # never evicted
FLAG_STARTUP = 2  # loaded by the engine from HOTWIRE_VECTORS; the control API leaves it alone
ANY_LAYER = -1  # a (hidden,) vector: the same row serves every layer
LAYER_ARMED, LAYER_PROJECTING = 1, 2  # bits of the header's per-layer byte

# Engine counters, by index into header["counters"] (declared in .engine_counters).
COUNTERS = tuple(c.name for c in ENGINE_COUNTERS)
COUNTER_INDEX = {name: i for i, name in enumerate(COUNTERS)}

HEADER = np.dtype([
    ("magic", "S8"), ("layout", "<u4"), ("n_slots", "<u4"),
    ("hidden", "<u4"), ("n_layers", "<u4"), ("dtype", "S16"), ("model", "S256"),
    ("epoch", "<u8"),  # random per engine start: a change means "push everything again"
    ("engine_pid", "<u4"), ("armed_count", "<u4"),
    ("target_gen", "<u8"),  # control API: bumped after every directory write
    ("applied_gen", "<u8"),  # engine: last target_gen fully applied
    ("heartbeat_ns", "<u8"),  # engine: clock_ns() of its last sign of life
    ("counters", "<u8", (32,)),
    ("armed", "u1", (512,)),  # engine: per decoder layer index, LAYER_ARMED | LAYER_PROJECTING
    ("entries", "<u4"),  # engine: entries a request may have per layer (HOTWIRE_ENTRIES)
])
DIRECTORY = np.dtype([
    ("seq", "<u8"), ("gen", "<u8"), ("state", "<u4"), ("layer", "<i4"),
    ("flags", "<u4"), ("_pad", "<u4"), ("vector_id", "S64"),
])
ENGINE = np.dtype([
    ("applied_seq", "<u8"), ("inflight", "<u4"), ("state", "<u4"), ("last_used_ns", "<u8"),
    ("_pad", "<u8"),
])
assert HEADER.itemsize <= HEADER_BYTES and DIRECTORY.itemsize == 96 and ENGINE.itemsize == 32
MAX_SLOTS, MAX_HIDDEN = 1 << 20, 1 << 16  # bounds on what a header may claim
STUCK_S = 1.0  # a seqlock held odd this long is a corrupt entry, not a write in progress
FILE_MODE = 0o660
DIR_MODE, GROUP_DIR_MODE = 0o700, 0o750  # a mailbox directory the engine makes: its own, or its group's too
HEARTBEAT_S = 0.25  # the engine beats this often (its mailbox thread, engine_plugin.core_sync)
QUIET_S = 4 * HEARTBEAT_S  # a heartbeat this old: the engine takes no write in now (4 beats missed)
LIVE_S = 5.0  # a mailbox beaten this recently has a live engine
_OWN_EPOCHS: set[int] = set()  # the epochs of the mailboxes this process created: its own to replace


def clock_ns() -> int:
    """The heartbeat's clock: ``CLOCK_MONOTONIC``, which every process on a host shares (a mailbox
    is a file on the host of its engine) and which a step of the wall clock (NTP, an operator) does
    not move, so a live engine never looks silent, nor a dead one alive, for one."""
    return time.monotonic_ns()


def dp_mailbox_path(base: str, dp_rank: int) -> str:
    """The mailbox of data-parallel rank ``dp_rank``: one per engine core, so rank 0 (and an
    engine without DP) has ``base`` itself and rank N has ``<base>.dpN``."""
    return base if dp_rank == 0 else f"{base}.dp{dp_rank}"


def rank_mailboxes(base: str | os.PathLike[str]) -> dict[int, Path]:
    """The mailbox of every data-parallel rank there is now, by rank: rank 0's (``base``,
    whether it exists yet or not), then each :func:`dp_mailbox_path` of a rank N > 0 that
    exists."""
    base = Path(base)
    found = {0: base}
    pattern = re.compile(re.escape(base.name) + r"\.dp([1-9][0-9]*)")
    try:
        names = [p.name for p in base.parent.iterdir()]
    except OSError:
        return found
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            found[int(match.group(1))] = base.parent / name
    return dict(sorted(found.items()))


class MailboxError(RuntimeError):
    pass


@dataclass(frozen=True)
class Fingerprint:
    """The engine's model, as the mailbox advertises it."""

    model: str
    n_layers: int
    hidden: int
    dtype: str

    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.n_layers, self.hidden, self.dtype)


@dataclass(frozen=True)
class SlotEntry:
    """A consistent copy of one directory entry (and its row, for ACTIVE slots).

    ``problem`` says why the entry cannot be applied (set by :meth:`EngineMailbox.pending`).
    """

    slot: int
    seq: int
    gen: int
    state: int
    layer: int
    flags: int
    vector_id: str
    row: np.ndarray | None
    problem: str | None = None


def _sizes(n_slots: int, hidden: int) -> tuple[int, int, int, int]:
    dir_off = HEADER_BYTES
    eng_off = dir_off + DIRECTORY.itemsize * n_slots
    rows_off = -(-(eng_off + ENGINE.itemsize * n_slots) // 64) * 64
    return dir_off, eng_off, rows_off, rows_off + 4 * n_slots * hidden


def _field(name: str) -> tuple[int, np.dtype]:
    """Offset and dtype of a header field."""
    dtype, offset = HEADER.fields[name][:2]
    return offset, dtype


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def entry_problem(e: SlotEntry, n_layers: int, dtype: str) -> str | None:
    """Why the engine must not apply ``e``, or None. Everything a corrupt file could say."""
    if e.state not in STATE_NAMES:
        return f"unknown state {e.state}"
    if e.state == FREE:
        return None
    if not valid_id(e.vector_id):
        return f"vector id {e.vector_id[:80]!r} is not valid"
    if e.layer != ANY_LAYER and not 0 <= e.layer < n_layers:
        return f"layer {e.layer} is outside the model's 0..{n_layers - 1}"
    if e.state == ACTIVE:
        if e.gen < 1:
            return f"generation {e.gen} is not positive"
        if e.row is None or not np.isfinite(e.row).all():
            return "row holds NaN or infinite values"
        if np.abs(e.row).max(initial=0.0) > dtype_max(dtype):
            return f"row overflows the model dtype {dtype}"
    return None


def _open_flags(writable: bool) -> int:
    """Never through a link; ``O_NONBLOCK``: a FIFO planted at the path cannot hang the open."""
    return ((os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
            | os.O_CLOEXEC)


def _everyone_writes(st: os.stat_result) -> bool:
    """Any user can rename or remove entries of this directory (world-writable, not sticky)."""
    return bool(st.st_mode & stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX


def _untrusted(file: os.stat_result, directory: os.stat_result) -> str | None:
    """Why a reader must not take this file for its engine's mailbox, or None.

    Trusted: a regular file nobody else may write, in a directory nobody else may rearrange,
    owned by this process's user or root (in a directory one of those owns) or, for a reader that
    reaches it through its group, by the user who owns the directory: the engine made both.
    """
    me = os.geteuid()
    if not stat.S_ISREG(file.st_mode):
        return "not a regular file"
    if _everyone_writes(directory):
        return "its directory is writable by every user and not sticky, so anyone could have put it there"
    if file.st_mode & stat.S_IWOTH:
        return "writable by every user"
    if file.st_uid in (me, 0):
        if directory.st_uid not in (me, 0):
            return f"its directory belongs to uid {directory.st_uid}, who could replace it"
    elif file.st_uid != directory.st_uid:
        return (f"owned by uid {file.st_uid}, who does not own its directory (uid "
                f"{directory.st_uid}): a file any user could have put there")
    elif me != 0 and file.st_gid not in {os.getegid(), *os.getgroups()}:
        return f"owned by uid {file.st_uid} and not shared with this user's groups"
    return None


def _engine_dir(directory: str, group: int | None) -> int:
    """A descriptor of the engine's mailbox directory: made when missing (its mode set whatever
    the umask), else checked; :class:`MailboxError` when another user could rearrange it."""
    mode = DIR_MODE if group is None else GROUP_DIR_MODE
    parent = os.path.dirname(directory)
    if not os.path.isdir(parent):
        _make_parents(parent)
    try:
        os.mkdir(directory, mode)
        made = True
    except FileExistsError:
        made = False
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if made:
            if group is not None:
                os.fchown(fd, -1, group)
            os.fchmod(fd, mode)
        else:
            _check_engine_dir(fd, directory)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_parents(directory: str) -> None:
    """``directory`` and what is missing above it, each ``0755`` whatever the umask."""
    parent = os.path.dirname(directory)
    if not os.path.isdir(parent):
        _make_parents(parent)
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        return
    os.chmod(directory, 0o755)


def _check_engine_dir(fd: int, directory: str) -> None:
    """An existing directory: this user's or root's; one of this user's that every user may write
    gets the sticky bit, so no one else can rename or remove the engine's files in it."""
    st, me = os.fstat(fd), os.geteuid()
    if st.st_uid not in (me, 0):
        raise MailboxError(f"the mailbox directory {directory} belongs to uid {st.st_uid}, not to this "
                           f"engine's user (uid {me}), and its owner could replace the mailbox: remove "
                           "it or set HOTWIRE_MAILBOX to a path in a directory of this user's")
    if _everyone_writes(st):
        if st.st_uid != me:
            raise MailboxError(f"the mailbox directory {directory} is writable by every user and not "
                               "sticky: set HOTWIRE_MAILBOX to a path in a directory of this user's")
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_ISVTX)


def _live_engine(dir_fd: int, name: str) -> str | None:
    """Who else is beating the mailbox ``name`` (``"pid N, heartbeat S s ago"``), or None: no
    file, not a mailbox, this process's own, or a heartbeat older than :data:`LIVE_S`."""
    try:
        fd = os.open(name, _open_flags(writable=False), dir_fd=dir_fd)
    except OSError:  # none, a link, unreadable: replaced (or the rename says why not)
        return None
    try:
        raw = os.pread(fd, HEADER.itemsize, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    if len(raw) < HEADER.itemsize:
        return None
    head = np.frombuffer(raw, dtype=HEADER)[0]
    if bytes(head["magic"]) != MAGIC:
        return None
    pid, epoch = int(head["engine_pid"]), int(head["epoch"])
    if pid == os.getpid() and epoch in _OWN_EPOCHS:
        return None
    age = (clock_ns() - int(head["heartbeat_ns"])) / 1e9
    return f"pid {pid}, heartbeat {max(age, 0.0):.1f} s ago" if -LIVE_S < age < LIVE_S else None


def _write_new(dir_fd: int, name: str, fp: Fingerprint, n_slots: int, total: int,
               group: int | None) -> tuple[int, int]:
    """A complete mailbox renamed onto ``name``: ``(its descriptor, its epoch)``. Written first
    under a random name, created exclusively and never through a link, so nothing planted in the
    directory beforehand is opened."""
    tmp = f"{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dir_fd)
    try:
        os.ftruncate(fd, total)
        head = np.zeros(1, dtype=HEADER)
        head["magic"], head["layout"], head["n_slots"] = MAGIC, LAYOUT, n_slots
        head["hidden"], head["n_layers"] = fp.hidden, fp.n_layers
        head["dtype"], head["model"] = fp.dtype.encode(), fp.model.encode()[:256]
        head["epoch"] = epoch = secrets.randbits(63) | 1
        head["engine_pid"] = os.getpid()
        head["heartbeat_ns"] = clock_ns()
        os.pwrite(fd, head.tobytes(), 0)
        if group is not None:
            os.fchown(fd, -1, group)
        os.fchmod(fd, FILE_MODE)  # the control API: the engine's user, or its group
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return fd, epoch


class _Mailbox:
    """A mailbox file through its descriptor: typed copies in, typed writes out."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd
        self.inode = os.fstat(fd).st_ino
        head = self._header()
        if bytes(head["magic"]) != MAGIC:
            raise MailboxError(f"{path} is not a hotwire mailbox")
        if int(head["layout"]) != LAYOUT:
            raise MailboxError(f"{path} is a hotwire mailbox of layout {int(head['layout'])}, this hotwire reads "
                               f"layout {LAYOUT}: run the same hotwire version in the engine and beside it")
        n, h = int(head["n_slots"]), int(head["hidden"])
        if not (0 < n <= MAX_SLOTS and 0 < h <= MAX_HIDDEN and 0 < int(head["n_layers"]) <= 512):
            raise MailboxError(f"{path} has an impossible header ({n} slots, hidden {h})")
        self.n_slots, self.hidden = n, h
        self._dir_off, self._eng_off, self._rows_off, self._total = _sizes(n, h)
        if os.fstat(fd).st_size < self._total:
            raise MailboxError(f"{path} is truncated ({os.fstat(fd).st_size} < {self._total} bytes)")
        self.fingerprint = Fingerprint(_text(head["model"]), int(head["n_layers"]), h, _text(head["dtype"]))

    # -- raw access ---------------------------------------------------------------------------
    def _read(self, offset: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, offset)
        except OSError as e:
            raise MailboxError(f"cannot read {self.path}: {e}") from None
        if len(data) != size:
            raise MailboxError(f"{self.path} is truncated (a read at {offset} got {len(data)} of {size} bytes)")
        return data

    def _write(self, offset: int, data: bytes | np.ndarray) -> None:
        data = data.tobytes() if isinstance(data, np.ndarray) else data
        try:
            os.pwrite(self._fd, data, offset)
        except OSError as e:
            raise MailboxError(f"cannot write {self.path}: {e}") from None

    def _header(self) -> np.void:
        return np.frombuffer(self._read(0, HEADER.itemsize), dtype=HEADER)[0]

    def _get(self, name: str) -> int:
        offset, dtype = _field(name)
        return int(np.frombuffer(self._read(offset, dtype.itemsize), dtype=dtype)[0])

    def _set(self, name: str, value) -> None:
        offset, dtype = _field(name)
        self._write(offset, np.asarray(value, dtype=dtype.base).reshape(dtype.shape))

    # -- reading (copies) ---------------------------------------------------------------------
    @property
    def header(self) -> np.void:
        """A copy of the header."""
        return self._header()

    @property
    def directory(self) -> np.ndarray:
        """A copy of the directory ``[S]``."""
        return np.frombuffer(self._read(self._dir_off, DIRECTORY.itemsize * self.n_slots), dtype=DIRECTORY)

    @property
    def engine(self) -> np.ndarray:
        """A copy of the engine table ``[S]``."""
        return np.frombuffer(self._read(self._eng_off, ENGINE.itemsize * self.n_slots), dtype=ENGINE)

    def row(self, slot: int) -> np.ndarray:
        """A copy of slot ``slot``'s float32 row ``[H]``."""
        return np.frombuffer(self._read(self._rows_off + 4 * self.hidden * slot, 4 * self.hidden),
                             dtype=np.float32)

    @property
    def epoch(self) -> int:
        return self._get("epoch")

    def counters(self) -> dict[str, int]:
        values = self._header()["counters"]
        return {name: int(values[i]) for i, name in enumerate(COUNTERS)}

    def armed_layers(self) -> list[int]:
        return self.admission_settings()[0]

    def admission_settings(self) -> tuple[list[int], frozenset[int], int]:
        """What the engine core admits specs by: its armed layers, its projection layers (where
        a projecting mode can read the stream) and the entries a request may have per layer, as
        the engine published them (its own ``HOTWIRE_*`` settings: an API server's environment
        may differ)."""
        head = self._header()
        layers = head["armed"][: self.fingerprint.n_layers]
        return ([int(i) for i in np.flatnonzero(layers & LAYER_ARMED)],
                frozenset(int(i) for i in np.flatnonzero(layers & LAYER_PROJECTING)), int(head["entries"]))

    def _entry(self, slot: int) -> np.ndarray:
        """A copy of directory entry ``slot``, as a 1-element array."""
        at = self._dir_off + DIRECTORY.itemsize * slot
        return np.frombuffer(self._read(at, DIRECTORY.itemsize), dtype=DIRECTORY).copy()

    def _engine_entry(self, slot: int) -> np.void:
        at = self._eng_off + ENGINE.itemsize * slot
        return np.frombuffer(self._read(at, ENGINE.itemsize), dtype=ENGINE)[0]

    def read_entry(self, slot: int, with_row: bool) -> SlotEntry | None:
        """Seqlock read of one entry; ``None`` while a write is in progress."""
        d = self._entry(slot)[0]
        seq = int(d["seq"])
        if seq & 1:
            return None
        row = self.row(slot) if with_row else None
        if self._read_seq(slot) != seq:
            return None
        return SlotEntry(slot, seq, int(d["gen"]), int(d["state"]), int(d["layer"]), int(d["flags"]),
                         _text(d["vector_id"]), row)

    def _read_seq(self, slot: int) -> int:
        raw = self._read(self._dir_off + DIRECTORY.itemsize * slot, 8)
        return int.from_bytes(raw, "little")

    def _write_entry(self, slot: int, entry: np.ndarray, row: np.ndarray | None) -> None:
        """Seqlock write: ``seq`` odd, entry and row, ``seq`` even (entry's seq is the old one)."""
        at = self._dir_off + DIRECTORY.itemsize * slot
        seq = int(entry["seq"][0])
        self._write(at, (seq + 1).to_bytes(8, "little"))
        entry["seq"] = seq + 1
        self._write(at, entry)
        if row is not None:
            self._write(self._rows_off + 4 * self.hidden * slot, np.asarray(row, dtype=np.float32))
        self._write(at, (seq + 2).to_bytes(8, "little"))

    @classmethod
    def _at(cls, path: str, writable: bool):
        """Open the mailbox at ``path`` (MailboxError when there is none, or it is not one)."""
        missing = f"no mailbox at {path}: is the engine up with hotwire loaded?"
        directory, name = os.path.split(os.path.abspath(path))
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MailboxError(missing) from None
        try:
            try:
                fd = os.open(name, _open_flags(writable), dir_fd=dir_fd)
            except FileNotFoundError:
                raise MailboxError(missing) from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise MailboxError(f"{path} is a symbolic link, not the engine's mailbox; refused") from None
                raise
            try:
                problem = _untrusted(os.fstat(fd), os.fstat(dir_fd))
                if problem is not None:
                    raise MailboxError(f"{path} is not trusted as the engine's mailbox: {problem}")
                return cls(path, fd)
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class EngineMailbox(_Mailbox):
    """The engine's side: create, validate and apply changes, publish acks, references and counters.

    The engine table and the counters are written only here, so they live in memory and are
    written out; the engine never reads them back from a file someone else can change.
    """

    def __init__(self, path: str, fd: int):
        super().__init__(path, fd)
        self._engine = np.zeros(self.n_slots, dtype=ENGINE)
        self._ids = [""] * self.n_slots  # the vector id of each slot as acked
        self._epoch = self.epoch  # this engine made the file: its epoch never changes
        # a list, not the header's uint64 array: added to on the step thread (numpy's scalar path is
        # slow there, its caches cold), converted when the heartbeat writes them out
        self._counters = [0] * HEADER["counters"].shape[0]
        self._torn: dict[int, tuple[int, float]] = {}  # slot -> (odd seq, first seen)
        self._retiring: set[int] = set()  # slots acked RETIRING: :attr:`retiring`, asked every period

    @classmethod
    def create(cls, path: str, fp: Fingerprint, n_slots: int, group: int | None = None) -> "EngineMailbox":
        """Create (or replace) the mailbox atomically: readers never see a half-made header.

        :class:`MailboxError`, saying what to change, when the file cannot be made, its directory
        is not safe (see the module's "Permissions and trust"), or another live engine's mailbox
        is at ``path``."""
        _, _, _, total = _sizes(n_slots, fp.hidden)
        directory, name = os.path.split(os.path.abspath(path))
        try:
            dir_fd = _engine_dir(directory, group)
            try:
                other = _live_engine(dir_fd, name)
                if other is not None:
                    raise MailboxError(f"{path} is the mailbox of another running engine ({other}): give "
                                       "each engine on this host its own HOTWIRE_MAILBOX (and ports)")
                fd, epoch = _write_new(dir_fd, name, fp, n_slots, total, group)
            finally:
                os.close(dir_fd)
        except OSError as e:
            raise MailboxError(f"cannot create {path} ({e.strerror or e}): set HOTWIRE_MAILBOX to a "
                               "path in a directory this engine's user may write") from None
        _OWN_EPOCHS.add(epoch)
        return cls(path, fd)

    def set_armed(self, layers: list[int], *, entries: int, projecting: Iterable[int] = ()) -> None:
        """Publish the engine core's admission settings (:meth:`admission_settings`); the armed
        layers' count last, which the control API waits for before it writes anything."""
        armed = np.zeros(HEADER["armed"].shape, dtype=np.uint8)
        armed[layers] = LAYER_ARMED
        armed[list(projecting)] |= LAYER_PROJECTING
        self._set("entries", entries)
        self._set("armed", armed)
        self._set("armed_count", len(layers))

    def publish_startup(self, slot: int, vector_id: str, layer: int, row: np.ndarray) -> None:
        """Record a vector the engine loaded itself, as a pinned, engine-owned slot."""
        entry = np.zeros(1, dtype=DIRECTORY)
        entry["gen"], entry["state"], entry["layer"] = 1, ACTIVE, layer
        entry["flags"], entry["vector_id"] = FLAG_PINNED | FLAG_STARTUP, vector_id.encode()
        self._write_entry(slot, entry, row)
        self._engine["applied_seq"][slot], self._engine["state"][slot] = self._read_seq(slot), ACTIVE
        self._retiring.discard(slot)
        self._ids[slot] = vector_id
        self._write_engine(slot, slot + 1)

    def target_gen(self) -> int:
        return self._get("target_gen")

    def pending(self) -> tuple[int, list[SlotEntry], int]:
        """``(target_gen, consistent changed entries, torn count)`` since the last ack.

        Each entry's ``problem`` is set when it must not be applied (:func:`entry_problem`).
        """
        self._check_size()
        target = self.target_gen()
        seqs = self.directory["seq"]
        changed = np.flatnonzero(seqs != self._engine["applied_seq"])
        fp = self.fingerprint
        entries, torn = [], 0
        for slot in changed.tolist():
            e = self.read_entry(slot, with_row=True)
            if e is None:
                stuck = self._stuck(slot, int(seqs[slot]))
                if stuck is None:
                    torn += 1
                else:
                    entries.append(stuck)
                continue
            self._torn.pop(slot, None)
            if e.state != ACTIVE:
                e = SlotEntry(e.slot, e.seq, e.gen, e.state, e.layer, e.flags, e.vector_id, None)
            problem = entry_problem(e, fp.n_layers, fp.dtype)
            entries.append(e if problem is None else SlotEntry(
                e.slot, e.seq, e.gen, e.state, e.layer, e.flags, e.vector_id, None, problem))
        return target, entries, torn

    def _stuck(self, slot: int, seq: int) -> SlotEntry | None:
        """A rejected entry for a seqlock left odd for ``STUCK_S`` (no writer takes that long)."""
        seen, since = self._torn.get(slot, (None, 0.0))
        now = time.monotonic()
        if seen != seq:
            self._torn[slot] = (seq, now)
            return None
        if now - since < STUCK_S:
            return None
        del self._torn[slot]
        return SlotEntry(slot, seq, 0, FREE, ANY_LAYER, 0, "", None, "stuck mid-write (seqlock odd)")

    def _check_size(self) -> None:
        """A write past the end of a truncated file would silently grow it again: refuse first."""
        try:
            size = os.fstat(self._fd).st_size
        except OSError as e:
            raise MailboxError(f"cannot stat {self.path}: {e}") from None
        if size < self._total:
            raise MailboxError(f"{self.path} was truncated ({size} < {self._total} bytes)")

    def ack(self, entry: SlotEntry) -> None:
        """The engine applied ``entry``; a rejected one is acknowledged as holding nothing."""
        state = FREE if entry.problem else entry.state
        self._engine["state"][entry.slot] = state
        if state == RETIRING:
            self._retiring.add(entry.slot)
        else:
            self._retiring.discard(entry.slot)
        self._engine["applied_seq"][entry.slot] = entry.seq
        self._ids[entry.slot] = entry.vector_id
        self._write_engine(entry.slot, entry.slot + 1)

    @property
    def retiring(self) -> bool:
        """Is a slot acked as retiring (the control API waits for its references to reach 0)?"""
        return bool(self._retiring)

    def versions(self) -> dict[str, str]:
        """``{vector id: version}`` of every slot acked ACTIVE: where and when this mailbox got the
        vector's rows (its slots and their write sequence numbers, and the file's epoch), so a
        version is never repeated for other rows in the engine's lifetime, whatever catalog
        wrote them (a rebuilt catalog restarts its generations; a slot's sequence numbers only
        grow). From memory: what the engine acked, which the next step binds."""
        epoch, e = self._epoch, self._engine
        found: dict[str, list[str]] = {}
        for slot in np.flatnonzero(e["state"] == ACTIVE).tolist():
            found.setdefault(self._ids[slot], []).append(f"{slot}:{int(e['applied_seq'][slot])}")
        return {vid: f"{epoch:x}/{','.join(where)}" for vid, where in found.items()}

    def publish(self, applied_gen: int | None, inflight: np.ndarray, last_used_ns: np.ndarray) -> None:
        """Per-slot references first, then the applied generation (readers trust references once a
        retirement is acked). The counters go out with the heartbeat (:meth:`beat`)."""
        self._check_size()
        e = self._engine
        changed = np.flatnonzero((e["inflight"] != inflight) | (e["last_used_ns"] != last_used_ns))
        if changed.size:
            e["inflight"], e["last_used_ns"] = inflight, last_used_ns
            self._write_engine(int(changed[0]), int(changed[-1]) + 1)
        if applied_gen is not None:
            self._set("applied_gen", applied_gen)

    def _write_engine(self, lo: int, hi: int) -> None:
        self._write(self._eng_off + ENGINE.itemsize * lo, self._engine[lo:hi])

    def add_counter(self, name: str, n: int = 1) -> None:
        self._counters[COUNTER_INDEX[name]] += n

    def flush_counters(self) -> None:
        """Write the counters out now (the heartbeat does)."""
        self._check_size()
        self._set("counters", self._counters)

    def set_counter(self, name: str, value: int) -> None:
        self._counters[COUNTER_INDEX[name]] = value

    def beat(self, at_ns: int | None = None) -> None:
        """Publish the counters and a sign of life (``at_ns``: a given :func:`clock_ns` time, for tests)."""
        self.flush_counters()
        self._set("heartbeat_ns", clock_ns() if at_ns is None else at_ns)


class ControlMailbox(_Mailbox):
    """The control API's side: attach, write and retire slots, read the engine's acks."""

    @classmethod
    def attach(cls, path: str) -> "ControlMailbox":
        return cls._at(path, writable=True)

    def replaced(self) -> bool:
        """True when the file at the path is no longer the one attached (engine restart), or the
        attached file shrank under us."""
        try:
            if os.stat(self.path).st_ino != self.inode:
                return True
            return os.fstat(self._fd).st_size < self._total
        except (FileNotFoundError, OSError):
            return True

    def heartbeat_age_s(self) -> float:
        return max(0.0, (clock_ns() - self._get("heartbeat_ns")) / 1e9)

    def write(self, slot: int, vector_id: str, layer: int, row: np.ndarray, gen: int, flags: int = 0) -> None:
        entry = self._entry(slot)
        entry["gen"], entry["state"], entry["layer"], entry["flags"] = gen, ACTIVE, layer, flags
        entry["vector_id"] = vector_id.encode()
        self._write_entry(slot, entry, row)
        self._bump()

    def retire(self, slot: int) -> None:
        entry = self._entry(slot)
        if int(entry["state"][0]) != ACTIVE:
            return
        entry["state"] = RETIRING
        self._write_entry(slot, entry, None)
        self._bump()

    def _bump(self) -> None:
        self._set("target_gen", self._get("target_gen") + 1)

    def acked(self, slot: int) -> bool:
        return int(self._engine_entry(slot)["applied_seq"]) == self._read_seq(slot)

    def reusable(self, slot: int) -> bool:
        """FREE, or RETIRING with the engine's ack and no request in flight (invariant 6)."""
        state = int(self._entry(slot)["state"][0])
        if state == FREE:
            return True
        return state == RETIRING and self.acked(slot) and int(self._engine_entry(slot)["inflight"]) == 0

    def in_sync(self) -> bool:
        return self._get("applied_gen") >= self._get("target_gen")

    def generations(self) -> tuple[int, int]:
        """``(applied, target)``: what the engine has taken in, what was written."""
        return self._get("applied_gen"), self._get("target_gen")


class MailboxView(_Mailbox):
    """Read-only access, for processes that only look (the engine core's prefix-cache salt, the API
    server's judgement of specs)."""

    @classmethod
    def open(cls, path: str) -> "MailboxView":
        return cls._at(path, writable=False)
