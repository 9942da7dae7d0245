"""Every engine one control API feeds: the data-parallel ranks of one vLLM deployment.

vLLM's engine core of data-parallel rank N creates its mailbox at ``<mailbox>.dpN`` (rank 0, and
an engine without DP, at ``<mailbox>`` itself). :class:`Engines` keeps one :class:`SlotManager`
(its own link, slot table and budget) per rank, found by scanning for those files on every
reconcile pass, so ranks may start in any order and restart independently, each with its own
epoch. A rank whose file is removed is forgotten; rank 0 is always there (unready while absent).

An upload is all or nothing over the ranks that can take one now (attached, layers armed): it
is checked against each, room is planned on each before anything is evicted anywhere, and if
any rank has no room the upload is 507 and nothing changes (catalog and every table). Then the
catalog is written once and the rows go to every such rank. A rank that is detached or not yet
armed gets the catalog from its reconcile passes when it comes up, as a restarted engine does;
until then the vector is reported ``not_resident`` (or ``no_engine``) on that rank.

One asyncio lock (:attr:`Engines.lock`) covers every mutation on every rank and the reconcile
loop, so slots are never picked by two tasks at once.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .adoption import UnknownVectors
from .catalog import VectorRecord
from .catalog_store import CatalogStore
from .engine_link import EngineLink
from .errors import ApiError
from .slots import RECONCILE_PERIOD_S, EngineView, Residency, SlotManager, catalog_write
from .uploads import Upload

APPLY_WAIT_S = 2.0  # the longest an upload or a delete waits for the engine to take it in

log = logging.getLogger("hotwire.control_api")


def rank_paths(mailbox: Path) -> dict[int, Path]:
    """The mailbox files of every data-parallel rank there is now: ``{0: mailbox}`` always, plus
    each ``<mailbox>.dpN`` (N > 0) that exists."""
    found = {0: mailbox}
    pattern = re.compile(re.escape(mailbox.name) + r"\.dp([1-9][0-9]*)")
    try:
        names = [p.name for p in mailbox.parent.iterdir()]
    except OSError:
        return found
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            found[int(match.group(1))] = mailbox.parent / name
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class RankResidency:
    rank: int
    residency: Residency


@dataclass(frozen=True)
class VectorResidency:
    """A vector on every rank, and the summary of them all: resident only when resident on
    every rank; otherwise the state of the first rank that lacks it, with each lacking rank's
    reason. With one rank, the summary is that rank's residency, as it always was."""

    overall: Residency
    ranks: tuple[RankResidency, ...]


