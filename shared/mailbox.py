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

Consistency: each directory entry carries a seqlock ``seq``. A writer makes it odd, writes the
entry and its row, makes it even again, then bumps ``header.target_gen``. A reader copies entry
and row and keeps the copy only if ``seq`` was even and unchanged around the copy, so it never
applies a half-written row. Aligned 8-byte stores are single stores on x86-64 and AArch64; stores
are issued in program order by the interpreter (x86-64 TSO keeps that order visible).

Slot life cycle (invariant 6, two-phase eviction)::

    FREE --write--> ACTIVE --retire--> RETIRING --engine ack + inflight==0--> reusable

The engine stops binding new requests to a RETIRING slot when it applies it and acks it by
publishing ``applied_seq == seq``. The control API reuses a slot only once it is acked and its
``inflight`` count is zero; the GPU row is overwritten on the compute stream, after any step
that could still read it.
"""

from __future__ import annotations

import mmap
import os
import secrets
import time
from dataclasses import dataclass

import numpy as np

from .wire import ModelShape

DEFAULT_MAILBOX = "/dev/shm/hotwire/engine.mbx"  # where the engine creates it, and the control API looks
MAGIC = b"HOTWIRE\x01"
LAYOUT = 1
HEADER_BYTES = 4096

FREE, ACTIVE, RETIRING = 0, 1, 2
STATE_NAMES = {FREE: "free", ACTIVE: "active", RETIRING: "retiring"}
FLAG_PINNED = 1  # never evicted
FLAG_STARTUP = 2  # loaded by the engine from HOTWIRE_VECTORS; the control API leaves it alone
ANY_LAYER = -1  # a (hidden,) vector: the same row serves every layer

# Engine counters, by index into header["counters"].
COUNTERS = (
    "steered_requests",  # requests that arrived with a valid, resolvable spec
    "unsteered_malformed",  # spec did not parse
    "unsteered_unknown_id",  # an entry named an id/layer that holds no vector
    "unsteered_unarmed_layer",  # an entry named a layer the engine did not arm
    "unsteered_too_many_entries",  # more entries on one layer than the routing table holds
    "unsteered_table_full",  # no free request row (more steered requests than the table holds)
    "mailbox_rows_applied",  # ACTIVE rows copied into the bank
    "mailbox_torn_reads",  # entries skipped because a write was in progress
    "steps",  # engine steps hotwire routed (published by the heartbeat, like host_ns)
    "host_ns",  # time hotwire's per-step work held the engine's step thread
)
COUNTER_INDEX = {name: i for i, name in enumerate(COUNTERS)}

HEADER = np.dtype([
    ("magic", "S8"), ("layout", "<u4"), ("n_slots", "<u4"),
    ("hidden", "<u4"), ("n_layers", "<u4"), ("dtype", "S16"), ("model", "S256"),
    ("epoch", "<u8"),  # random per engine start: a change means "push everything again"
    ("engine_pid", "<u4"), ("armed_count", "<u4"),
    ("target_gen", "<u8"),  # control API: bumped after every directory write
    ("applied_gen", "<u8"),  # engine: last target_gen fully applied
    ("heartbeat_ns", "<u8"),  # engine: time.time_ns() of its last sign of life
    ("counters", "<u8", (32,)),
    ("armed", "u1", (512,)),  # engine: 1 for each armed decoder layer index
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
    """A consistent copy of one directory entry (and its row, for ACTIVE slots)."""

    slot: int
    seq: int
    gen: int
    state: int
    layer: int
    flags: int
    vector_id: str
    row: np.ndarray | None


def _sizes(n_slots: int, hidden: int) -> tuple[int, int, int, int]:
    dir_off = HEADER_BYTES
    eng_off = dir_off + DIRECTORY.itemsize * n_slots
    rows_off = -(-(eng_off + ENGINE.itemsize * n_slots) // 64) * 64
    return dir_off, eng_off, rows_off, rows_off + 4 * n_slots * hidden


class _Mapped:
    """Typed numpy views over a mapped mailbox file."""

    def __init__(self, path: str, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        head = np.frombuffer(mm, dtype=HEADER, count=1)
        if bytes(head["magic"][0]) != MAGIC or int(head["layout"][0]) != LAYOUT:
            raise MailboxError(f"{path} is not a hotwire mailbox (layout {LAYOUT})")
        self.header = head[0]
        n, h = int(self.header["n_slots"]), int(self.header["hidden"])
        dir_off, eng_off, rows_off, total = _sizes(n, h)
        if len(mm) < total:
            raise MailboxError(f"{path} is truncated ({len(mm)} < {total} bytes)")
        self.directory = np.frombuffer(mm, dtype=DIRECTORY, count=n, offset=dir_off)
        self.engine = np.frombuffer(mm, dtype=ENGINE, count=n, offset=eng_off)
        self.rows = np.frombuffer(mm, dtype=np.float32, count=n * h, offset=rows_off).reshape(n, h)
        self.n_slots, self.hidden = n, h

    @property
    def fingerprint(self) -> Fingerprint:
        hd = self.header
        return Fingerprint(hd["model"].decode(), int(hd["n_layers"]), int(hd["hidden"]),
                           hd["dtype"].decode())

    @property
    def epoch(self) -> int:
        return int(self.header["epoch"])

    def counters(self) -> dict[str, int]:
        return {name: int(self.header["counters"][i]) for i, name in enumerate(COUNTERS)}

    def armed_layers(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.header["armed"][: int(self.header["n_layers"])])]

    def read_entry(self, slot: int, with_row: bool) -> SlotEntry | None:
        """Seqlock read of one entry; ``None`` while a write is in progress."""
        d = self.directory[slot]
        seq = int(d["seq"])
        if seq & 1:
            return None
        copy = d.copy()
        row = self.rows[slot].copy() if with_row else None
        if int(self.directory[slot]["seq"]) != seq:
            return None
        return SlotEntry(slot, seq, int(copy["gen"]), int(copy["state"]), int(copy["layer"]),
                         int(copy["flags"]), copy["vector_id"].decode(), row)

    def close(self) -> None:
        # Views keep exported buffers alive; drop them before closing the map.
        self.header = self.directory = self.engine = self.rows = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view; the map is freed with it


def _map(path: str, writable: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)


class EngineMailbox(_Mapped):
    """The engine's side: create, apply changes, publish acks, references and counters."""

    @classmethod
    def create(cls, path: str, fp: Fingerprint, n_slots: int) -> "EngineMailbox":
        """Create (or replace) the mailbox atomically: readers never see a half-made header."""
        _, _, _, total = _sizes(n_slots, fp.hidden)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.truncate(total)
        mm = _map(tmp, writable=True)
        head = np.frombuffer(mm, dtype=HEADER, count=1)
        head["magic"], head["layout"], head["n_slots"] = MAGIC, LAYOUT, n_slots
        head["hidden"], head["n_layers"] = fp.hidden, fp.n_layers
        head["dtype"], head["model"] = fp.dtype.encode(), fp.model.encode()[:256]
        head["epoch"] = secrets.randbits(63) | 1
        head["engine_pid"] = os.getpid()
        head["heartbeat_ns"] = time.time_ns()
        del head
        os.chmod(tmp, 0o666)  # the control API may run as another user in another container
        os.replace(tmp, path)
        return cls(path, mm)

    def set_armed(self, layers: list[int]) -> None:
        self.header["armed"][:] = 0
        self.header["armed"][layers] = 1
        self.header["armed_count"] = len(layers)

    def publish_startup(self, slot: int, vector_id: str, layer: int, row: np.ndarray) -> None:
        """Record a vector the engine loaded itself, as a pinned, engine-owned slot."""
        d = self.directory[slot]
        d["gen"], d["state"], d["layer"] = 1, ACTIVE, layer
        d["flags"], d["vector_id"] = FLAG_PINNED | FLAG_STARTUP, vector_id.encode()
        self.rows[slot] = row
        d["seq"] = int(d["seq"]) + 2
        self.engine[slot]["applied_seq"] = int(d["seq"])
        self.engine[slot]["state"] = ACTIVE

    def pending(self) -> tuple[int, list[SlotEntry], int]:
        """``(target_gen, consistent changed entries, torn count)`` since the last ack."""
        target = int(self.header["target_gen"])
        seqs = self.directory["seq"].copy()
        changed = np.flatnonzero(seqs != self.engine["applied_seq"])
        entries, torn = [], 0
        for slot in changed.tolist():
            state = int(self.directory[slot]["state"])
            e = self.read_entry(slot, with_row=state == ACTIVE)
            if e is None:
                torn += 1
            else:
                entries.append(e)
        return target, entries, torn

    def ack(self, entry: SlotEntry) -> None:
        self.engine[entry.slot]["state"] = entry.state
        self.engine[entry.slot]["applied_seq"] = entry.seq

    def publish(self, applied_gen: int | None, inflight: np.ndarray, last_used_ns: np.ndarray) -> None:
        """Per-slot references first, then the applied generation (readers trust refs once acked)."""
        self.engine["inflight"] = inflight
        self.engine["last_used_ns"] = last_used_ns
        if applied_gen is not None:
            self.header["applied_gen"] = applied_gen

    def add_counter(self, name: str, n: int = 1) -> None:
        self.header["counters"][COUNTER_INDEX[name]] += n

    def set_counter(self, name: str, value: int) -> None:
        self.header["counters"][COUNTER_INDEX[name]] = value

    def beat(self) -> None:
        self.header["heartbeat_ns"] = time.time_ns()


