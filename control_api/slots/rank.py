"""One engine this control API feeds: its mailbox link, what cannot go on it, and reads of its table.

There is one :class:`Rank` per engine (per data-parallel rank); :mod:`.engines` holds them all
and takes the one lock every mutation holds. Two jobs act on a rank: the upload protocol
(:mod:`.registration`) and the reconcile pass (:mod:`.reconcile`). The mailbox directory is the
record of what is resident; nothing here caches it, so a restart of either side is handled by
reading it again (invariant 7).

Engine contract: startup slots (``FLAG_STARTUP``) are published before the engine arms its
layers; nothing is written while no layer is armed.
"""

from __future__ import annotations

import asyncio
import time

from hotwire.shared.mailbox import QUIET_S, MailboxError
from hotwire.shared.wire import VectorError

from ..store.catalog import CatalogStore
from ..store.records import VectorRecord
from .engine_link import EngineLink
from .placement import target_layers
from .residency import Residency
from .snapshot import EngineSnapshot, TableSnapshot

APPLY_POLL_S = 0.002  # while waiting for the engine to take in a write (its mailbox thread: every 20 ms)


class Rank:
    """The slot table of one engine: ``rank`` is its data-parallel rank (0 without DP).

    ``problems``: why a catalog vector cannot go on the attached engine (found by the reconcile
    pass, cleared when the vector is written or deleted, or the engine changes).
    """

    def __init__(self, catalog: CatalogStore, link: EngineLink, *, heartbeat_timeout_s: float,
                 rank: int = 0):
        self.catalog = catalog
        self.link = link
        self.rank = rank
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.evicted_total = 0
        self.adopted_total = 0
        self.reconcile_error: str | None = None
        self.problems: dict[str, str] = {}

    def where(self) -> str:
        """The rank, for log lines: nothing without DP."""
        return "" if self.rank == 0 else f" (dp rank {self.rank})"

    # Reading -----------------------------------------------------------------------------

    def view(self) -> EngineSnapshot | None:
        """The attached engine's table now; None when detached or the file cannot be read (the
        next reconcile pass detaches from it and says why)."""
        box = self.link.box
        if box is None:
            return None
        try:
            return EngineSnapshot.read(box)
        except MailboxError:
            return None

    def engine_problem(self) -> str | None:
        """Why this engine cannot be steered through this API now, or ``None``.

        Ready: attached, layers armed, heartbeat fresh, the last reconcile pass clean, and the
        engine not stuck on a mailbox generation (see :class:`.engine_link.SyncWatch`).
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

    def residency(self, record: VectorRecord, view: EngineSnapshot | None) -> Residency:
        """Resident once every row is in the table of an engine that beats and the engine has
        taken each in (acked it): a request it admits from then on is steered by it. Rows the
        engine has not taken in yet, or written into the table of an engine whose heartbeat is
        stale, are ``queued``: nothing applies them until it beats again."""
        if view is None:
            return Residency("no_engine", self.link.problem, ())
        if not view.armed:
            return Residency("not_resident", "the engine has not armed any layer yet", ())
        try:
            layers = target_layers(record.shape, record.layers, view.fingerprint, view.armed)
        except VectorError as e:
            return Residency("incompatible", e.detail, ())
        uses = [u for u in view.table.active.get(record.id, ())
                if u.generation == record.generation and u.layer in layers]
        slots = tuple(sorted((u.slot, u.layer) for u in uses))
        if record.id in self.problems:
            return Residency("incompatible", self.problems[record.id], slots)
        if view.heartbeat_age_s > self.heartbeat_timeout_s:
            return Residency("queued", f"engine heartbeat is {view.heartbeat_age_s:.0f}s old; the "
                             "vector will be applied when the engine beats again", slots)
        if {layer for _, layer in slots} >= set(layers):
            if all(u.acked for u in uses):
                return Residency("resident", None, slots)
            return Residency("queued", "written, but the engine has not taken it in (its heartbeat "
                             f"is {view.heartbeat_age_s:.1f}s old); it is applied when the engine "
                             "reads its mailbox", slots)
        return Residency("not_resident", "waiting for free slots (evicted, or the table is full)",
                         slots)

    def startup_ids(self) -> set[str]:
        box = self.link.box
        return set() if box is None else TableSnapshot(box).startup_ids()

    def writable(self) -> bool:
        """Attached with layers armed: uploads are written here now (others get the catalog
        from the reconciler when they attach or arm)."""
        box = self.link.box
        try:
            return box is not None and bool(box.armed_layers())
        except MailboxError:
            return False

    def written(self) -> int | None:
        """The generation written so far (None without a mailbox)."""
        box = self.link.box
        return None if box is None else box.generations()[1]

    # Writing (the caller holds the collection's lock) ------------------------------------

    def retire_vector(self, vector_id: str) -> None:
        """Retire every live slot of ``vector_id`` (it was deleted from the catalog)."""
        self.problems.pop(vector_id, None)
        box = self.link.box
        if box is not None:
            for use in TableSnapshot(box).active.get(vector_id, ()):
                box.retire(use.slot)

    async def await_applied(self, target: int, deadline: float) -> None:
        """Wait (until the monotonic ``deadline``) for the engine to take in generation ``target``:
        it reads its mailbox on a thread of its own, between steps (every
        ``engine_plugin.core_sync.POLL_S``), so once this
        returns, every request it admits from then on sees the write. An engine that has missed
        its last beats (:data:`~hotwire.shared.mailbox.QUIET_S`: dead, or stopped) is not waited
        for: what it did not take in reads ``queued``."""
        box = self.link.box
        quiet = min(QUIET_S, self.heartbeat_timeout_s)
        while box is not None and not box.replaced() and box.heartbeat_age_s() <= quiet:
            if box.generations()[0] >= target or time.monotonic() >= deadline:
                return
            await asyncio.sleep(APPLY_POLL_S)
