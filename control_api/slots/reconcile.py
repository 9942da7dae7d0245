"""The reconcile pass: keeps one engine's table holding the catalog, within its slot budget.

:meth:`Reconciler.reconcile` runs on every rank every :data:`RECONCILE_PERIOD_S` (and once
before the API serves): it attaches to the engine, adopts vectors the engine holds that the
catalog does not know (see :mod:`.adoption`; retired instead, each with a WARNING, when
``unknown_vectors="retire"`` is chosen), retires slots the catalog does not want (deleted
vectors, old generations) and writes catalog vectors that are missing into free slots. It never
evicts: making room is the upload protocol's job (:mod:`.registration`).

While the catalog cannot persist writes (``catalog.problem()``: the SQLite file removed or
replaced, ``catalog_lost``; PostgreSQL unreachable, ``catalog_unavailable``) the API is unready,
writes are refused and the pass retires and adopts nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from hotwire.shared.mailbox import ACTIVE, FLAG_PINNED, ControlMailbox
from hotwire.shared.wire import VectorError

from ..store.records import StaleGeneration, VectorRecord
from .adoption import Adoption, UnknownVectors, plan_adoptions, verdict
from .placement import mailbox_rows, target_layers
from .rank import Rank
from .snapshot import SlotUse, TableSnapshot

log = logging.getLogger("hotwire.control_api")

RECONCILE_PERIOD_S = 0.2


class Reconciler:
    """The reconcile pass of one rank; ``unknown_vectors`` says what becomes of engine vectors
    the catalog does not know."""

    def __init__(self, rank: Rank, unknown_vectors: UnknownVectors = "adopt"):
        self.rank = rank
        self.unknown_vectors = unknown_vectors
        self._unadoptable: dict[str, str] = {}  # id -> why its slots are left alone

    def reconcile(self) -> None:
        """One pass: (re)attach, adopt, retire what the catalog does not want, write what is
        missing. With the catalog lost or unreachable, only the last: nothing is adopted or
        retired.

        Caller holds the collection's lock.
        """
        rank = self.rank
        if rank.link.refresh():
            rank.problems.clear()
            self._unadoptable.clear()
        box = rank.link.box
        lost = rank.catalog.problem()
        if box is None:
            return
        rank.link.observe_sync()
        armed = box.armed_layers()
        if not armed:
            return
        if lost is None and self.unknown_vectors == "adopt":
            self._adopt(box, TableSnapshot(box))
        fp = box.fingerprint
        records = rank.catalog.records()
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
        rank, catalog = self.rank, self.rank.catalog
        adoptions, problems = plan_adoptions(box, table, catalog)
        for adoption in adoptions:
            note = self._adoption_note(box, adoption)
            try:
                record = catalog.put(adoption.vector_id, adoption.vector, dtype="float32",
                                     layers=adoption.layers, pinned=adoption.pinned,
                                     metadata=note, generation=adoption.generation)
            except StaleGeneration as e:
                log.info("not adopting %s%s: the catalog holds a newer write (%s); this "
                         "engine's rows are replaced", adoption.vector_id, rank.where(), e)
                continue
            self._unadoptable.pop(adoption.vector_id, None)
            if record.metadata != note:
                log.info("%s generation %d%s: already adopted by another writer of the catalog",
                         adoption.vector_id, adoption.generation, rank.where())
                continue
            rank.adopted_total += 1
            if adoption.replaces is None:
                why = "the catalog does not know it"
            else:
                why = (f"the engine holds a later write than the catalog's generation "
                       f"{adoption.replaces}")
            log.warning("adopted %s generation %d from slots %s of the engine%s (%s); "
                        "set unknown_vectors=retire (HOTWIRE_UNKNOWN_VECTORS) to retire such "
                        "vectors instead", adoption.vector_id, adoption.generation,
                        list(adoption.slots), rank.where(), why)
        for vector_id, problem in problems.items():
            if self._unadoptable.get(vector_id) != problem:
                log.warning("left the engine's slots of %s alone%s: not in the catalog, and "
                            "cannot be adopted: %s", vector_id, rank.where(), problem)
            self._unadoptable[vector_id] = problem

    def _adoption_note(self, box: ControlMailbox, adoption: Adoption) -> dict[str, object]:
        note: dict[str, object] = {
            "mailbox": str(self.rank.link.path), "epoch": f"{box.epoch:x}",
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
            found = verdict(use, record, self.rank.catalog.high_water(use.vector_id))
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
                     use.slot, self.rank.where(), use.vector_id, use.layer, use.generation, why)

    def _retire_unknown(self, box: ControlMailbox, use: SlotUse, found: str) -> None:
        """The explicit choice ``unknown_vectors="retire"``; generations stay monotonic."""
        self.rank.catalog.reserve_generation(use.vector_id, use.generation)
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
            if layers is None or record.id in self.rank.problems:
                continue
            have = {u.layer for u in table.active.get(record.id, ()) if u.generation == record.generation}
            missing = [layer for layer in layers if layer not in have]
            if not missing or len(missing) > len(free):
                continue
            try:
                rows = dict(mailbox_rows(self.rank.catalog.load(record.id), fp, layers))
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
                     len(missing), self.rank.where())

    def _note_problem(self, vector_id: str, problem: str) -> None:
        problems = self.rank.problems
        if problems.get(vector_id) != problem:
            log.warning("vector %s cannot go on this engine%s: %s", vector_id, self.rank.where(),
                        problem)
        problems[vector_id] = problem
