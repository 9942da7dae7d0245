"""Every engine one control API feeds: the data-parallel ranks of one vLLM deployment.

vLLM's engine core of data-parallel rank N creates its mailbox at ``<mailbox>.dpN`` (rank 0, and
an engine without DP, at ``<mailbox>`` itself: :func:`hotwire.shared.mailbox.dp_mailbox_path`).
:class:`Engines` keeps one :class:`.rank.Rank` (its own link, slot table and budget) and its
:class:`.reconcile.Reconciler` per rank, found by scanning for those files on every reconcile
pass, so ranks may start in any order and restart independently, each with its own
epoch. A rank whose file is removed is forgotten; rank 0 is always there (unready while absent).

An upload is all or nothing over the ranks that can take one now (attached, layers armed): it
is checked against each, room is planned on each before anything is evicted anywhere, and if
any rank has no room the upload is refused (``NoRoom``) and nothing changes (catalog and every
table). Then the catalog is written once and the rows go to every such rank (the steps are
:mod:`.registration`'s). A rank that is detached or not yet armed gets the catalog from its
reconcile passes when it comes up, as a restarted engine does; until then the vector is
reported ``not_resident`` (or ``no_engine``) on that rank.

One asyncio lock (:attr:`Engines.lock`) covers every mutation on every rank and the reconcile
loop, so slots are never picked by two tasks at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from hotwire.shared.mailbox import rank_mailboxes

from ..errors import Conflict, NotFound
from ..store.catalog import CatalogStore
from ..store.records import VectorRecord
from .adoption import UnknownVectors
from .engine_link import EngineLink
from .rank import Rank
from .reconcile import RECONCILE_PERIOD_S, Reconciler
from .registration import Upload, register
from .residency import RankResidency, VectorResidency
from .snapshot import EngineSnapshot

APPLY_WAIT_S = 2.0  # the longest an upload or a delete waits for the engine to take it in

log = logging.getLogger("hotwire.control_api")


class Engines:
    """The ranks of one mailbox path, and the operations that span them."""

    def __init__(self, catalog: CatalogStore, mailbox: Path, *, evict_timeout_s: float,
                 heartbeat_timeout_s: float, unknown_vectors: UnknownVectors = "adopt"):
        self.catalog = catalog
        self.mailbox = mailbox
        self.evict_timeout_s = evict_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.unknown_vectors: UnknownVectors = unknown_vectors
        self.lock = asyncio.Lock()
        self.ranks: dict[int, Rank] = {}
        self._reconcilers: dict[int, Reconciler] = {}
        self.scan()

    def __iter__(self) -> Iterator[Rank]:
        return iter(list(self.ranks.values()))

    @property
    def primary(self) -> Rank:
        """Rank 0: the engine of a deployment without DP."""
        return self.ranks[0]

    def scan(self) -> None:
        """Follow the rank files: a new ``.dpN`` gets a rank, a removed one is forgotten."""
        paths = rank_mailboxes(self.mailbox)
        for rank in [r for r in self.ranks if r not in paths]:
            log.warning("dp rank %d: mailbox %s was removed; no longer fed", rank,
                        self.ranks[rank].link.path)
            self._reconcilers.pop(rank)
            self.ranks.pop(rank).link.close()
        for rank, path in paths.items():
            if rank not in self.ranks:
                if rank:
                    log.info("dp rank %d: found mailbox %s", rank, path)
                self.ranks[rank] = Rank(self.catalog, EngineLink(path), rank=rank,
                                        heartbeat_timeout_s=self.heartbeat_timeout_s)
                self._reconcilers[rank] = Reconciler(self.ranks[rank], self.unknown_vectors)
        self.ranks = dict(sorted(self.ranks.items()))

    def close(self) -> None:
        for rank in self:
            rank.link.close()

    # Reading -----------------------------------------------------------------------------

    def views(self) -> dict[int, EngineSnapshot | None]:
        return {number: rank.view() for number, rank in self.ranks.items()}

    def readiness_problem(self) -> str | None:
        """Why this API cannot steer every rank now, or ``None``: the catalog writable, and
        each rank ready (see :meth:`.rank.Rank.engine_problem`)."""
        lost = self.catalog.problem()
        if lost is not None:
            return f"{lost}; writes are refused"
        problems = [(r.rank, p) for r in self if (p := r.engine_problem()) is not None]
        if not problems:
            return None
        if len(self.ranks) == 1:
            return problems[0][1]
        return "; ".join(f"dp rank {rank}: {problem}" for rank, problem in problems)

    def residency(self, record: VectorRecord,
                  views: dict[int, EngineSnapshot | None]) -> VectorResidency:
        return VectorResidency.of(tuple(RankResidency(number, rank.residency(record, views.get(number)))
                                        for number, rank in self.ranks.items()))

    # Writing -----------------------------------------------------------------------------

    async def register(self, upload: Upload) -> tuple[VectorRecord, bool]:
        """Catalog ``upload`` and write it into every rank that can take it now (see
        :func:`.registration.register`); returns the record and whether it is new.

        On a refusal (a domain error, or :class:`VectorError` for a vector that does not fit)
        the catalog is unchanged and no row is written anywhere; so on a catalog write that
        fails (vectors evicted for room come back by the reconciler, as after an eviction
        timeout).
        """
        async with self.lock:
            self.catalog.require_writable()
            ranks = [r for r in self if r.writable()] or [self._first_attached()]
            record, created = await register(upload, ranks, self.catalog,
                                             evict_timeout_s=self.evict_timeout_s,
                                             fed=list(self.ranks))
            written = [(r, r.written()) for r in ranks]
        await self._await_applied(written)
        return record, created

    async def remove(self, vector_id: str) -> None:
        """Delete ``vector_id`` from the catalog and retire its slots on every rank."""
        async with self.lock:
            self.catalog.require_writable()
            if self.catalog.get(vector_id) is None:
                if any(vector_id in r.startup_ids() for r in self):
                    raise Conflict("startup_vector", f"{vector_id!r} is a startup vector of the "
                                   "engine (HOTWIRE_VECTORS); remove it there")
                raise NotFound("not_found", f"no vector {vector_id!r}")
            self.catalog.delete(vector_id)
            for rank in self:
                rank.retire_vector(vector_id)
            written = [(r, r.written()) for r in self]
            log.info("removed %s", vector_id)
        await self._await_applied(written)

    async def _await_applied(self, written: list[tuple[Rank, int | None]]) -> None:
        """Return once every rank written to has taken the write in (or :data:`APPLY_WAIT_S`
        passed): a response then means the next request sees the change."""
        deadline = time.monotonic() + APPLY_WAIT_S
        for rank, target in written:
            if target is not None:
                await rank.await_applied(target, deadline)

    def _first_attached(self) -> Rank:
        """No rank can take an upload: the one whose refusal says why (an attached rank that
        is starting, else rank 0)."""
        return next((r for r in self if r.link.box is not None), self.primary)

    # Reconcile -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile every rank forever; a rank's errors are logged, kept as its
        ``reconcile_error`` (unready) and retried on the next period."""
        while True:
            async with self.lock:
                self.reconcile()
            await asyncio.sleep(RECONCILE_PERIOD_S)

    def reconcile(self) -> None:
        """One pass over the ranks, new ones included. Caller holds :attr:`lock`."""
        self.scan()
        for number, rank in self.ranks.items():
            try:
                self._reconcilers[number].reconcile()
                rank.reconcile_error = None
            except Exception as e:
                if rank.reconcile_error is None:
                    log.exception("reconcile failed%s; retrying every %gs", rank.where(),
                                  RECONCILE_PERIOD_S)
                rank.reconcile_error = f"{type(e).__name__}: {e}"
