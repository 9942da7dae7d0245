"""Slot manager: keeps an engine's mailbox holding the catalog, within the engine's slot budget.

The mailbox directory is the record of what is resident; nothing here caches it, so a restart
of either side is handled by reading it again (invariant 7):

- :meth:`SlotManager.reconcile` (every ``RECONCILE_PERIOD_S``) attaches to the engine, adopts
  vectors the engine holds that the catalog does not know (see :mod:`.adoption`; retired
  instead, each with a WARNING, when ``unknown_vectors="retire"`` is chosen), retires slots the
  catalog does not want (deleted vectors, old generations) and writes catalog vectors that are
  missing into free slots. It never evicts.
- :meth:`SlotManager.register` writes an upload, evicting least-recently-used idle vectors when
  the table is full; :meth:`SlotManager.remove` retires a vector's slots. Both write the catalog
  before any row goes into the mailbox, and write nothing more when that fails.

While the catalog cannot persist writes (``catalog.problem()``: the SQLite file removed or
replaced, 503 ``catalog_lost``; PostgreSQL unreachable) the API is unready, writes are refused
and the reconciler retires and adopts nothing.

A slot is reused only through the mailbox's two-phase protocol (invariant 6): retire, wait until
the engine has acknowledged and no request holds it, then write. A replace writes the new rows
into free slots and retires the old ones after (the engine binds the newest write of an
``(id, layer)``), so the vector never goes missing; only when the table has no room does it
retire its own idle slots first and reuse them.

Every mutation holds one asyncio lock, so an upload waiting on evictions and the reconcile loop
never pick slots at the same time. Engine contract: startup slots (``FLAG_STARTUP``) are
published before the engine arms its layers; nothing is written while no layer is armed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from hotwire.shared.mailbox import ACTIVE, FLAG_PINNED, ControlMailbox, MailboxError
from hotwire.shared.wire import VectorError

from .adoption import Adoption, UnknownVectors, plan_adoptions, verdict
from .catalog import CatalogLost, VectorRecord
from .catalog_store import CatalogStore
from .engine_link import EngineLink
from .errors import ApiError
from .placement import mailbox_rows, target_layers
from .snapshot import EngineView, SlotUse, TableSnapshot, reusable_slots
from .uploads import Upload

__all__ = ["EngineView", "Residency", "ResidencyState", "SlotManager"]

log = logging.getLogger("hotwire.control_api")

RECONCILE_PERIOD_S = 0.2
POLL_S = 0.01  # while waiting for the engine to release evicted slots


ResidencyState = Literal["resident", "queued", "not_resident", "incompatible", "no_engine"]


@dataclass(frozen=True)
class Residency:
    """Where a catalog vector stands on the attached engine."""

    state: ResidencyState
    reason: str | None
    slots: tuple[tuple[int, int], ...]  # (slot, slot layer)

    @property
    def resident(self) -> bool:
        return self.state == "resident"


class SlotManager:
    def __init__(self, catalog: CatalogStore, link: EngineLink, *, evict_timeout_s: float,
                 heartbeat_timeout_s: float, unknown_vectors: UnknownVectors = "adopt"):
        self.catalog = catalog
        self.link = link
        self.evict_timeout_s = evict_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.unknown_vectors = unknown_vectors
        self.lock = asyncio.Lock()
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

    def readiness_problem(self) -> str | None:
        """Why the engine cannot be steered through this API now, or ``None``.

        Ready: the catalog where it was opened, attached, layers armed, heartbeat fresh, the
        last reconcile pass clean, and the engine not stuck on a mailbox generation (see
        :class:`SyncWatch`).
        """
        lost = self.catalog.problem()
        if lost is not None:
            return f"{lost}; writes are refused"
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

    # Writing -----------------------------------------------------------------------------

    async def register(self, upload: Upload) -> tuple[VectorRecord, bool]:
        """Catalog and write ``upload``; returns the record and whether it is new.

        Raises :class:`ApiError` (409, 503, 507) or :class:`VectorError` (422), in which case
        the catalog is unchanged; so does a catalog write that fails (``sqlite3.Error``, e.g. a
        full disk), and then no row is written (vectors evicted for room come back by the
        reconciler, as after an eviction timeout).
        """
        async with self.lock:
            self._require_catalog()
            box = self._engine()
            fp = box.fingerprint
            layers = target_layers(upload.vector.shape, upload.layers, fp, box.armed_layers())
            rows = mailbox_rows(upload.vector, fp, layers)
            old = self.catalog.get(upload.vector_id)
            if old is not None and not upload.replace:
                raise ApiError(409, "exists", f"vector {upload.vector_id!r} exists (generation "
                               f"{old.generation}); send replace=true to replace it")
            table = TableSnapshot(box)
            if upload.vector_id in table.startup_ids():
                raise ApiError(409, "startup_vector", f"{upload.vector_id!r} is a startup vector "
                               "of the engine (HOTWIRE_VECTORS); pick another id")
            own = [u.slot for u in table.active.get(upload.vector_id, ())]
            slots = await self._make_room(box, table, len(rows), upload.vector_id)
            with self._catalog_write():
                record = self.catalog.put(upload.vector_id, upload.vector, dtype=upload.dtype,
                                          layers=None if upload.layers is None else layers,
                                          pinned=upload.pinned, metadata=upload.metadata)
            flags = FLAG_PINNED if record.pinned else 0
            for slot, (layer, row) in zip(slots, rows, strict=True):
                box.write(slot, record.id, layer, row, record.generation, flags)
            for slot in sorted(set(own) - set(slots)):
                box.retire(slot)
            self._problems.pop(record.id, None)
            log.info("registered %s generation %d in slots %s", record.id, record.generation, slots)
            return record, old is None

    async def remove(self, vector_id: str) -> None:
        async with self.lock:
            self._require_catalog()
            if self.catalog.get(vector_id) is None:
                box = self.link.box
                if box is not None and vector_id in TableSnapshot(box).startup_ids():
                    raise ApiError(409, "startup_vector", f"{vector_id!r} is a startup vector of "
                                   "the engine (HOTWIRE_VECTORS); remove it there")
                raise ApiError(404, "not_found", f"no vector {vector_id!r}")
            with self._catalog_write():
                self.catalog.delete(vector_id)
            self._problems.pop(vector_id, None)
            box = self.link.box
            if box is not None:
                for use in TableSnapshot(box).active.get(vector_id, ()):
                    box.retire(use.slot)
            log.info("removed %s", vector_id)

    def _require_catalog(self) -> None:
        lost = self.catalog.problem()
        if lost is not None:
            raise _lost_error(lost)

    @contextmanager
    def _catalog_write(self) -> Iterator[None]:
        try:
            yield
        except CatalogLost as e:
            raise _lost_error(str(e)) from None

    def _engine(self) -> ControlMailbox:
        box = self.link.box
        if box is None:
            raise ApiError(503, "no_engine", f"no engine attached ({self.link.problem}); vectors "
                           "are checked against the engine's model, so uploads wait for one")
        if not box.armed_layers():
            raise ApiError(503, "engine_starting", "the engine has not armed any layer yet")
        return box

    async def _make_room(self, box: ControlMailbox, table: TableSnapshot, need: int,
                         vector_id: str) -> list[int]:
        """``need`` writable slots, retiring the vector's own idle slots, then LRU idle vectors."""
        if len(table.reusable) >= need:
            return table.reusable[:need]
        coming = len(table.reusable) + len(table.draining)
        retire: list[int] = []
        own = table.active.get(vector_id, [])
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
        for slot in retire:
            box.retire(slot)
        if evicted:
            self.evicted_total += len(evicted)
            log.info("evicting %s to make room for %s", ", ".join(evicted), vector_id)
        return await self._await_reusable(box, need)

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

    async def _await_reusable(self, box: ControlMailbox, need: int) -> list[int]:
        deadline = time.monotonic() + self.evict_timeout_s
        while True:
            free = reusable_slots(box)
            if len(free) >= need:
                return free[:need]
            if box.replaced():
                raise ApiError(503, "engine_restarted", "the engine restarted while slots were "
                               "being freed; retry")
            if time.monotonic() >= deadline:
                raise ApiError(507, "evict_timeout", f"evicted slots were still in use by running "
                               f"requests after {self.evict_timeout_s:g}s; the evicted vectors stay "
                               "in the catalog; retry later")
            await asyncio.sleep(POLL_S)

    # Reconcile -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile forever; errors are logged and retried on the next period."""
        while True:
            async with self.lock:
                try:
                    self.reconcile()
                    self.reconcile_error = None
                except Exception as e:
                    if self.reconcile_error is None:
                        log.exception("reconcile failed; retrying every %gs", RECONCILE_PERIOD_S)
                    self.reconcile_error = f"{type(e).__name__}: {e}"
            await asyncio.sleep(RECONCILE_PERIOD_S)

    def reconcile(self) -> None:
        """One pass: (re)attach, adopt, retire what the catalog does not want, write what is
        missing. With the catalog lost, only the last: nothing is adopted or retired.

        Caller holds :attr:`lock`.
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
            with self._catalog_write():
                self.catalog.put(adoption.vector_id, adoption.vector, dtype="float32",
                                 layers=adoption.layers, pinned=adoption.pinned,
                                 metadata=self._adoption_note(box, adoption),
                                 generation=adoption.generation)
            self.adopted_total += 1
            self._unadoptable.pop(adoption.vector_id, None)
            if adoption.replaces is None:
                why = "the catalog does not know it"
            else:
                why = (f"the engine holds a later write than the catalog's generation "
                       f"{adoption.replaces}")
            log.warning("adopted %s generation %d from slots %s of the engine (%s); "
                        "set unknown_vectors=retire (HOTWIRE_UNKNOWN_VECTORS) to retire such "
                        "vectors instead", adoption.vector_id, adoption.generation,
                        list(adoption.slots), why)
        for vector_id, problem in problems.items():
            if self._unadoptable.get(vector_id) != problem:
                log.warning("left the engine's slots of %s alone: not in the catalog, and cannot "
                            "be adopted: %s", vector_id, problem)
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
            log.info("retired slot %d (%s, layer %d, generation %d): %s",
                     use.slot, use.vector_id, use.layer, use.generation, why)

    def _retire_unknown(self, box: ControlMailbox, use: SlotUse, found: str) -> None:
        """The explicit choice ``unknown_vectors="retire"``; generations stay monotonic."""
        with self._catalog_write():
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
            flags = FLAG_PINNED if record.pinned else 0
            for layer in missing:
                box.write(free.pop(0), record.id, layer, rows[layer], record.generation, flags)
            log.info("pushed %s generation %d (%d slot(s))", record.id, record.generation, len(missing))

    def _note_problem(self, vector_id: str, problem: str) -> None:
        if self._problems.get(vector_id) != problem:
            log.warning("vector %s cannot go on this engine: %s", vector_id, problem)
        self._problems[vector_id] = problem


def _lost_error(lost: str) -> ApiError:
    return ApiError(503, "catalog_lost", f"{lost}. Writes are refused so that nothing is "
                    "acknowledged that would not survive a restart; reads answer from memory and "
                    "the engine keeps its vectors. Put the state directory back and restart the "
                    "control API.")
