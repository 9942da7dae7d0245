"""What the control API needs of a catalog, and which backend a deployment gets.

Two backends keep the same contract: :class:`.catalog.Catalog` (embedded SQLite in the state
directory, the default: one control API per catalog) and
:class:`.catalog_postgres.PostgresCatalog` (one PostgreSQL database shared by the control APIs of
N replicas, chosen by ``HOTWIRE_CATALOG_DSN``). Contract of both: every write is one committed
transaction and the in-memory records change only after the commit; reads of metadata come from
memory; an id's generation grows across its whole history, deletes included; ``put`` with
``replace=False`` creates only (``VectorExists``, checked where the data lives, so two replicas
creating one id cannot both succeed); ``put`` with ``generation`` is idempotent (adopting a
record already at that generation changes nothing); ``write_refusal`` is the 503 every write
gets while ``problem()`` is set (``catalog_lost`` for a lost SQLite file, ``catalog_unavailable``
for an unreachable database). Presets: ``put_preset(replace=False)`` creates only
(``PresetExists``, checked where the data lives); PostgreSQL reads them through, SQLite from
memory.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .catalog import Catalog, VectorRecord
from .errors import ApiError
from .presets import PresetRecord
from .settings import Settings


class CatalogStore(Protocol):
    """The catalog interface the slot manager, routers and metrics use."""

    def problem(self) -> str | None: ...

    def write_refusal(self) -> ApiError | None: ...

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
                   *, replace: bool) -> tuple[PresetRecord, bool]: ...

    def delete_preset(self, name: str) -> bool: ...

    def close(self) -> None: ...


def open_catalog(settings: Settings) -> CatalogStore:
    """PostgreSQL when ``settings.catalog_dsn`` is set, else SQLite in ``settings.state_dir``."""
    if settings.catalog_dsn is None:
        return Catalog(settings.catalog_path)
    from .catalog_postgres import PostgresCatalog  # psycopg is an optional extra

    return PostgresCatalog(settings.catalog_dsn.get_secret_value())


def catalog_location(settings: Settings) -> str:
    """Where the catalog of ``settings`` lives, for logs: a path, or the database without its
    password."""
    if settings.catalog_dsn is None:
        return str(settings.catalog_path.absolute())
    from .catalog_postgres import describe_dsn

    return f"PostgreSQL {describe_dsn(settings.catalog_dsn.get_secret_value())}"
