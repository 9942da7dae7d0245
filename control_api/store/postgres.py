"""Vector catalog in PostgreSQL, shared by the control APIs of N replicas.

Same contract as :class:`.catalog.Catalog` (see :mod:`.catalog_store`), plus what sharing needs:

- Every write takes the one row of ``hotwire_catalog_state`` first (``seq = seq + 1``), so writes
  from all replicas commit in ``seq`` order, and stamps the id's ``changed_seq`` with it. An id's
  generation comes from ``INSERT ... ON CONFLICT ... RETURNING`` on its ``hotwire_generations``
  row in the same transaction: two replicas can never hand out the same generation.
- Every write runs ``pg_notify('hotwire_catalog', id)`` in its transaction. A listener thread on
  its own connection re-reads a notified id into memory, and every ``poll_s`` compares the
  catalog's ``seq`` with the last one it read and re-reads the ids changed since, so a
  notification missed while the listener reconnected still arrives. The slot manager's
  reconcile loop reads :meth:`records`, so each replica's engine follows the shared catalog.
- Memory is updated per id only by a change at least as new (by ``seq``) as the one it holds, so
  the listener and this process's own commits may apply in any order.
- A create (``put(replace=False)``) checks that the id has no record after taking the ``seq``
  row, so of two replicas creating one id at once the second gets :class:`.catalog.VectorExists`
  (409), never a silent replace; an adoption (``put(generation=G)``) of a record already at
  ``G`` is a no-op, so replicas adopting the same engine vector at once both succeed.
- While the database is unreachable the last records read stay in memory (the engine keeps its
  vectors), :meth:`problem` says why, writes raise ``ApiError(503, "catalog_unavailable")``, and
  the listener reconnects with backoff, then catches up. The constructor fails instead: a
  replica that never read the catalog must not reconcile its engine to an empty one.

Presets (:mod:`.presets`, table ``hotwire_presets``) are read from the database on every call,
not kept in memory: a preset written through one replica is seen by every other at once, with no
notification to wait for. While the database is unreachable their reads fail with 503 like writes
(vectors keep serving from memory because the engines depend on them; a preset is only looked up).
The table was added without a schema version bump: older builds ignore it.

The DSN's password never reaches a log or an error message (:func:`describe_dsn`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import psycopg
from psycopg.conninfo import conninfo_to_dict

from hotwire.shared.wire import decode_safetensors, encode_safetensors

from .catalog import StaleGeneration, VectorExists, VectorRecord
from .errors import ApiError
from .presets import PresetExists, PresetRecord

log = logging.getLogger("hotwire.control_api")

SCHEMA_VERSION = 1
CHANNEL = "hotwire_catalog"
POLL_S = 2.0
BACKOFF_S = (0.2, 5.0)  # first and longest wait between reconnect attempts
_WAKE_S = 0.25  # the listener notices close() within this

_SCHEMA = """
CREATE TABLE IF NOT EXISTS hotwire_catalog_state (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    schema_version  integer NOT NULL,
    seq             bigint  NOT NULL      -- one more per committed write, catalog-wide
);
INSERT INTO hotwire_catalog_state (singleton, schema_version, seq) VALUES (true, {version}, 0)
    ON CONFLICT (singleton) DO NOTHING;
