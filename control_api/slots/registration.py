"""The upload protocol: one vector into the catalog and into every engine that can take it now.

:func:`register` is the only way in, and runs the steps in their one valid order, on every rank
it is given, each step on all of them before the next:

1. place: the rows of the vector for each engine's model (``VectorError`` when they do not fit);
2. plan room: which slots each engine needs freed, changing nothing: ``Conflict`` for a startup
   vector's id, ``NoRoom`` (``no_space``) when nothing evictable makes room on some rank,
   ``Unavailable`` when freeing needs the acknowledgement of an engine that stopped beating;
3. free: retire the slots chosen (the vector's own idle slots, then idle vectors, least
   recently used first);
4. await room: wait for each engine to acknowledge and release them (``NoRoom``
   ``evict_timeout``, ``Unavailable`` ``engine_restarted``);
5. write: put the vector into the catalog once, then its rows into the room made on every rank.

A failure in steps 1-2 changes nothing anywhere; after step 3 the evicted vectors stay in the
catalog and the reconcile pass brings them back, as after an eviction timeout.

A slot is reused only through the mailbox's two-phase protocol (invariant 6): retire, wait until
the engine has acknowledged and no request holds it, then write. A replace writes the new rows
into free slots and retires the old ones after (the engine binds the newest write of an
``(id, layer)``), so the vector never goes missing; only when the table has no room does it
retire its own idle slots first and reuse them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hotwire.shared.mailbox import FLAG_PINNED, ControlMailbox

from ..errors import Conflict, NoRoom, Unavailable
from ..store.catalog import CatalogStore
from ..store.records import VectorExists, VectorRecord
from .placement import mailbox_rows, target_layers
from .rank import Rank
from .snapshot import SlotUse, TableSnapshot, reusable_slots

log = logging.getLogger("hotwire.control_api")

POLL_S = 0.01  # while waiting for the engine to release evicted slots


@dataclass(frozen=True)
class Upload:
    """What an upload asks for, checked as far as it can be without an engine."""

    vector_id: str
    vector: np.ndarray  # float32, in the uploaded shape
    dtype: str  # element type as uploaded
    layers: tuple[int, ...] | None
    pinned: bool
    metadata: dict[str, Any]
    replace: bool


async def register(upload: Upload, ranks: Sequence[Rank], catalog: CatalogStore, *,
                   evict_timeout_s: float, fed: Sequence[int]) -> tuple[VectorRecord, bool]:
    """Catalog ``upload`` and write it into ``ranks``; returns the record and whether it is new.

    ``ranks`` are the engines that take the upload now (the caller holds
    :attr:`.engines.Engines.lock`); ``fed`` names every rank this API feeds, for the message of
    a refusal.
    """
    vector_id = upload.vector_id
    placements = [_Placement.of(rank, upload) for rank in ranks]
    old = catalog.get(vector_id)
    if old is not None and not upload.replace:
        raise VectorExists(vector_id, old.generation)
    lacking: list[tuple[int, NoRoom]] = []
    for placement in placements:
        try:
            placement.plan_room(vector_id)
        except NoRoom as e:
            lacking.append((placement.rank.rank, e))
    if lacking:
        raise _no_room(lacking, fed)
    for placement in placements:
        placement.free(vector_id)
    deadline = time.monotonic() + evict_timeout_s
    for placement in placements:
        await placement.await_room(deadline, evict_timeout_s)
    first = placements[0]
    record = catalog.put(vector_id, upload.vector, dtype=upload.dtype,
                         layers=None if upload.layers is None else first.layers,
                         pinned=upload.pinned, metadata=upload.metadata, replace=upload.replace)
    for placement in placements:
        placement.write(record)
    return record, old is None


def _require_engine(rank: Rank) -> ControlMailbox:
    """The rank's mailbox, if it can take an upload; else why not (``Unavailable``)."""
    box = rank.link.box
    if box is None:
        raise Unavailable("no_engine", f"no engine attached ({rank.link.problem}); vectors are "
                          "checked against the engine's model, so uploads wait for one")
    if not box.armed_layers():
        raise Unavailable("engine_starting", "the engine has not armed any layer yet")
    return box


def _no_room(lacking: list[tuple[int, NoRoom]], fed: Sequence[int]) -> NoRoom:
    if len(fed) == 1:
        return lacking[0][1]
    codes = {e.code for _, e in lacking}
    every = ", ".join(str(rank) for rank in fed)
    message = "; ".join(f"dp rank {rank}: {e.message}" for rank, e in lacking)
    return NoRoom(codes.pop() if len(codes) == 1 else "no_space",
                  f"not written to any rank (ranks {every}), the catalog is unchanged: {message}")