class Engines:
    """The per-rank slot managers of one mailbox path, and the operations that span them."""

    def __init__(self, catalog: CatalogStore, mailbox: Path, *, evict_timeout_s: float,
                 heartbeat_timeout_s: float, unknown_vectors: UnknownVectors = "adopt"):
        self.catalog = catalog
        self.mailbox = mailbox
        self.evict_timeout_s = evict_timeout_s
        self._options = dict(evict_timeout_s=evict_timeout_s,
                             heartbeat_timeout_s=heartbeat_timeout_s,
                             unknown_vectors=unknown_vectors)
        self.lock = asyncio.Lock()
        self.ranks: dict[int, SlotManager] = {}
        self.scan()

    def __iter__(self) -> Iterator[SlotManager]:
        return iter(list(self.ranks.values()))

    @property
    def primary(self) -> SlotManager:
        """Rank 0: the engine of a deployment without DP."""
        return self.ranks[0]

    def scan(self) -> None:
        """Follow the rank files: a new ``.dpN`` gets a manager, a removed one is forgotten."""
        paths = rank_paths(self.mailbox)
        for rank in [r for r in self.ranks if r not in paths]:
            log.warning("dp rank %d: mailbox %s was removed; no longer fed", rank,
                        self.ranks[rank].link.path)
            self.ranks.pop(rank).link.close()
        for rank, path in paths.items():
            if rank not in self.ranks:
                if rank:
                    log.info("dp rank %d: found mailbox %s", rank, path)
                self.ranks[rank] = SlotManager(self.catalog, EngineLink(path), rank=rank,
                                               **self._options)
        self.ranks = dict(sorted(self.ranks.items()))

    def close(self) -> None:
        for manager in self:
            manager.link.close()

    # Reading -----------------------------------------------------------------------------

    def views(self) -> dict[int, EngineView | None]:
        return {rank: manager.view() for rank, manager in self.ranks.items()}

    def readiness_problem(self) -> str | None:
        """Why this API cannot steer every rank now, or ``None``: the catalog writable, and
        each rank ready (see :meth:`SlotManager.engine_problem`)."""
        lost = self.catalog.problem()
        if lost is not None:
            return f"{lost}; writes are refused"
        problems = [(m.rank, p) for m in self if (p := m.engine_problem()) is not None]
        return self._per_rank(problems)

    def residency(self, record: VectorRecord,
                  views: dict[int, EngineView | None]) -> VectorResidency:
        ranks = tuple(RankResidency(rank, manager.residency(record, views.get(rank)))
                      for rank, manager in self.ranks.items())
        lacking = [r for r in ranks if not r.residency.resident]
        if len(ranks) == 1 or not lacking:
            return VectorResidency(ranks[0].residency, ranks)
        first = lacking[0].residency
        reason = "; ".join(f"dp rank {r.rank}: {r.residency.reason or r.residency.state}"
                           for r in lacking)
        return VectorResidency(Residency(first.state, reason, ranks[0].residency.slots), ranks)

    def _per_rank(self, problems: list[tuple[int, str]]) -> str | None:
        if not problems:
            return None
        if len(self.ranks) == 1:
            return problems[0][1]
        return "; ".join(f"dp rank {rank}: {problem}" for rank, problem in problems)

    # Writing -----------------------------------------------------------------------------

    async def register(self, upload: Upload) -> tuple[VectorRecord, bool]:
        """Catalog ``upload`` and write it into every rank that can take it now; returns the
        record and whether it is new.

        Raises :class:`ApiError` (409, 503, 507) or :class:`VectorError` (422), in which case
        the catalog is unchanged and no row is written anywhere; so does a catalog write that
        fails (vectors evicted for room come back by the reconciler, as after an eviction
        timeout).
        """
        vector_id = upload.vector_id
        async with self.lock:
            self._require_catalog()
            managers = [m for m in self if m.writable()] or [self._first_attached()]
            placements = {m.rank: m.place(upload) for m in managers}
            old = self.catalog.get(vector_id)
            if old is not None and not upload.replace:
                raise ApiError(409, "exists", f"vector {vector_id!r} exists (generation "
                               f"{old.generation}); send replace=true to replace it")
            lacking: list[tuple[int, ApiError]] = []
            for manager in managers:
                try:
                    manager.plan_room(placements[manager.rank], vector_id)
                except ApiError as e:
                    if e.status != 507:
                        raise
                    lacking.append((manager.rank, e))
            if lacking:
                raise self._no_room(lacking)
            for manager in managers:
                manager.free(placements[manager.rank], vector_id)
            deadline = time.monotonic() + self.evict_timeout_s
            for manager in managers:
                await manager.await_room(placements[manager.rank], deadline)
            first = placements[managers[0].rank]
            with catalog_write():
                record = self.catalog.put(vector_id, upload.vector, dtype=upload.dtype,
                                          layers=None if upload.layers is None else first.layers,
                                          pinned=upload.pinned, metadata=upload.metadata,
                                          replace=upload.replace)
            for manager in managers:
                manager.write(placements[manager.rank], record)
            written = [(m, m.written()) for m in managers]
        await self._await_applied(written)
        return record, old is None

    async def remove(self, vector_id: str) -> None:
        """Delete ``vector_id`` from the catalog and retire its slots on every rank."""
        async with self.lock:
            self._require_catalog()
            if self.catalog.get(vector_id) is None:
                if any(vector_id in m.startup_ids() for m in self):
                    raise ApiError(409, "startup_vector", f"{vector_id!r} is a startup vector of "
                                   "the engine (HOTWIRE_VECTORS); remove it there")
                raise ApiError(404, "not_found", f"no vector {vector_id!r}")
            with catalog_write():
                self.catalog.delete(vector_id)
            for manager in self:
                manager.retire_vector(vector_id)
            written = [(m, m.written()) for m in self]
            log.info("removed %s", vector_id)
        await self._await_applied(written)

    async def _await_applied(self, written: list[tuple[SlotManager, int | None]]) -> None:
        """Return once every rank written to has taken the write in (or :data:`APPLY_WAIT_S`
        passed): a response then means the next request sees the change."""
        deadline = time.monotonic() + APPLY_WAIT_S
        for manager, target in written:
            if target is not None:
                await manager.await_applied(target, deadline)

    def _require_catalog(self) -> None:
        refusal = self.catalog.write_refusal()
        if refusal is not None:
            raise refusal

    def _first_attached(self) -> SlotManager:
        """No rank can take an upload: the one whose :meth:`SlotManager.require_engine` says
        why (an attached rank that is starting, else rank 0)."""
        return next((m for m in self if m.link.box is not None), self.primary)

    def _no_room(self, lacking: list[tuple[int, ApiError]]) -> ApiError:
        if len(self.ranks) == 1:
            return lacking[0][1]
        codes = {e.code for _, e in lacking}
        every = ", ".join(str(rank) for rank in self.ranks)
        message = "; ".join(f"dp rank {rank}: {e.message}" for rank, e in lacking)
        return ApiError(507, codes.pop() if len(codes) == 1 else "no_space",
                        f"not written to any rank (ranks {every}), the catalog is unchanged: "
                        f"{message}")

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
        for manager in self:
            try:
                manager.reconcile()
                manager.reconcile_error = None
            except Exception as e:
                if manager.reconcile_error is None:
                    log.exception("reconcile failed%s; retrying every %gs",
                                  "" if manager.rank == 0 else f" (dp rank {manager.rank})",
                                  RECONCILE_PERIOD_S)
                manager.reconcile_error = f"{type(e).__name__}: {e}"
