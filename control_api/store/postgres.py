"""Vector catalog in PostgreSQL, shared by the control APIs of N replicas.

Same contract as :class:`.sqlite.Catalog` (see :mod:`.catalog`), plus what sharing needs:

- Every write takes the one row of ``hotwire_catalog_state`` first (``seq = seq + 1``), so writes
  from all replicas commit in ``seq`` order, and stamps the id's ``changed_seq`` with it. An id's
  generation comes from ``INSERT ... ON CONFLICT ... RETURNING`` on its ``hotwire_generations``
  row in the same transaction: two replicas can never hand out the same generation.
- Every write runs ``pg_notify('hotwire_catalog', id)`` in its transaction. A listener thread on
  its own connection re-reads a notified id into memory, and every ``poll_s`` compares the
  catalog's ``seq`` with the last one it read and re-reads the ids changed since, so a
  notification missed while the listener reconnected still arrives. The engines' reconcile
  pass reads :meth:`records`, so each replica's engine follows the shared catalog.
- Memory is updated per id only by a change at least as new (by ``seq``) as the one it holds, so
  the listener and this process's own commits may apply in any order.
- A create (``put(replace=False)``) checks that the id has no record after taking the ``seq``
  row, so of two replicas creating one id at once the second gets :class:`.records.VectorExists`
  (``exists``), never a silent replace; an adoption (``put(generation=G)``) of a record already at
  ``G`` is a no-op, so replicas adopting the same engine vector at once both succeed.
- While the database is unreachable the last records read stay in memory (the engine keeps its
  vectors), :meth:`problem` says why, writes raise ``Unavailable("catalog_unavailable")``, and
  the listener reconnects with backoff, then catches up. The constructor fails instead: a
  replica that never read the catalog must not reconcile its engine to an empty one.

Presets (table ``hotwire_presets``) are read from the database on every call, not kept in
memory: a preset written through one replica is seen by every other at once, with no
notification to wait for. While the database is unreachable their reads fail like writes
(vectors keep serving from memory because the engines depend on them; a preset is only looked up).
The table, and its later ``metadata`` column, need no schema version bump: older builds ignore
them.

The replicas' residency reports are the catalog's :attr:`PostgresCatalog.replica_board`
(:mod:`.replica_board`); the schema and the connections are :mod:`.postgres_db`'s.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import psycopg

from hotwire.shared.wire import decode_safetensors, encode_safetensors

from .postgres_db import Database
from .records import PresetExists, PresetRecord, StaleGeneration, VectorExists, VectorRecord
from .replica_board import PostgresReplicaBoard

log = logging.getLogger("hotwire.control_api")

CHANNEL = "hotwire_catalog"
POLL_S = 2.0
BACKOFF_S = (0.2, 5.0)  # first and longest wait between reconnect attempts
_WAKE_S = 0.25  # the listener notices close() within this

_RECORD = ("v.id, v.generation, v.dtype, v.shape::text, v.layers::text, v.pinned, "
           "v.metadata::text, v.created_at, v.updated_at")
_PRESET = "name, entries::text, description, created_at, metadata::text"
# Ids with their latest change's seq, their high-water mark, then the record (NULLs if none).
_CHANGES = (f"SELECT g.id, g.changed_seq, g.last, {_RECORD} FROM hotwire_generations g "
            "LEFT JOIN hotwire_vectors v ON v.id = g.id")


class PostgresCatalog:
    """The registered vectors, in PostgreSQL; reads come from memory, kept current by a listener.

    ``poll_s``: how often the listener checks the catalog-wide ``seq`` besides notifications.
    """

    def __init__(self, dsn: str, *, poll_s: float = POLL_S, application_name: str = "hotwire"):
        self.db = Database(dsn, application_name)
        self.where = self.db.where
        self.poll_s = poll_s
        self.replica_board = PostgresReplicaBoard(self.db)
        self._memory = threading.Lock()  # _records, _versions, _high_water
        self._records: dict[str, VectorRecord] = {}
        self._versions: dict[str, int] = {}  # id -> seq of the change held in memory
        self._high_water: dict[str, int] = {}
        self._seen_seq = 0  # catalog seq last caught up to (listener thread only)
        self._stop = threading.Event()
        listener = None
        try:
            self.db.open()
            listener = self.db.connect(listener=True)
            listener.execute(f"LISTEN {CHANNEL}")
            self._catch_up(listener)
        except psycopg.Error as e:
            self.db.close()
            if listener is not None:
                listener.close()
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
        """Why nothing can be persisted now (the database is unreachable: writes fail with
        ``catalog_unavailable``), or ``None``. Unlike a lost SQLite file, this clears once the
        database is back."""
        return self.db.problem

    def require_writable(self) -> None:
        """``Unavailable("catalog_unavailable")`` while the database is unreachable."""
        self.db.require_reachable()

    def load(self, vector_id: str) -> np.ndarray:
        """The stored float32 vector, in its uploaded shape.

        ``KeyError`` also when the database holds another generation than :meth:`get` (another
        replica replaced it a moment ago): rows must never go out under a generation they are
        not. Memory is brought up to date before raising, so the caller's next pass succeeds.
        """
        def read(conn: psycopg.Connection) -> tuple[int, bytes] | None:
            return conn.execute("SELECT generation, data FROM hotwire_vectors WHERE id = %s",
                                (vector_id,)).fetchone()

        row = self.db.run(read)
        known = self.get(vector_id)
        if row is None or (known is not None and known.generation != row[0]):
            self.db.run(lambda conn: self._refresh(conn, [vector_id]))
            raise KeyError(vector_id)
        return decode_safetensors(bytes(row[1]))

    # Writing -----------------------------------------------------------------------------

    def put(self, vector_id: str, vector: np.ndarray, *, dtype: str, layers: tuple[int, ...] | None,
            pinned: bool, metadata: dict[str, Any], generation: int | None = None,
            replace: bool = True) -> VectorRecord:
        """Create or replace ``vector_id``, under the id's next generation or ``generation``.

        Checked against the database, under the catalog-wide ``seq`` lock: ``replace=False``
        raises :class:`.records.VectorExists` when the id has a record; ``generation`` (adoption
        of what an engine holds) returns the record already at that generation unchanged, and
        raises :class:`.records.StaleGeneration` when the record is newer. The high-water mark
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

        seq, high_water, record = self.db.write(write)
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

        seq, high_water, gone = self.db.write(write)
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

        seq, high_water = self.db.write(write)
        with self._memory:
            self._high_water[vector_id] = max(high_water, self._high_water.get(vector_id, 0))

    # Presets: read through, never cached ---------------------------------------------------

    def presets(self) -> list[PresetRecord]:
        """Every preset, by name, as the database holds them now."""
        rows = self.db.run(lambda conn: conn.execute(
            f"SELECT {_PRESET} FROM hotwire_presets").fetchall())
        return sorted((PresetRecord.from_row(row) for row in rows), key=lambda p: p.name)

    def preset(self, name: str) -> PresetRecord | None:
        row = self.db.run(lambda conn: conn.execute(
            f"SELECT {_PRESET} FROM hotwire_presets WHERE name = %s", (name,)).fetchone())
        return None if row is None else PresetRecord.from_row(row)

    def put_preset(self, name: str, entries: tuple[dict[str, Any], ...], description: str | None,
                   *, replace: bool, metadata: dict[str, Any] | None = None
                   ) -> tuple[PresetRecord, bool]:
        """Store a preset: ``(record, created)``. ``replace=False`` creates only, checked by the
        primary key, so of two replicas creating one name the second gets
        :class:`.records.PresetExists`."""
        record = PresetRecord(name, tuple(entries), description, time.time(), dict(metadata or {}))
        values = (name, json.dumps(list(entries)), description, record.created_at,
                  json.dumps(record.metadata))

        def write(conn: psycopg.Connection) -> bool:
            if replace:
                (created,) = conn.execute(
                    "INSERT INTO hotwire_presets AS p (name, entries, description, created_at, "
                    "metadata) VALUES (%s, %s::json, %s, %s, %s::json) ON CONFLICT (name) DO "
                    "UPDATE SET entries = excluded.entries, description = excluded.description, "
                    "created_at = excluded.created_at, metadata = excluded.metadata "
                    "RETURNING p.xmax = 0", values).fetchone()
                return created
            row = conn.execute(
                "INSERT INTO hotwire_presets (name, entries, description, created_at, metadata) "
                "VALUES (%s, %s::json, %s, %s, %s::json) ON CONFLICT (name) DO NOTHING RETURNING 1",
                values).fetchone()
            if row is None:
                raise PresetExists(name)
            return True

        return record, self.db.write(write)

    def delete_preset(self, name: str) -> bool:
        return self.db.write(lambda conn: conn.execute(
            "DELETE FROM hotwire_presets WHERE name = %s", (name,)).rowcount > 0)

    def close(self) -> None:
        self._stop.set()
        self._listener.join(10)
        self.db.close()

    # Database ----------------------------------------------------------------------------

    @staticmethod
    def _next_seq(conn: psycopg.Connection) -> int:
        """Lock the catalog-wide counter for this transaction and take its next value."""
        return conn.execute("UPDATE hotwire_catalog_state SET seq = seq + 1 "
                            "RETURNING seq").fetchone()[0]

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
                    conn = self.db.connect(listener=True)
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._catch_up(conn)
                    if self.db.problem is not None:
                        log.warning("catalog database %s reachable again; caught up to change %d",
                                    self.where, self._seen_seq)
                    self.db.problem, backoff, connected = None, BACKOFF_S[0], True
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
                if self.db.problem is None:
                    log.warning("catalog database %s unreachable (%s): serving the last catalog "
                                "read, retrying", self.where, reason)
                self.db.problem = f"catalog database {self.where} unreachable: {reason}"
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