@dataclass
class _Placement:
    """One upload on one rank: its rows, and the slots they go into once room is made."""

    rank: Rank
    box: ControlMailbox
    layers: tuple[int, ...]
    rows: list[tuple[int, np.ndarray]]
    own: list[int] = field(default_factory=list)  # the vector's live slots before the upload
    retire: list[int] = field(default_factory=list)  # to free: own idle slots, then evictees
    evicted: list[str] = field(default_factory=list)
    slots: list[int] | None = None  # writable slots, once known

    @classmethod
    def of(cls, rank: Rank, upload: Upload) -> _Placement:
        """This engine's rows of ``upload``; :class:`VectorError` if they do not fit it."""
        box = _require_engine(rank)
        fp = box.fingerprint
        layers = target_layers(upload.vector.shape, upload.layers, fp, box.armed_layers())
        return cls(rank, box, layers, mailbox_rows(upload.vector, fp, layers))

    def plan_room(self, vector_id: str) -> None:
        """Decide which slots the upload needs freed here, changing nothing."""
        table = TableSnapshot(self.box)
        if vector_id in table.startup_ids():
            raise Conflict("startup_vector", f"{vector_id!r} is a startup vector of the engine "
                           "(HOTWIRE_VECTORS); pick another id")
        own = table.active.get(vector_id, [])
        self.own = [u.slot for u in own]
        need = len(self.rows)
        if len(table.reusable) >= need:
            self.slots = table.reusable[:need]
            return
        coming = len(table.reusable) + len(table.draining)
        retire: list[int] = []
        if own and not any(u.inflight for u in own):
            retire += [u.slot for u in own]
        evicted = []
        for victim, uses in self._eviction_order(table, exclude=vector_id):
            if coming + len(retire) >= need:
                break
            retire += [u.slot for u in uses]
            evicted.append(victim)
        if coming + len(retire) < need:
            raise NoRoom("no_space", _no_space_message(table, need, vector_id))
        age = self.box.heartbeat_age_s()
        if age > self.rank.heartbeat_timeout_s:
            raise Unavailable("engine_unresponsive", f"freeing slots needs the engine's "
                              f"acknowledgement, but its heartbeat is {age:.0f}s old")
        self.retire, self.evicted = retire, evicted

    def free(self, vector_id: str) -> None:
        """Retire what :meth:`plan_room` chose."""
        for slot in self.retire:
            self.box.retire(slot)
        if self.evicted:
            self.rank.evicted_total += len(self.evicted)
            log.info("evicting %s to make room for %s%s", ", ".join(self.evicted), vector_id,
                     self.rank.where())

    async def await_room(self, deadline: float, evict_timeout_s: float) -> None:
        """Wait (until the monotonic ``deadline``) for the engine to release the freed slots."""
        box, need = self.box, len(self.rows)
        while self.slots is None:
            free = reusable_slots(box)
            if len(free) >= need:
                self.slots = free[:need]
            elif box.replaced():
                raise Unavailable("engine_restarted", "the engine restarted while slots were "
                                  "being freed; retry")
            elif time.monotonic() >= deadline:
                raise NoRoom("evict_timeout", f"evicted slots were still in use by running "
                             f"requests after {evict_timeout_s:g}s; the evicted vectors stay in "
                             "the catalog; retry later")
            else:
                await asyncio.sleep(POLL_S)

    def write(self, record: VectorRecord) -> None:
        """Write ``record``'s rows into the room made, then retire its older slots (the engine
        binds the newest write of an ``(id, layer)``, so it never goes missing)."""
        box, slots = self.box, self.slots
        assert slots is not None
        flags = FLAG_PINNED if record.pinned else 0
        for slot, (layer, row) in zip(slots, self.rows, strict=True):
            box.write(slot, record.id, layer, row, record.generation, flags)
        for slot in sorted(set(self.own) - set(slots)):
            box.retire(slot)
        self.rank.problems.pop(record.id, None)
        log.info("registered %s generation %d in slots %s%s", record.id, record.generation, slots,
                 self.rank.where())

    def _eviction_order(self, table: TableSnapshot, exclude: str) -> list[tuple[str, list[SlotUse]]]:
        """Evictable vectors, least recently used first: whole vectors, unpinned, none in use.

        Recency is the engine's last use of any of the vector's slots, or its registration time
        when later, so a vector just pushed is not the first to go.
        """
        records = self.rank.catalog.records()
        ranked = []
        for vector_id, uses in table.active.items():
            record = records.get(vector_id)
            if (record is None or vector_id == exclude
                    or any(u.pinned or u.startup or u.inflight for u in uses)):
                continue  # vectors the catalog does not hold could not come back
            registered_ns = int(record.updated_at * 1e9)
            ranked.append((max(registered_ns, *(u.last_used_ns for u in uses)), vector_id, uses))
        return [(vector_id, uses) for _, vector_id, uses in sorted(ranked)]


def _no_space_message(table: TableSnapshot, need: int, vector_id: str) -> str:
    others = [u for uses in table.active.values() for u in uses if u.vector_id != vector_id]
    kept = sum(1 for u in others if u.pinned or u.startup)
    busy = sum(1 for u in others if u.inflight and not (u.pinned or u.startup))
    return (f"no room for {need} slot(s) of {table.n_slots}: {len(table.reusable)} free, "
            f"{kept} pinned or startup, {busy} held by running requests; nothing can be "
            "evicted (delete or unpin a vector, or retry when requests finish)")
