"""Slot manager: keeps one engine's mailbox holding the catalog, within its slot budget.

One manager per engine (per data-parallel rank); :mod:`.engines` holds them all, takes the one
lock every mutation holds, and writes the catalog once for all of them. The mailbox directory is
the record of what is resident; nothing here caches it, so a restart of either side is handled
by reading it again (invariant 7):

- :meth:`SlotManager.reconcile` (every ``RECONCILE_PERIOD_S``) attaches to the engine, adopts
  vectors the engine holds that the catalog does not know (see :mod:`.adoption`; retired
  instead, each with a WARNING, when ``unknown_vectors="retire"`` is chosen), retires slots the
  catalog does not want (deleted vectors, old generations) and writes catalog vectors that are
  missing into free slots. It never evicts.
- An upload goes through :meth:`SlotManager.place` (rows for this engine's model),
  :meth:`SlotManager.plan_room` (which idle vectors to evict, least recently used first; 507
  with nothing changed when there is no room), :meth:`SlotManager.free`,
  :meth:`SlotManager.await_room`, and, once the catalog took it, :meth:`SlotManager.write`.

While the catalog cannot persist writes (``catalog.problem()``: the SQLite file removed or
replaced, 503 ``catalog_lost``; PostgreSQL unreachable, 503 ``catalog_unavailable``) the API is
unready, writes are refused and the reconciler retires and adopts nothing.

A slot is reused only through the mailbox's two-phase protocol (invariant 6): retire, wait until
the engine has acknowledged and no request holds it, then write. A replace writes the new rows
into free slots and retires the old ones after (the engine binds the newest write of an
``(id, layer)``), so the vector never goes missing; only when the table has no room does it
retire its own idle slots first and reuse them.

Every mutation holds the collection's asyncio lock (:attr:`.engines.Engines.lock`), so an upload
waiting on evictions and the reconcile loop never pick slots at the same time. Engine contract: startup slots (``FLAG_STARTUP``) are
published before the engine arms its layers; nothing is written while no layer is armed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

import numpy as np

from hotwire.shared.mailbox import ACTIVE, FLAG_PINNED, ControlMailbox, MailboxError
from hotwire.shared.wire import VectorError

from .adoption import Adoption, UnknownVectors, plan_adoptions, verdict
from .catalog import CatalogLost, StaleGeneration, VectorExists, VectorRecord, lost_error
from .catalog_store import CatalogStore
from .engine_link import EngineLink
from .errors import ApiError
from .placement import mailbox_rows, target_layers
from .snapshot import EngineView, SlotUse, TableSnapshot, reusable_slots
from .uploads import Upload

__all__ = ["EngineView", "Placement", "Residency", "ResidencyState", "SlotManager",
           "catalog_write"]

log = logging.getLogger("hotwire.control_api")

RECONCILE_PERIOD_S = 0.2
POLL_S = 0.01  # while waiting for the engine to release evicted slots
APPLY_POLL_S = 0.002  # while waiting for the engine to take in a write (its mailbox thread: every 20 ms)


ResidencyState = Literal["resident", "queued", "not_resident", "incompatible", "no_engine"]


@dataclass(frozen=True)
class Residency:
    """Where a catalog vector stands on one engine."""

    state: ResidencyState
    reason: str | None
    slots: tuple[tuple[int, int], ...]  # (slot, slot layer)

    @property
    def resident(self) -> bool:
        return self.state == "resident"


@dataclass
class Placement:
    """One upload on one engine: its rows, and the slots they go into once room is made."""

    box: ControlMailbox
    layers: tuple[int, ...]
    rows: list[tuple[int, np.ndarray]]
    own: list[int] = field(default_factory=list)  # the vector's live slots before the upload
    retire: list[int] = field(default_factory=list)  # to free: own idle slots, then evictees
    evicted: list[str] = field(default_factory=list)
    slots: list[int] | None = None  # writable slots, once known


@contextmanager
def catalog_write() -> Iterator[None]:
    """A catalog write as the API answers it: a lost SQLite file is 503 ``catalog_lost``, an id
    another writer created first is 409 ``exists`` (PostgreSQL raises its 503 itself)."""
    try:
        yield
    except CatalogLost as e:
        raise lost_error(str(e)) from None
    except VectorExists as e:
        raise ApiError(409, "exists", f"{e}; send replace=true to replace it") from None


class SlotManager:
    """The slot table of one engine: ``rank`` is its data-parallel rank (0 without DP)."""

    def __init__(self, catalog: CatalogStore, link: EngineLink, *, evict_timeout_s: float,
                 heartbeat_timeout_s: float, unknown_vectors: UnknownVectors = "adopt",
                 rank: int = 0):
        self.catalog = catalog
        self.link = link
        self.rank = rank
        self.evict_timeout_s = evict_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.unknown_vectors = unknown_vectors
        self.evicted_total = 0
        self.adopted_total = 0
        self.reconcile_error: str | None = None
        self._problems: dict[str, str] = {}  # id -> why it cannot go on the attached engine
        self._unadoptable: dict[str, str] = {}  # id -> why its slots are left alone

    # Reading -----------------------------------------------------------------------------

    def view(self) -> EngineView | None:
        """The attached engine's table now; None when detached or the file cannot be read (the
        next reconcile pass detaches from it and says why)."""
        box = self.link.box
        if box is None:
            return None
        try:
            return EngineView.read(box)
        except MailboxError:
            return None

    def engine_problem(self) -> str | None:
        """Why this engine cannot be steered through this API now, or ``None``.

        Ready: attached, layers armed, heartbeat fresh, the last reconcile pass clean, and the
        engine not stuck on a mailbox generation (see :class:`SyncWatch`).
        """
        box = self.link.box
        if box is None:
            return self.link.problem
        try:
            armed, age = box.armed_layers(), box.heartbeat_age_s()
        except MailboxError as e:
            return f"the engine's mailbox cannot be read: {e}"
        if not armed:
            return "the engine has not armed any layer yet"
        if age > self.heartbeat_timeout_s:
            return f"engine heartbeat is {age:.1f}s old (timeout {self.heartbeat_timeout_s:g}s)"
        if self.reconcile_error is not None:
            return f"reconcile failed: {self.reconcile_error}"
        lag = self.link.watch.lag_s()
        if lag > self.heartbeat_timeout_s:
            return (f"the engine has not applied mailbox generation {self.link.watch.waiting_for} "
                    f"for {lag:.1f}s")
        return None

    def residency(self, record: VectorRecord, view: EngineView | None) -> Residency:
        """Resident once every row is in the table of an engine that beats; rows written into
        the table of an engine whose heartbeat is stale are ``queued``: nothing applies them
        until it beats again."""
        if view is None:
            return Residency("no_engine", self.link.problem, ())
        if not view.armed:
            return Residency("not_resident", "the engine has not armed any layer yet", ())
        try:
            layers = target_layers(record.shape, record.layers, view.fingerprint, view.armed)
        except VectorError as e:
            return Residency("incompatible", e.detail, ())
        slots = tuple(sorted((u.slot, u.layer) for u in view.table.active.get(record.id, ())
                             if u.generation == record.generation and u.layer in layers))
        if record.id in self._problems:
            return Residency("incompatible", self._problems[record.id], slots)
        if view.heartbeat_age_s > self.heartbeat_timeout_s:
            return Residency("queued", f"engine heartbeat is {view.heartbeat_age_s:.0f}s old; the "
                             "vector will be applied when the engine beats again", slots)
        if {layer for _, layer in slots} >= set(layers):
            return Residency("resident", None, slots)
        return Residency("not_resident", "waiting for free slots (evicted, or the table is full)",
                         slots)

    def startup_ids(self) -> set[str]:
        box = self.link.box
        return set() if box is None else TableSnapshot(box).startup_ids()

    # Writing an upload (the caller holds the collection's lock) --------------------------

    def writable(self) -> bool:
        """Attached with layers armed: uploads are written here now (others get the catalog
        from the reconciler when they attach or arm)."""
        box = self.link.box
        try:
            return box is not None and bool(box.armed_layers())
        except MailboxError:
            return False

    def require_engine(self) -> ControlMailbox:
        box = self.link.box
        if box is None:
            raise ApiError(503, "no_engine", f"no engine attached ({self.link.problem}); vectors "
                           "are checked against the engine's model, so uploads wait for one")
        if not box.armed_layers():
            raise ApiError(503, "engine_starting", "the engine has not armed any layer yet")
        return box

    def place(self, upload: Upload) -> Placement:
        """This engine's rows of ``upload``; :class:`VectorError` (422) if they do not fit it."""
        box = self.require_engine()
        fp = box.fingerprint
        layers = target_layers(upload.vector.shape, upload.layers, fp, box.armed_layers())
        return Placement(box, layers, mailbox_rows(upload.vector, fp, layers))

    def plan_room(self, placement: Placement, vector_id: str) -> None:
        """Decide which slots the upload needs freed here, changing nothing: 409 for a startup
        vector's id, 507 ``no_space`` when nothing evictable makes room, 503 when room needs
        the acknowledgement of an engine that stopped beating."""
        box = placement.box
        table = TableSnapshot(box)
        if vector_id in table.startup_ids():
            raise ApiError(409, "startup_vector", f"{vector_id!r} is a startup vector of the "
                           "engine (HOTWIRE_VECTORS); pick another id")
        own = table.active.get(vector_id, [])
        placement.own = [u.slot for u in own]
        need = len(placement.rows)
        if len(table.reusable) >= need:
            placement.slots = table.reusable[:need]
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
            raise ApiError(507, "no_space", self._no_space_message(table, need, vector_id))
        age = box.heartbeat_age_s()
        if age > self.heartbeat_timeout_s:
            raise ApiError(503, "engine_unresponsive", f"freeing slots needs the engine's "
                           f"acknowledgement, but its heartbeat is {age:.0f}s old")
        placement.retire, placement.evicted = retire, evicted

    def free(self, placement: Placement, vector_id: str) -> None:
        """Retire what :meth:`plan_room` chose."""
        for slot in placement.retire:
            placement.box.retire(slot)
        if placement.evicted:
            self.evicted_total += len(placement.evicted)
            log.info("evicting %s to make room for %s%s", ", ".join(placement.evicted),
                     vector_id, self._where())

    async def await_room(self, placement: Placement, deadline: float) -> None:
        """Wait (until the monotonic ``deadline``) for the engine to release the freed slots."""
        box, need = placement.box, len(placement.rows)
        while placement.slots is None:
            free = reusable_slots(box)
            if len(free) >= need:
                placement.slots = free[:need]
            elif box.replaced():
                raise ApiError(503, "engine_restarted", "the engine restarted while slots were "
                               "being freed; retry")
            elif time.monotonic() >= deadline:
                raise ApiError(507, "evict_timeout", f"evicted slots were still in use by running "
                               f"requests after {self.evict_timeout_s:g}s; the evicted vectors stay "
                               "in the catalog; retry later")
            else:
                await asyncio.sleep(POLL_S)

    async def await_applied(self, target: int, deadline: float) -> None:
        """Wait (until the monotonic ``deadline``) for the engine to take in generation ``target``:
        it reads its mailbox on a thread of its own, between steps (every
        ``engine_plugin.core_sync.POLL_S``), so once this
        returns, every request it admits from then on sees the write. An engine that does not
        beat is not waited for (its vectors read ``queued``)."""
        box = self.link.box
        while box is not None and not box.replaced() and box.heartbeat_age_s() <= self.heartbeat_timeout_s:
            if box.generations()[0] >= target or time.monotonic() >= deadline:
                return
            await asyncio.sleep(APPLY_POLL_S)

    def written(self) -> int | None:
        """The generation written so far (None without a mailbox)."""
        box = self.link.box
        return None if box is None else box.generations()[1]

    def write(self, placement: Placement, record: VectorRecord) -> None:
        """Write ``record``'s rows into the room made, then retire its older slots (the engine
        binds the newest write of an ``(id, layer)``, so it never goes missing)."""
        box, slots = placement.box, placement.slots
        assert slots is not None
        flags = FLAG_PINNED if record.pinned else 0
        for slot, (layer, row) in zip(slots, placement.rows, strict=True):
            box.write(slot, record.id, layer, row, record.generation, flags)
        for slot in sorted(set(placement.own) - set(slots)):
            box.retire(slot)
        self._problems.pop(record.id, None)
        log.info("registered %s generation %d in slots %s%s", record.id, record.generation, slots,
                 self._where())

    def retire_vector(self, vector_id: str) -> None:
        """Retire every live slot of ``vector_id`` (it was deleted from the catalog)."""
        self._problems.pop(vector_id, None)
        box = self.link.box
        if box is not None:
            for use in TableSnapshot(box).active.get(vector_id, ()):
                box.retire(use.slot)

    def _eviction_order(self, table: TableSnapshot, exclude: str) -> list[tuple[str, list[SlotUse]]]:
        """Evictable vectors, least recently used first: whole vectors, unpinned, none in use.

        Recency is the engine's last use of any of the vector's slots, or its registration time
        when later, so a vector just pushed is not the first to go.
        """
        records = self.catalog.records()
        ranked = []
        for vector_id, uses in table.active.items():
            record = records.get(vector_id)
            if (record is None or vector_id == exclude
                    or any(u.pinned or u.startup or u.inflight for u in uses)):
                continue  # vectors the catalog does not hold could not come back
            registered_ns = int(record.updated_at * 1e9)
            ranked.append((max(registered_ns, *(u.last_used_ns for u in uses)), vector_id, uses))
        return [(vector_id, uses) for _, vector_id, uses in sorted(ranked)]

    @staticmethod
    def _no_space_message(table: TableSnapshot, need: int, vector_id: str) -> str:
        others = [u for uses in table.active.values() for u in uses if u.vector_id != vector_id]
        kept = sum(1 for u in others if u.pinned or u.startup)
        busy = sum(1 for u in others if u.inflight and not (u.pinned or u.startup))
        return (f"no room for {need} slot(s) of {table.n_slots}: {len(table.reusable)} free, "
                f"{kept} pinned or startup, {busy} held by running requests; nothing can be "
                "evicted (delete or unpin a vector, or retry when requests finish)")

    def _where(self) -> str:
        return "" if self.rank == 0 else f" (dp rank {self.rank})"

    # Reconcile -----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """One pass: (re)attach, adopt, retire what the catalog does not want, write what is
        missing. With the catalog lost or unreachable, only the last: nothing is adopted or
        retired.

        Caller holds the collection's lock.
        """
        if self.link.refresh():
            self._problems.clear()
            self._unadoptable.clear()
        box = self.link.box
        lost = self.catalog.problem()
        if box is None:
            return
        self.link.observe_sync()
        armed = box.armed_layers()
        if not armed:
            return
        if lost is None and self.unknown_vectors == "adopt":
            self._adopt(box, TableSnapshot(box))
        fp = box.fingerprint
        records = self.catalog.records()
        wanted: dict[str, tuple[int, ...]] = {}
        for record in records.values():
            try:
                wanted[record.id] = target_layers(record.shape, record.layers, fp, armed)
            except VectorError as e:
                self._note_problem(record.id, e.detail)
        table = TableSnapshot(box)
        if lost is None:
            self._retire_unwanted(box, table, records, wanted)
        self._write_missing(box, table, records, wanted)

    def _adopt(self, box: ControlMailbox, table: TableSnapshot) -> None:
        adoptions, problems = plan_adoptions(box, table, self.catalog)
        for adoption in adoptions:
            note = self._adoption_note(box, adoption)
            try:
                with catalog_write():
                    record = self.catalog.put(adoption.vector_id, adoption.vector,
                                              dtype="float32", layers=adoption.layers,
                                              pinned=adoption.pinned, metadata=note,
                                              generation=adoption.generation)
            except StaleGeneration as e:
                log.info("not adopting %s%s: the catalog holds a newer write (%s); this "
                         "engine's rows are replaced", adoption.vector_id, self._where(), e)
                continue
            self._unadoptable.pop(adoption.vector_id, None)
            if record.metadata != note:
                log.info("%s generation %d%s: already adopted by another writer of the catalog",
                         adoption.vector_id, adoption.generation, self._where())
                continue
            self.adopted_total += 1
            if adoption.replaces is None:
                why = "the catalog does not know it"
            else:
                why = (f"the engine holds a later write than the catalog's generation "
                       f"{adoption.replaces}")
            log.warning("adopted %s generation %d from slots %s of the engine%s (%s); "
                        "set unknown_vectors=retire (HOTWIRE_UNKNOWN_VECTORS) to retire such "
                        "vectors instead", adoption.vector_id, adoption.generation,
                        list(adoption.slots), self._where(), why)
        for vector_id, problem in problems.items():
            if self._unadoptable.get(vector_id) != problem:
                log.warning("left the engine's slots of %s alone%s: not in the catalog, and "
                            "cannot be adopted: %s", vector_id, self._where(), problem)
            self._unadoptable[vector_id] = problem

    def _adoption_note(self, box: ControlMailbox, adoption: Adoption) -> dict[str, object]:
        note: dict[str, object] = {
            "mailbox": str(self.link.path), "epoch": f"{box.epoch:x}",
            "slots": list(adoption.slots),
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if adoption.replaces is not None:
            note["replaced_generation"] = adoption.replaces
        return {"adopted": note}

    def _retire_unwanted(self, box: ControlMailbox, table: TableSnapshot,
                         records: dict[str, VectorRecord], wanted: dict[str, tuple[int, ...]]) -> None:
        kept: set[tuple[str, int]] = set()
        for use in table.uses:
            if use.state != ACTIVE or use.startup:
                continue
            record = records.get(use.vector_id)
            found = verdict(use, record, self.catalog.high_water(use.vector_id))
            key = (use.vector_id, use.layer)
            if found == "keep":
                if use.layer in wanted.get(use.vector_id, ()) and key not in kept:
                    kept.add(key)
                    continue
                why = "a duplicate row" if key in kept else "a layer the vector does not use here"
            elif found == "stale":
                why = f"older than the catalog's generation {record.generation}"
            elif found == "deleted":
                why = "deleted from the catalog"
            elif self.unknown_vectors == "adopt":
                continue  # could not be adopted (logged by _adopt): left as it is
            else:
                self._retire_unknown(box, use, found)
                continue
            box.retire(use.slot)
            log.info("retired slot %d%s (%s, layer %d, generation %d): %s",
                     use.slot, self._where(), use.vector_id, use.layer, use.generation, why)

    def _retire_unknown(self, box: ControlMailbox, use: SlotUse, found: str) -> None:
        """The explicit choice ``unknown_vectors="retire"``; generations stay monotonic."""
        with catalog_write():
            self.catalog.reserve_generation(use.vector_id, use.generation)
        box.retire(use.slot)
        what = "not in the catalog" if found == "unknown" else "newer than the catalog's record"
        log.warning("retired slot %d (%s, layer %d, generation %d): %s; chosen by "
                    "unknown_vectors=retire (HOTWIRE_UNKNOWN_VECTORS)",
                    use.slot, use.vector_id, use.layer, use.generation, what)

    def _write_missing(self, box: ControlMailbox, table: TableSnapshot,
                       records: dict[str, VectorRecord], wanted: dict[str, tuple[int, ...]]) -> None:
        free = list(table.reusable)
        fp = box.fingerprint
        for record in sorted(records.values(), key=lambda r: (not r.pinned, -r.updated_at)):
            layers = wanted.get(record.id)
            if layers is None or record.id in self._problems:
                continue
            have = {u.layer for u in table.active.get(record.id, ()) if u.generation == record.generation}
            missing = [layer for layer in layers if layer not in have]
            if not missing or len(missing) > len(free):
                continue
            try:
                rows = dict(mailbox_rows(self.catalog.load(record.id), fp, layers))
            except VectorError as e:
                self._note_problem(record.id, e.detail)
                continue
            except KeyError:  # replaced or deleted by another writer since records() was read
                log.debug("%s changed in the catalog while being pushed; next pass", record.id)
                continue
            flags = FLAG_PINNED if record.pinned else 0
            for layer in missing:
                box.write(free.pop(0), record.id, layer, rows[layer], record.generation, flags)
            log.info("pushed %s generation %d (%d slot(s))%s", record.id, record.generation,
                     len(missing), self._where())

    def _note_problem(self, vector_id: str, problem: str) -> None:
        if self._problems.get(vector_id) != problem:
            log.warning("vector %s cannot go on this engine%s: %s", vector_id, self._where(),
                        problem)
        self._problems[vector_id] = problem

