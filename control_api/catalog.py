"""Persistent vector catalog: embedded SQLite (WAL) in the state directory.

One row per vector id: the vector as float32 safetensors bytes and what it was registered with.
``generation`` grows per id across the id's whole history, deletes included (the ``generations``
table keeps a high-water mark), because the engine salts prefix-cache keys with it: a vector
registered again under an old id must never pass for the earlier one (invariant 5).

Metadata of every vector is kept in memory (it is small and this process is the only writer);
vector bytes are read from disk when a vector is pushed to an engine.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hotwire.shared.wire import decode_safetensors, encode_safetensors

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
"""
_COLUMNS = "id, generation, dtype, shape, layers, pinned, metadata, created_at, updated_at"


@dataclass(frozen=True)
class VectorRecord:
    id: str
    generation: int
    dtype: str
    shape: tuple[int, ...]
    layers: tuple[int, ...] | None
    pinned: bool
    metadata: dict[str, Any]
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: tuple) -> VectorRecord:
        vid, gen, dtype, shape, layers, pinned, metadata, created, updated = row
        return cls(vid, gen, dtype, tuple(json.loads(shape)),
                   None if layers is None else tuple(json.loads(layers)),
                   bool(pinned), json.loads(metadata), created, updated)


class Catalog:
    """The registered vectors. Every write is one transaction; reads come from memory."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise RuntimeError(f"{path} has catalog schema {version}; this build reads {SCHEMA_VERSION}")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM vectors").fetchall()
        self._records = {r[0]: VectorRecord.from_row(r) for r in rows}

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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

    def put(self, vector_id: str, vector: np.ndarray, *, dtype: str, layers: tuple[int, ...] | None,
            pinned: bool, metadata: dict[str, Any]) -> VectorRecord:
        """Create or replace ``vector_id`` under the next generation of that id."""
        now = time.time()
        with self._transaction() as db:
            generation = self._next_generation(db, vector_id)
            old = self._records.get(vector_id)
            record = VectorRecord(vector_id, generation, dtype, tuple(vector.shape), layers, pinned,
                                  metadata, old.created_at if old else now, now)
            db.execute(
                f"INSERT OR REPLACE INTO vectors ({_COLUMNS}, data) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (vector_id, generation, dtype, json.dumps(list(record.shape)),
                 None if layers is None else json.dumps(list(layers)), int(pinned),
                 json.dumps(metadata), record.created_at, now, encode_safetensors(vector)))
        self._records[vector_id] = record
        return record

    def delete(self, vector_id: str) -> bool:
        with self._transaction() as db:
            gone = db.execute("DELETE FROM vectors WHERE id = ?", (vector_id,)).rowcount > 0
        self._records.pop(vector_id, None)
        return gone

    def reserve_generation(self, vector_id: str, generation: int) -> None:
        """Record that ``generation`` was seen for ``vector_id`` (e.g. in an engine's mailbox)."""
        with self._transaction() as db:
            db.execute("INSERT INTO generations (id, last) VALUES (?, ?) "
                       "ON CONFLICT(id) DO UPDATE SET last = max(last, excluded.last)",
                       (vector_id, generation))

    def _next_generation(self, db: sqlite3.Connection, vector_id: str) -> int:
        row = db.execute("SELECT last FROM generations WHERE id = ?", (vector_id,)).fetchone()
        generation = (row[0] if row else 0) + 1
        db.execute("INSERT OR REPLACE INTO generations (id, last) VALUES (?, ?)", (vector_id, generation))
        return generation

    def close(self) -> None:
        with self._lock:
            self._db.close()