class ControlMailbox(_Mapped):
    """The control API's side: attach, write and retire slots, read the engine's acks."""

    @classmethod
    def attach(cls, path: str) -> "ControlMailbox":
        try:
            mm = _map(path, writable=True)
        except FileNotFoundError:
            raise MailboxError(f"no mailbox at {path}: is the engine up with hotwire loaded?") from None
        box = cls(path, mm)
        box.inode = os.stat(path).st_ino
        return box

    def replaced(self) -> bool:
        """True when the engine has re-created the file since we attached (engine restart)."""
        try:
            return os.stat(self.path).st_ino != self.inode
        except FileNotFoundError:
            return True

    def heartbeat_age_s(self) -> float:
        return max(0.0, (time.time_ns() - int(self.header["heartbeat_ns"])) / 1e9)

    def write(self, slot: int, vector_id: str, layer: int, row: np.ndarray, gen: int, flags: int = 0) -> None:
        d = self.directory[slot]
        seq = int(d["seq"])
        d["seq"] = seq + 1
        d["gen"], d["state"], d["layer"], d["flags"] = gen, ACTIVE, layer, flags
        d["vector_id"] = vector_id.encode()
        self.rows[slot] = row
        d["seq"] = seq + 2
        self.header["target_gen"] = int(self.header["target_gen"]) + 1

    def retire(self, slot: int) -> None:
        d = self.directory[slot]
        if int(d["state"]) != ACTIVE:
            return
        seq = int(d["seq"])
        d["seq"] = seq + 1
        d["state"] = RETIRING
        d["seq"] = seq + 2
        self.header["target_gen"] = int(self.header["target_gen"]) + 1

    def acked(self, slot: int) -> bool:
        return int(self.engine[slot]["applied_seq"]) == int(self.directory[slot]["seq"])

    def reusable(self, slot: int) -> bool:
        """FREE, or RETIRING with the engine's ack and no request in flight (invariant 6)."""
        state = int(self.directory[slot]["state"])
        if state == FREE:
            return True
        return state == RETIRING and self.acked(slot) and int(self.engine[slot]["inflight"]) == 0

    def in_sync(self) -> bool:
        return int(self.header["applied_gen"]) >= int(self.header["target_gen"])


class MailboxView(_Mapped):
    """Read-only access, for processes that only look (the engine core's prefix-cache salt)."""

    @classmethod
    def open(cls, path: str) -> "MailboxView":
        view = cls(path, _map(path, writable=False))
        view.inode = os.stat(path).st_ino
        return view

    def generations(self) -> dict[str, int]:
        """``{vector id: generation}`` of every ACTIVE slot."""
        d = self.directory.copy()
        live = d[d["state"] == ACTIVE]
        out: dict[str, int] = {}
        for vid, gen in zip(live["vector_id"].tolist(), live["gen"].tolist()):
            out[vid.decode()] = max(int(gen), out.get(vid.decode(), 0))
        return out