CREATE TABLE IF NOT EXISTS hotwire_generations (
    id           text   PRIMARY KEY,
    last         bigint NOT NULL,         -- highest generation ever given to this id
    changed_seq  bigint NOT NULL          -- seq of the id's last write
);
CREATE INDEX IF NOT EXISTS hotwire_generations_changed ON hotwire_generations (changed_seq);
CREATE TABLE IF NOT EXISTS hotwire_vectors (
    id          text PRIMARY KEY,
    generation  bigint NOT NULL,
    dtype       text NOT NULL,            -- element type as uploaded; stored data is float32
    shape       json NOT NULL,            -- list, as uploaded
    layers      json,                     -- layers to materialise; NULL = every armed layer
    pinned      boolean NOT NULL,
    metadata    json NOT NULL,
    data        bytea NOT NULL,           -- float32 safetensors
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS hotwire_replicas (
    replica  text PRIMARY KEY,
    seen_at  timestamptz NOT NULL         -- its last residency publish, by the database's clock
);
CREATE TABLE IF NOT EXISTS hotwire_residency (
    replica     text NOT NULL REFERENCES hotwire_replicas ON DELETE CASCADE,
    vector_id   text NOT NULL,
    generation  bigint NOT NULL,          -- the catalog generation this state is about
    state       text NOT NULL,            -- as GET /steer/vectors says it on that replica
    reason      text,
    PRIMARY KEY (replica, vector_id)
);
CREATE INDEX IF NOT EXISTS hotwire_residency_vector ON hotwire_residency (vector_id);
CREATE TABLE IF NOT EXISTS hotwire_presets (
    name         text PRIMARY KEY,
    entries      json NOT NULL,            -- list of spec entries, as posted
    description  text,
    created_at   double precision NOT NULL
);
""".format(version=SCHEMA_VERSION)
_RECORD = ("v.id, v.generation, v.dtype, v.shape::text, v.layers::text, v.pinned, "
           "v.metadata::text, v.created_at, v.updated_at")
_PRESET = "name, entries::text, description, created_at"
# Ids with their latest change's seq, their high-water mark, then the record (NULLs if none).
_CHANGES = (f"SELECT g.id, g.changed_seq, g.last, {_RECORD} FROM hotwire_generations g "
            "LEFT JOIN hotwire_vectors v ON v.id = g.id")
# libpq settings that make a dead server or network noticed in seconds; a DSN's own win.
_CONNECT_DEFAULTS = {"connect_timeout": "5", "keepalives": "1", "keepalives_idle": "10",
                     "keepalives_interval": "5", "keepalives_count": "3",
                     "tcp_user_timeout": "15000"}

FORGET_REPLICA_S = 3600.0  # a replica that published nothing for this long is dropped

T = TypeVar("T")


@dataclass(frozen=True)
class Residence:
    """Where one catalog vector stands on one replica's engine."""

    generation: int
    state: str  # a ResidencyState of the slot manager: resident, not_resident, incompatible, ...
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


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` of a DSN, for logs: never the password."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"{user}{info.get('host') or 'localhost'}{port}/{info.get('dbname') or ''}"


def _preset(row: tuple) -> PresetRecord:
    name, entries, description, created_at = row
    return PresetRecord(name, tuple(json.loads(entries)), description, created_at)


def unavailable(message: str) -> ApiError:
    return ApiError(503, "catalog_unavailable", message)


class PostgresCatalog:
    """The registered vectors, in PostgreSQL; reads come from memory, kept current by a listener.

    ``poll_s``: how often the listener checks the catalog-wide ``seq`` besides notifications.
    """

    def __init__(self, dsn: str, *, poll_s: float = POLL_S, application_name: str = "hotwire"):
        try:
            info = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise ValueError(f"HOTWIRE_CATALOG_DSN is not a valid PostgreSQL DSN: {e}") from None
        self._conninfo = {**_CONNECT_DEFAULTS, "application_name": application_name, **info}
        self.where = describe_dsn(dsn)
        self.poll_s = poll_s
        self._lock = threading.Lock()  # the writer connection
        self._memory = threading.Lock()  # _records, _versions, _high_water
        self._records: dict[str, VectorRecord] = {}
        self._versions: dict[str, int] = {}  # id -> seq of the change held in memory
        self._high_water: dict[str, int] = {}
        self._published: dict[str, dict[str, Residence]] = {}  # replica -> its last report
        self._seen_seq = 0  # catalog seq last caught up to (listener thread only)
        self._problem: str | None = None
        self._stop = threading.Event()
        self._writer: psycopg.Connection | None = None
        listener = None
        try:
            self._writer = self._connect()
            self._create_schema(self._writer)
            listener = self._connect(listener=True)
            listener.execute(f"LISTEN {CHANNEL}")
            self._catch_up(listener)
        except psycopg.Error as e:
            for conn in (self._writer, listener):
                if conn is not None:
                    conn.close()
            reason = " ".join(str(e).split())
            raise RuntimeError(f"cannot open the catalog database {self.where}: {reason}") from None
        log.info("catalog: PostgreSQL %s (%d vectors)", self.where, len(self._records))
        self._listener = threading.Thread(target=self._listen, args=(listener,), daemon=True,
                                          name="hotwire-catalog-listener")
        self._listener.start()

    # Reading -----------------------------------------------------------------------------

    def records(self) -> dict[str, VectorRecord]:
        with self._memory:
            return dict(self._records)

    def get(self, vector_id: str) -> VectorRecord | None:
        with self._memory:
            return self._records.get(vector_id)

    def high_water(self, vector_id: str) -> int | None:
        """The highest generation the shared catalog ever gave or saw for ``vector_id``,
        deletes included, as last read from the database."""
        with self._memory:
            return self._high_water.get(vector_id)

    def problem(self) -> str | None:
        """Why nothing can be persisted now (the database is unreachable: writes fail with 503),
        or ``None``. Unlike a lost SQLite file, this clears once the database is back."""
        return self._problem

    def write_refusal(self) -> ApiError | None:
        """The error every write gets now (503 ``catalog_unavailable``), or ``None``."""
        problem = self._problem
        return None if problem is None else unavailable(f"{problem}; retry once it is back")

    @property
    def lost(self) -> str | None:
        """:meth:`problem`, as :attr:`.catalog.Catalog.lost` offers it."""
        return self._problem

    def load(self, vector_id: str) -> np.ndarray:
        """The stored float32 vector, in its uploaded shape.

        ``KeyError`` also when the database holds another generation than :meth:`get` (another
        replica replaced it a moment ago): rows must never go out under a generation they are
        not. Memory is brought up to date before raising, so the caller's next pass succeeds.
        """
        def read(conn: psycopg.Connection) -> tuple[int, bytes] | None:
            return conn.execute("SELECT generation, data FROM hotwire_vectors WHERE id = %s",
                                (vector_id,)).fetchone()

        row = self._run(read)
        known = self.get(vector_id)
        if row is None or (known is not None and known.generation != row[0]):
            self._run(lambda conn: self._refresh(conn, [vector_id]))
            raise KeyError(vector_id)
        return decode_safetensors(bytes(row[1]))

    # Writing -----------------------------------------------------------------------------

    def put(self, vector_id: str, vector: np.ndarray, *, dtype: str, layers: tuple[int, ...] | None,
            pinned: bool, metadata: dict[str, Any], generation: int | None = None,
            replace: bool = True) -> VectorRecord:
        """Create or replace ``vector_id``, under the id's next generation or ``generation``.

        Checked against the database, under the catalog-wide ``seq`` lock: ``replace=False``
        raises :class:`.catalog.VectorExists` when the id has a record; ``generation`` (adoption
        of what an engine holds) returns the record already at that generation unchanged, and
        raises :class:`.catalog.StaleGeneration` when the record is newer. The high-water mark
        only ever grows.
        """
        now = time.time()
        shape, data = json.dumps(list(vector.shape)), encode_safetensors(vector)
        layers_json = None if layers is None else json.dumps(list(layers))
        given = generation

        def write(conn: psycopg.Connection) -> tuple[int | None, int | None, VectorRecord]:
            seq = self._next_seq(conn)
            old = conn.execute("SELECT generation FROM hotwire_vectors WHERE id = %s",
                               (vector_id,)).fetchone()
            if old is not None and not replace:
                raise VectorExists(vector_id, old[0])
            if given is None:
                generation, high_water = conn.execute(
                    "INSERT INTO hotwire_generations AS g (id, last, changed_seq) "
                    "VALUES (%s, 1, %s) ON CONFLICT (id) DO UPDATE SET last = g.last + 1, "
                    "changed_seq = excluded.changed_seq RETURNING last, last",
                    (vector_id, seq)).fetchone()
            else:
                if old is not None and given == old[0]:  # another replica adopted it first
                    row = conn.execute(f"SELECT {_RECORD} FROM hotwire_vectors v WHERE v.id = %s",
                                       (vector_id,)).fetchone()
                    self._refresh(conn, [vector_id])
                    return None, None, VectorRecord.from_row(row)
                if old is not None and given < old[0]:
                    raise StaleGeneration(f"{vector_id}: generation {given} is older than "
                                          f"{old[0]}")
                generation, (high_water,) = given, conn.execute(
                    "INSERT INTO hotwire_generations AS g (id, last, changed_seq) "
                    "VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                    "last = greatest(g.last, excluded.last), changed_seq = excluded.changed_seq "
                    "RETURNING last", (vector_id, given, seq)).fetchone()
            row = conn.execute(
                "INSERT INTO hotwire_vectors AS v (id, generation, dtype, shape, layers, pinned, "
                "metadata, data, created_at, updated_at) "
                "VALUES (%s, %s, %s, %s::json, %s::json, %s, %s::json, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET generation = excluded.generation, "
                "dtype = excluded.dtype, shape = excluded.shape, layers = excluded.layers, "
                "pinned = excluded.pinned, metadata = excluded.metadata, data = excluded.data, "
                f"updated_at = excluded.updated_at RETURNING {_RECORD}",
                (vector_id, generation, dtype, shape, layers_json, pinned, json.dumps(metadata),
                 data, now, now)).fetchone()
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, vector_id))
            return seq, high_water, VectorRecord.from_row(row)

        seq, high_water, record = self._write(write)
        if seq is not None:
            self._apply(vector_id, record, seq, high_water)
        return record

    def delete(self, vector_id: str) -> bool:
        def write(conn: psycopg.Connection) -> tuple[int, int | None, bool]:
            seq = self._next_seq(conn)
            gone = conn.execute("DELETE FROM hotwire_vectors WHERE id = %s",
                                (vector_id,)).rowcount > 0
            row = conn.execute("UPDATE hotwire_generations SET changed_seq = %s WHERE id = %s "
                               "RETURNING last", (seq, vector_id)).fetchone()
            if gone:
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, vector_id))
            return seq, None if row is None else row[0], gone

        seq, high_water, gone = self._write(write)
        self._apply(vector_id, None, seq, high_water)
        return gone

    def reserve_generation(self, vector_id: str, generation: int) -> None:
        """Record that ``generation`` was seen for ``vector_id`` (e.g. in an engine's mailbox);
        every replica learns the new high-water mark."""
        def write(conn: psycopg.Connection) -> tuple[int, int]:
            seq = self._next_seq(conn)
            (high_water,) = conn.execute(
                "INSERT INTO hotwire_generations AS g (id, last, changed_seq) VALUES (%s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET last = greatest(g.last, excluded.last), "
                "changed_seq = excluded.changed_seq RETURNING last",
                (vector_id, generation, seq)).fetchone()
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, vector_id))
            return seq, high_water

        seq, high_water = self._write(write)
        with self._memory:
            self._high_water[vector_id] = max(high_water, self._high_water.get(vector_id, 0))

    # Presets: read through, never cached ---------------------------------------------------

    def presets(self) -> list[PresetRecord]:
        """Every preset, by name, as the database holds them now."""
        rows = self._run(lambda conn: conn.execute(
            f"SELECT {_PRESET} FROM hotwire_presets").fetchall())
        return sorted((_preset(row) for row in rows), key=lambda p: p.name)

    def preset(self, name: str) -> PresetRecord | None:
        row = self._run(lambda conn: conn.execute(
            f"SELECT {_PRESET} FROM hotwire_presets WHERE name = %s", (name,)).fetchone())
        return None if row is None else _preset(row)

    def put_preset(self, name: str, entries: tuple[dict[str, Any], ...], description: str | None,
                   *, replace: bool) -> tuple[PresetRecord, bool]:
        """Store a preset: ``(record, created)``. ``replace=False`` creates only, checked by the
        primary key, so of two replicas creating one name the second gets
        :class:`.presets.PresetExists`."""
        record = PresetRecord(name, tuple(entries), description, time.time())
        values = (name, json.dumps(list(entries)), description, record.created_at)

        def write(conn: psycopg.Connection) -> bool:
            if replace:
                (created,) = conn.execute(
                    "INSERT INTO hotwire_presets AS p (name, entries, description, created_at) "
                    "VALUES (%s, %s::json, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                    "entries = excluded.entries, description = excluded.description, "
                    "created_at = excluded.created_at RETURNING p.xmax = 0", values).fetchone()
                return created
            row = conn.execute(
                "INSERT INTO hotwire_presets (name, entries, description, created_at) "
                "VALUES (%s, %s::json, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING 1",
                values).fetchone()
            if row is None:
                raise PresetExists(name)
            return True

        return record, self._write(write)

    def delete_preset(self, name: str) -> bool:
        return self._write(lambda conn: conn.execute(
            "DELETE FROM hotwire_presets WHERE name = %s", (name,)).rowcount > 0)

    # Residency: which replica's engine holds what ------------------------------------------

    def publish_residency(self, replica: str, report: Mapping[str, Residence],
                          forget_after_s: float = FORGET_REPLICA_S) -> None:
        """Replace ``replica``'s report with ``report`` (every catalog vector, as its engine
        holds it) and mark the replica seen. Only rows that changed since this process's last
        publish are written; replicas silent for ``forget_after_s`` are dropped. 503 while the
        database is unreachable."""
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

        self._write(write)
        self._published[replica] = report

    def residency(self, vector_id: str) -> list[ReplicaResidence]:
        """Every known replica's last report on ``vector_id``, by replica name (a replica that
        has not mentioned it has ``state=None``): for ``GET /steer/vectors/{id}``."""
        rows = self._run(lambda conn: conn.execute(
            "SELECT r.replica, s.generation, s.state, s.reason, "
            "extract(epoch FROM now() - r.seen_at)::float8 FROM hotwire_replicas r "
            "LEFT JOIN hotwire_residency s ON s.replica = r.replica AND s.vector_id = %s "
            "ORDER BY r.replica", (vector_id,)).fetchall())
        return [ReplicaResidence(*row) for row in rows]

    def close(self) -> None:
        self._stop.set()
        self._listener.join(10)
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    # Database ----------------------------------------------------------------------------

    def _connect(self, listener: bool = False) -> psycopg.Connection:
        """A new connection; the listener's is named ``<application_name>-listener``."""
        info = dict(self._conninfo)
        if listener:
            info["application_name"] = f"{info['application_name']}-listener"
        return psycopg.connect(**info, autocommit=True)

    @staticmethod
    def _create_schema(conn: psycopg.Connection) -> None:
        with conn.transaction():
            # Replicas starting together: CREATE ... IF NOT EXISTS is not safe concurrently.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('hotwire_catalog_schema'))")
            conn.execute(_SCHEMA)
            (version,) = conn.execute("SELECT schema_version FROM hotwire_catalog_state").fetchone()
        if version != SCHEMA_VERSION:
            raise RuntimeError(f"the catalog database has schema {version}; this build reads "
                               f"{SCHEMA_VERSION}")

    @staticmethod
    def _next_seq(conn: psycopg.Connection) -> int:
        """Lock the catalog-wide counter for this transaction and take its next value."""
        return conn.execute("UPDATE hotwire_catalog_state SET seq = seq + 1 "
                            "RETURNING seq").fetchone()[0]

    def _write(self, body: Callable[[psycopg.Connection], T]) -> T:
        """``body`` in one transaction."""
        return self._run(body, transaction=True)

    def _run(self, body: Callable[[psycopg.Connection], T], transaction: bool = False) -> T:
        """Run ``body`` on the writer connection, once more on a new one if the first died
        before committing (a server restart shows only on first use); else 503.

        While the listener finds the database unreachable, 503 at once: callers run on the
        event loop, which must not wait out connection timeouts.
        """
        if self._problem is not None:
            raise unavailable(f"{self._problem}; retry once it is back")
        with self._lock:
            for attempt in range(2):
                committing = False
                try:
                    conn = self._writer = self._writer or self._connect()
                    if not transaction:
                        return body(conn)
                    with conn.transaction():
                        result = body(conn)
                        committing = True
                    return result
                except psycopg.OperationalError as e:
                    if self._writer is not None:
                        self._writer.close()
                    self._writer = None
                    if committing or attempt:
                        outcome = "may or may not have committed" if committing else "failed"
                        raise unavailable(f"the catalog database {self.where} {outcome}: "
                                          + " ".join(str(e).split())) from None
                    log.warning("catalog database connection lost (%s); retrying on a new one",
                                " ".join(str(e).split()))
        raise AssertionError("unreachable")

    # Memory ------------------------------------------------------------------------------

    def _apply(self, vector_id: str, record: VectorRecord | None, seq: int,
               high_water: int | None) -> None:
        """One id's state as of change ``seq``, unless memory already holds a later one. The
        high-water mark is raised first: once a record is gone, its generation reads as deleted."""
        with self._memory:
            if high_water is not None:
                self._high_water[vector_id] = max(high_water, self._high_water.get(vector_id, 0))
            if seq < self._versions.get(vector_id, 0):
                return
            self._versions[vector_id] = seq
            if record is None:
                self._records.pop(vector_id, None)
            else:
                self._records[vector_id] = record

    def _apply_changes(self, rows: Iterable[tuple]) -> None:
        """Rows of :data:`_CHANGES` into memory."""
        for vector_id, seq, high_water, *record in rows:
            found = None if record[0] is None else VectorRecord.from_row(tuple(record))
            self._apply(vector_id, found, seq, high_water)

    def _refresh(self, conn: psycopg.Connection, ids: list[str]) -> None:
        """Re-read these ids' latest change (record or deletion) into memory."""
        self._apply_changes(conn.execute(f"{_CHANGES} WHERE g.id = ANY(%s)", (ids,)).fetchall())

    def _catch_up(self, conn: psycopg.Connection) -> None:
        """Every change since the last ``seq`` read (at first: the whole catalog, high-water
        marks of deleted ids included), as one snapshot."""
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            (seq,) = conn.execute("SELECT seq FROM hotwire_catalog_state").fetchone()
            if seq == self._seen_seq:
                return
            rows = conn.execute(f"{_CHANGES} WHERE g.changed_seq > %s",
                                (self._seen_seq,)).fetchall()
        self._apply_changes(rows)
        self._seen_seq = seq

    # Listener ----------------------------------------------------------------------------

    def _listen(self, conn: psycopg.Connection | None) -> None:
        """Follow the shared catalog until :meth:`close`.

        A connection that worked and broke is replaced at once (a proxy or an administrator may
        cut one connection of a server that is up); only when that fails is the database
        reported unreachable, and retried with backoff.
        """
        backoff, connected = BACKOFF_S[0], conn is not None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect(listener=True)
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._catch_up(conn)
                    if self._problem is not None:
                        log.warning("catalog database %s reachable again; caught up to change %d",
                                    self.where, self._seen_seq)
                    self._problem, backoff, connected = None, BACKOFF_S[0], True
                self._follow(conn)
            except psycopg.Error as e:
                if conn is not None:
                    conn.close()
                conn = None
                reason = " ".join(str(e).split()) or type(e).__name__
                if connected:
                    connected = False
                    log.warning("catalog listener connection to %s lost (%s); reconnecting",
                                self.where, reason)
                    continue
                if self._problem is None:
                    log.warning("catalog database %s unreachable (%s): serving the last catalog "
                                "read, retrying", self.where, reason)
                self._problem = f"catalog database {self.where} unreachable: {reason}"
                self._stop.wait(backoff)
                backoff = min(2 * backoff, BACKOFF_S[1])
        if conn is not None:
            conn.close()

    def _follow(self, conn: psycopg.Connection) -> None:
        """Apply notified ids as they come, and catch up every ``poll_s``, until stopped."""
        next_poll = time.monotonic() + self.poll_s
        while not self._stop.is_set():
            wait = max(0.0, min(_WAKE_S, next_poll - time.monotonic()))
            ids = {n.payload for n in conn.notifies(timeout=wait, stop_after=1) if n.payload}
            if ids:
                self._refresh(conn, sorted(ids))
            if time.monotonic() >= next_poll:
                self._catch_up(conn)
                next_poll = time.monotonic() + self.poll_s
