"""Where replicas sharing a catalog report which vectors their engines hold.

A catalog shared by replicas (PostgreSQL) has a :class:`ReplicaBoard`: each replica publishes
its residency report there (every catalog vector, as its own engines hold it) and reads the
others'. A catalog of one replica (SQLite) has none: ``CatalogStore.replica_board`` is ``None``.

:class:`PostgresReplicaBoard` keeps the reports in ``hotwire_replicas`` (one row per replica,
with when it last published, by the database's clock) and ``hotwire_residency`` (one row per
replica and vector), on the catalog's :class:`~.postgres_db.Database`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # psycopg is an optional extra; nothing here needs it without PostgreSQL
    import psycopg

    from .postgres_db import Database

FORGET_REPLICA_S = 3600.0  # a replica that published nothing for this long is dropped


@dataclass(frozen=True)
class Residence:
    """Where one catalog vector stands on one replica's engine."""

    generation: int
    state: str  # a ResidencyState of the slot tables: resident, not_resident, incompatible, ...
    reason: str | None = None


@dataclass(frozen=True)
class ReplicaResidence:
    """One replica's last published report on one vector; ``state`` is ``None`` when that
    replica's report does not mention the vector."""

    replica: str
    generation: int | None
    state: str | None
    reason: str | None
    age_s: float  # since that replica last published (any vector), by the database's clock


class ReplicaBoard(Protocol):
    """Both calls raise ``Unavailable`` while the board cannot be reached."""

    def publish(self, replica: str, report: Mapping[str, Residence]) -> None:
        """Replace ``replica``'s report with ``report`` and mark the replica seen."""

    def reports(self, vector_id: str) -> list[ReplicaResidence]:
        """Every known replica's last report on ``vector_id``, by replica name."""


class PostgresReplicaBoard:
    """The reports of the replicas of one PostgreSQL catalog."""

    def __init__(self, db: Database):
        self.db = db
        self._published: dict[str, dict[str, Residence]] = {}  # replica -> its last report

    def publish(self, replica: str, report: Mapping[str, Residence],
                forget_after_s: float = FORGET_REPLICA_S) -> None:
        """Only rows that changed since this process's last publish are written; replicas
        silent for ``forget_after_s`` are dropped."""
        report = dict(report)
        before = self._published.get(replica, {})
        every = [(replica, vid, r.generation, r.state, r.reason) for vid, r in report.items()]
        changed = [row for row in every if before.get(row[1]) != report[row[1]]]

        def write(conn: psycopg.Connection) -> None:
            (new,) = conn.execute(
                "INSERT INTO hotwire_replicas AS r (replica, seen_at) VALUES (%s, now()) "
                "ON CONFLICT (replica) DO UPDATE SET seen_at = now() RETURNING r.xmax = 0",
                (replica,)).fetchone()  # xmax 0: inserted, i.e. no rows of it survived
            rows = every if new else changed
            if new or replica not in self._published or set(before) - set(report):
                conn.execute("DELETE FROM hotwire_residency WHERE replica = %s "
                             "AND NOT (vector_id = ANY(%s))", (replica, list(report)))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO hotwire_residency (replica, vector_id, generation, state, reason) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (replica, vector_id) DO UPDATE SET "
                    "generation = excluded.generation, state = excluded.state, "
                    "reason = excluded.reason", rows)
            conn.execute("DELETE FROM hotwire_replicas WHERE seen_at < now() - make_interval("
                         "secs => %s)", (forget_after_s,))

        self.db.write(write)
        self._published[replica] = report

    def reports(self, vector_id: str) -> list[ReplicaResidence]:
        """A replica that has not mentioned the vector has ``state=None``: for
        ``GET /steer/vectors/{id}``."""
        rows = self.db.run(lambda conn: conn.execute(
            "SELECT r.replica, s.generation, s.state, s.reason, "
            "extract(epoch FROM now() - r.seen_at)::float8 FROM hotwire_replicas r "
            "LEFT JOIN hotwire_residency s ON s.replica = r.replica AND s.vector_id = %s "
            "ORDER BY r.replica", (vector_id,)).fetchall())
        return [ReplicaResidence(*row) for row in rows]
