"""Persistent vector catalog: embedded SQLite (WAL) in the state directory.

One row per vector id: the vector as float32 safetensors bytes and what it was registered with.
``generation`` grows per id across the id's whole history, deletes included (the ``generations``
table keeps a high-water mark), because the engine salts prefix-cache keys with it: a vector
registered again under an old id must never pass for the earlier one (invariant 5).

Metadata of every vector is kept in memory (it is small and this process is the only writer);
vector bytes are read from disk when a vector is pushed to an engine. Memory changes only after
a transaction commits, so a failed write leaves memory and disk as they were; one that failed
for want of storage (SQLite's ``SQLITE_FULL``, or ``SQLITE_IOERR``: a full disk, a quota, the
file size limit of ``ulimit -f``, a failing disk) raises :class:`.records.CatalogFull`
(``storage_full``).

The database file is watched (invariant 7): when the path no longer names the file that was
opened (the state directory removed, the file replaced), every later write would land in a file
nobody will ever read again. :meth:`Catalog.problem` notices, marks the catalog lost for good and
every write from then on raises :class:`CatalogLost` (``catalog_lost``); reads keep answering
from memory.

Presets live in their own table, kept in memory like the vectors. Schema changes
are additive, so ``SCHEMA_VERSION`` stays 1: a catalog written before presets existed gains the
``presets`` table when opened, one written before preset metadata gains its column (``{}`` for
the presets it holds), and an older build still opens a catalog that has them.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from hotwire.shared.wire import decode_safetensors, encode_safetensors

from ..errors import Unavailable
from .records import (CatalogFull, PresetExists, PresetRecord, StaleGeneration, VectorExists,
                      VectorRecord)

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    id          TEXT PRIMARY KEY,
    generation  INTEGER NOT NULL,
    dtype       TEXT NOT NULL,     -- element type as uploaded; stored data is float32
    shape       TEXT NOT NULL,     -- JSON list, as uploaded
    layers      TEXT,              -- JSON list of layers to materialise; NULL = every armed layer
    pinned      INTEGER NOT NULL,
    metadata    TEXT NOT NULL,     -- JSON object
    data        BLOB NOT NULL,     -- float32 safetensors
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS generations (
    id    TEXT PRIMARY KEY,
    last  INTEGER NOT NULL         -- highest generation ever given to this id
);
CREATE TABLE IF NOT EXISTS presets (
    name         TEXT PRIMARY KEY,
    entries      TEXT NOT NULL,    -- JSON list of spec entries, as posted
    description  TEXT,
    created_at   REAL NOT NULL,
    metadata     TEXT NOT NULL DEFAULT '{}'  -- JSON object
);
"""
_PRESET_COLUMNS = "name, entries, description, created_at, metadata"
_COLUMNS = "id, generation, dtype, shape, layers, pinned, metadata, created_at, updated_at"
_SQLITE_IOERR, _SQLITE_FULL = 10, 13  # primary result codes (sqlite3 names them from Python 3.11)
_STORAGE_MESSAGES = ("database or disk is full", "disk I/O error")  # their texts, before 3.11

log = logging.getLogger("hotwire.control_api")


