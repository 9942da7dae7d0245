"""What the control API needs of a catalog, and which backend a deployment gets.

Two backends keep the same contract: :class:`.sqlite.Catalog` (embedded SQLite in the state
directory, the default: one control API per catalog) and
:class:`.postgres.PostgresCatalog` (one PostgreSQL database shared by the control APIs of
N replicas, chosen by ``HOTWIRE_CATALOG_DSN``). Contract of both: every write is one committed
transaction and the in-memory records change only after the commit; reads of metadata come from
memory; an id's generation grows across its whole history, deletes included; ``put`` with
``replace=False`` creates only (``VectorExists``, checked where the data lives, so two replicas
creating one id cannot both succeed); ``put`` with ``generation`` is idempotent (adopting a
record already at that generation changes nothing); ``require_writable`` raises the
``Unavailable`` every write gets while ``problem()`` is set (``catalog_lost`` for a lost SQLite
file, ``catalog_unavailable`` for an unreachable database). Presets: ``put_preset(replace=False)``
creates only (``PresetExists``, checked where the data lives); PostgreSQL reads them through,
SQLite from memory. ``replica_board``: where the replicas sharing the catalog report residency
(:mod:`.replica_board`), ``None`` for SQLite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .records import PresetRecord, VectorRecord
from .replica_board import ReplicaBoard
from .sqlite import Catalog


class CatalogStore(Protocol):
    """The catalog interface the slot tables, routers and metrics use."""

    replica_board: ReplicaBoard | None

    def problem(self) -> str | None: ...

    def require_writable(self) -> None: ...

    def records(self) -> dict[str, VectorRecord]: ...

    def get(self, vector_id: str) -> VectorRecord | None: ...

    def load(self, vector_id: str) -> np.ndarray: ...

    def high_water(self, vector_id: str) -> int | None: ...

    def put(self, vector_id: str, vector: np.ndarray, *, dtype: str,
            layers: tuple[int, ...] | None, pinned: bool, metadata: dict[str, Any],
            generation: int | None = None, replace: bool = True) -> VectorRecord: ...

    def delete(self, vector_id: str) -> bool: ...

    def reserve_generation(self, vector_id: str, generation: int) -> None: ...

    def presets(self) -> list[PresetRecord]: ...

    def preset(self, name: str) -> PresetRecord | None: ...

    def put_preset(self, name: str, entries: tuple[dict[str, Any], ...], description: str | None,
                   *, replace: bool, metadata: dict[str, Any] | None = None
                   ) -> tuple[PresetRecord, bool]: ...

    def delete_preset(self, name: str) -> bool: ...

    def close(self) -> None: ...


def open_catalog(dsn: str | None, sqlite_path: Path) -> CatalogStore:
    """PostgreSQL at ``dsn`` when one is given, else SQLite at ``sqlite_path``."""
    if dsn is None:
        return Catalog(sqlite_path)
    from .postgres import PostgresCatalog  # psycopg is an optional extra

    return PostgresCatalog(dsn)


def catalog_location(dsn: str | None, sqlite_path: Path) -> str:
    """Where that catalog lives, for logs: a path, or the database without its password."""
    if dsn is None:
        return str(sqlite_path.absolute())
    from .postgres_db import describe_dsn

    return f"PostgreSQL {describe_dsn(dsn)}"
