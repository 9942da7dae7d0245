"""Which replica's engines hold a vector: this replica's live view, and the others' reports.

With a catalog shared by replicas (PostgreSQL: its ``replica_board``) each control API publishes,
about every :data:`PUBLISH_PERIOD_S`, where every catalog vector stands on its own engines
(:meth:`ReplicaReports.run`, one row per vector: the summary over its DP ranks), and
``GET /steer/vectors/{id}`` lists every replica's last report. This replica's entry is always
read live from its mailboxes, never from the database. With SQLite (one replica) the list is
this replica alone.

A report is ``stale`` when its replica has not published for :data:`STALE_AFTER_S` (it may be
down) or it is not about the catalog's current generation of the vector (the replica has not
caught up with a replace yet, or has not mentioned the vector at all): do not read it as where
the current vector stands.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ..errors import ControlError
from ..store.records import VectorRecord
from ..store.replica_board import ReplicaBoard, Residence
from .engines import Engines

log = logging.getLogger("hotwire.control_api")

PUBLISH_PERIOD_S = 1.0
STALE_AFTER_S = 5.0


@dataclass(frozen=True)
class ReplicaState:
    replica: str
    generation: int | None
    state: str | None
    reason: str | None
    age_s: float
    stale: bool


class ReplicaReports:
    """``board``: where the replicas sharing the catalog report, or ``None`` (one replica)."""

    def __init__(self, replica: str, engines: Engines, board: ReplicaBoard | None):
        self.replica, self.engines, self.board = replica, engines, board
        self.publish_error: str | None = None

    @property
    def shared(self) -> bool:
        """Other replicas read this one's reports: :meth:`run` has something to do."""
        return self.board is not None

    def report(self) -> dict[str, Residence]:
        """Every catalog vector as this replica's engines hold it now."""
        views = self.engines.views()
        report = {}
        for record in self.engines.catalog.records().values():
            where = self.engines.residency(record, views).overall
            report[record.id] = Residence(record.generation, where.state, where.reason)
        return report

    async def run(self) -> None:
        """Publish this replica's report forever. Failures (the database unreachable) are
        logged once per distinct error, at WARNING, and retried on the next period."""
        assert self.board is not None
        while True:
            try:
                await asyncio.to_thread(self.board.publish, self.replica, self.report())
                if self.publish_error is not None:
                    log.info("residency report of replica %s published again", self.replica)
                self.publish_error = None
            except Exception as e:
                message = e.message if isinstance(e, ControlError) else f"{type(e).__name__}: {e}"
                if message != self.publish_error:
                    log.warning("cannot publish the residency report of replica %s (%s); "
                                "retrying every %gs", self.replica, message, PUBLISH_PERIOD_S)
                self.publish_error = message
            await asyncio.sleep(PUBLISH_PERIOD_S)

    async def of(self, record: VectorRecord, state: str, reason: str | None) -> list[ReplicaState]:
        """Every replica's state of ``record``, by replica name; ``state`` and ``reason`` are
        this replica's, read live. While the board is unreachable, this replica's only."""
        mine = ReplicaState(self.replica, record.generation, state, reason, 0.0, False)
        if self.board is None:
            return [mine]
        try:
            reports = await asyncio.to_thread(self.board.reports, record.id)
        except ControlError:
            return [mine]
        others = [ReplicaState(r.replica, r.generation, r.state, r.reason, r.age_s,
                               r.age_s > STALE_AFTER_S or r.state is None
                               or r.generation != record.generation)
                  for r in reports if r.replica != self.replica]
        return sorted([mine, *others], key=lambda r: r.replica)
