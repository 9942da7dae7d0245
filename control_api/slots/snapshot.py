"""The engine's slot table as its mailbox showed it at one moment.

Nothing here writes, and nothing is cached across passes: the mailbox is the record of what is
resident, so each decision reads it again (restarts of either side need nothing else).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from hotwire.shared.mailbox import (
    ACTIVE,
    ANY_LAYER,
    FLAG_PINNED,
    FLAG_STARTUP,
    FREE,
    RETIRING,
    ControlMailbox,
    Fingerprint,
)
from hotwire.shared.spec import valid_id


@dataclass(frozen=True)
class SlotUse:
    """One non-free slot: its directory entry and the engine's view of it."""

    slot: int
    vector_id: str
    layer: int
    generation: int
    state: int
    flags: int
    inflight: int
    last_used_ns: int
    acked: bool

    @property
    def pinned(self) -> bool:
        return bool(self.flags & FLAG_PINNED)

    @property
    def startup(self) -> bool:
        return bool(self.flags & FLAG_STARTUP)


def _corrupt(d: np.ndarray, e: np.ndarray, n_layers: int) -> np.ndarray:
    """Slots whose entry no control API wrote, or that the engine refused (acked as free):
    an unknown state, an id that is not one, a layer outside the model. Never adopted, kept or
    shown as a vector; reusable like a retired slot (invariant 8)."""
    state, layer = d["state"], d["layer"]
    ids = np.array([valid_id(raw.decode("utf-8", "replace")) for raw in d["vector_id"].tolist()], dtype=bool)
    bad = ~np.isin(state, (FREE, ACTIVE, RETIRING))
    bad |= (state != FREE) & (~ids | ((layer != ANY_LAYER) & ((layer < 0) | (layer >= n_layers))))
    refused = (state == ACTIVE) & (e["applied_seq"] == d["seq"]) & (e["state"] == FREE)
    return bad | refused


def _reusable(d: np.ndarray, e: np.ndarray, corrupt: np.ndarray) -> np.ndarray:
    acked = e["applied_seq"] == d["seq"]
    state = d["state"]
    return (state == FREE) | (((state == RETIRING) | corrupt) & acked & (e["inflight"] == 0))


def reusable_slots(box: ControlMailbox) -> list[int]:
    """Slots that may be written now: FREE, or RETIRING (or corrupt), acked, and held by no request."""
    d, e = box.directory, box.engine
    return np.flatnonzero(_reusable(d, e, _corrupt(d, e, box.fingerprint.n_layers))).tolist()


class TableSnapshot:
    """The slot table of a mailbox at one moment."""

    def __init__(self, box: ControlMailbox):
        d, e = box.directory, box.engine
        acked = e["applied_seq"] == d["seq"]
        state = d["state"]
        corrupt = _corrupt(d, e, box.fingerprint.n_layers)
        self.n_slots = box.n_slots
        self.reusable = np.flatnonzero(_reusable(d, e, corrupt)).tolist()
        # Retired, held by no request, only the engine's ack missing: reusable within a step.
        self.draining = np.flatnonzero(((state == RETIRING) | corrupt) & ~acked & (e["inflight"] == 0)).tolist()
        self.uses = [
            SlotUse(s, d["vector_id"][s].decode(), int(d["layer"][s]), int(d["gen"][s]),
                    int(state[s]), int(d["flags"][s]), int(e["inflight"][s]),
                    int(e["last_used_ns"][s]), bool(acked[s]))
            for s in np.flatnonzero((state != FREE) & ~corrupt).tolist()]
        self.active: dict[str, list[SlotUse]] = defaultdict(list)
        for use in self.uses:
            if use.state == ACTIVE:
                self.active[use.vector_id].append(use)

    @property
    def used(self) -> int:
        return self.n_slots - len(self.reusable)

    def startup_ids(self) -> set[str]:
        return {u.vector_id for u in self.uses if u.startup and u.state == ACTIVE}


@dataclass(frozen=True)
class EngineSnapshot:
    """What an attached engine's mailbox showed at one moment: its header and its table."""

    fingerprint: Fingerprint
    epoch: int
    pid: int
    armed: tuple[int, ...]
    target_gen: int
    applied_gen: int
    heartbeat_age_s: float
    counters: dict[str, int]
    table: TableSnapshot

    @classmethod
    def read(cls, box: ControlMailbox) -> EngineSnapshot:
        hd = box.header
        return cls(box.fingerprint, box.epoch, int(hd["engine_pid"]), tuple(box.armed_layers()),
                   int(hd["target_gen"]), int(hd["applied_gen"]), box.heartbeat_age_s(),
                   box.counters(), TableSnapshot(box))