def _add_preset_metadata(db: sqlite3.Connection) -> None:
    """The ``metadata`` column, in a catalog written before presets had one."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(presets)")}
    if "metadata" not in columns:
        db.execute("ALTER TABLE presets ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}'")


class CatalogLost(Unavailable):
    """The database file this catalog opened is gone from its path (``lost`` says how);
    nothing can be persisted."""

    def __init__(self, lost: str):
        super().__init__("catalog_lost", f"{lost}. Writes are refused so that nothing is "
                         "acknowledged that would not survive a restart; reads answer from memory "
                         "and the engine keeps its vectors. Put the state directory back and "
                         "restart the control API.")


class Catalog:
    """The registered vectors. Every write is one transaction; reads come from memory."""

    replica_board = None  # one control API per SQLite catalog: no other replica to report to

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise RuntimeError(f"{path} has catalog schema {version}; this build reads {SCHEMA_VERSION}")
        self._db.executescript(_SCHEMA)
        _add_preset_metadata(self._db)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._identity = _identity(path)
        self.lost: str | None = None
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM vectors").fetchall()
        self._records = {r[0]: VectorRecord.from_row(r) for r in rows}
        self._high_water: dict[str, int] = dict(
            self._db.execute("SELECT id, last FROM generations").fetchall())
        self._presets = {row[0]: PresetRecord.from_row(row) for row in self._db.execute(
            f"SELECT {_PRESET_COLUMNS} FROM presets").fetchall()}

    def problem(self) -> str | None:
        """Why the catalog can no longer persist anything, or ``None``; sticky once lost.

        Lost when ``path`` is missing or names another file than the one opened (device and
        inode differ). Logged once, at ERROR.
        """
        if self.lost is None:
            try:
                now = _identity(self.path)
            except FileNotFoundError:
                now = None
            if now != self._identity:
                what = "removed" if now is None else "replaced by another file"
                self.lost = (f"the catalog database {self.path} was {what} while the control API "
                             "was running")
                log.error("%s: refusing writes; reads answer from memory and the engine's slots are "
                          "left as they are. Put the state directory back and restart the control "
                          "API (a fresh catalog adopts what the engine holds)", self.lost)
        return self.lost

    def require_writable(self) -> None:
        """:class:`CatalogLost` once the catalog is lost (see :meth:`problem`)."""
        lost = self.problem()
        if lost is not None:
            raise CatalogLost(lost)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on a catalog that is still where it was opened.

        SQLite may roll a failed statement's transaction back by itself (a full disk does), so
        the rollback here runs only when one is still open. A write the storage refused is
        :class:`.records.CatalogFull`. Checked again after the commit: a write that landed in a
        removed file is not reported as done.
        """
        with self._lock:
            self.require_writable()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as e:
                if not _storage_refused(e):
                    raise
                log.error("catalog %s: a write failed for want of storage (%s); rolled back",
                          self.path, e)
                raise CatalogFull(f"the state directory {self.path.parent}", str(e)) from e
            self.require_writable()

    def records(self) -> dict[str, VectorRecord]:
        return dict(self._records)

    def get(self, vector_id: str) -> VectorRecord | None:
        return self._records.get(vector_id)

    def load(self, vector_id: str) -> np.ndarray:
        """The stored float32 vector, in its uploaded shape."""
        with self._lock:
            row = self._db.execute("SELECT data FROM vectors WHERE id = ?", (vector_id,)).fetchone()
        if row is None:
            raise KeyError(vector_id)
        return decode_safetensors(row[0])

    def high_water(self, vector_id: str) -> int | None:
        """The highest generation this catalog ever gave or saw for ``vector_id``, deletes included."""
        return self._high_water.get(vector_id)

    def put(self, vector_id: str, vector: np.ndarray, *, dtype: str, layers: tuple[int, ...] | None,
            pinned: bool, metadata: dict[str, Any], generation: int | None = None,
            replace: bool = True) -> VectorRecord:
        """Create or replace ``vector_id``, under the id's next generation or ``generation``.

        ``replace=False`` creates only: :class:`VectorExists` if the id has a record.
        ``generation`` keeps a generation an engine already holds (adoption): the record of
        that generation already there is returned unchanged (adoption is idempotent), an older
        one is replaced, a newer one raises :class:`StaleGeneration`. The high-water mark only
        ever grows.
        """
        old = self._records.get(vector_id)
        if generation is not None and old is not None:
            if generation == old.generation:
                return old
            if generation < old.generation:
                raise StaleGeneration(f"{vector_id}: generation {generation} is older than "
                                      f"{old.generation}")
        now = time.time()
        with self._transaction() as db:
            if not replace and old is not None:
                raise VectorExists(vector_id, old.generation)
            last = self._stored_high_water(db, vector_id)
            generation = last + 1 if generation is None else generation
            high_water = max(generation, last)
            db.execute("INSERT OR REPLACE INTO generations (id, last) VALUES (?, ?)",
                       (vector_id, high_water))
            record = VectorRecord(vector_id, generation, dtype, tuple(vector.shape), layers, pinned,
                                  metadata, old.created_at if old else now, now)
            db.execute(
                f"INSERT OR REPLACE INTO vectors ({_COLUMNS}, data) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (vector_id, generation, dtype, json.dumps(list(record.shape)),
                 None if layers is None else json.dumps(list(layers)), int(pinned),
                 json.dumps(metadata), record.created_at, now, encode_safetensors(vector)))
        self._records[vector_id] = record
        self._high_water[vector_id] = high_water
        return record

    def delete(self, vector_id: str) -> bool:
        with self._transaction() as db:
            gone = db.execute("DELETE FROM vectors WHERE id = ?", (vector_id,)).rowcount > 0
        self._records.pop(vector_id, None)
        return gone

    def reserve_generation(self, vector_id: str, generation: int) -> None:
        """Record that ``generation`` was seen for ``vector_id`` (e.g. in an engine's mailbox)."""
        with self._transaction() as db:
            high_water = max(generation, self._stored_high_water(db, vector_id))
            db.execute("INSERT OR REPLACE INTO generations (id, last) VALUES (?, ?)",
                       (vector_id, high_water))
        self._high_water[vector_id] = high_water

    def presets(self) -> list[PresetRecord]:
        """Every preset, by name."""
        return sorted(self._presets.values(), key=lambda p: p.name)

    def preset(self, name: str) -> PresetRecord | None:
        return self._presets.get(name)

    def put_preset(self, name: str, entries: tuple[dict[str, Any], ...], description: str | None,
                   *, replace: bool, metadata: dict[str, Any] | None = None
                   ) -> tuple[PresetRecord, bool]:
        """Store a preset: ``(record, created)``. ``replace=False`` creates only
        (:class:`.records.PresetExists`); a replaced preset is a new recipe, with a new
        ``created_at``."""
        record = PresetRecord(name, tuple(entries), description, time.time(), dict(metadata or {}))
        with self._transaction() as db:
            existed = db.execute("SELECT 1 FROM presets WHERE name = ?", (name,)).fetchone()
            if existed and not replace:
                raise PresetExists(name)
            db.execute(f"INSERT OR REPLACE INTO presets ({_PRESET_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                       (name, json.dumps(list(entries)), description, record.created_at,
                        json.dumps(record.metadata)))
        self._presets[name] = record
        return record, not existed

    def delete_preset(self, name: str) -> bool:
        with self._transaction() as db:
            gone = db.execute("DELETE FROM presets WHERE name = ?", (name,)).rowcount > 0
        self._presets.pop(name, None)
        return gone

    @staticmethod
    def _stored_high_water(db: sqlite3.Connection, vector_id: str) -> int:
        row = db.execute("SELECT last FROM generations WHERE id = ?", (vector_id,)).fetchone()
        return row[0] if row else 0

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _storage_refused(error: sqlite3.OperationalError) -> bool:
    """SQLite could not write its files: ``SQLITE_FULL`` or an ``SQLITE_IOERR`` (what a write
    past ``ulimit -f`` gives: ``EFBIG``), extended codes included."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_FULL, _SQLITE_IOERR)
    return any(text in str(error) for text in _STORAGE_MESSAGES)


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino
