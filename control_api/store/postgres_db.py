"""The PostgreSQL database replicas share: its schema, and the connections to it.

:class:`Database` holds the one writer connection that the catalog
(:mod:`.postgres`) and the replica board (:mod:`.replica_board`) run their statements on, and
the reason the database is unreachable while it is (``problem``, kept by the catalog's listener).
While ``problem`` is set every statement fails at once with ``Unavailable("catalog_unavailable")``:
callers run on the event loop, which must not wait out connection timeouts.

The DSN's password never reaches a log or an error message (:func:`describe_dsn`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import Unavailable
from .records import CatalogFull

log = logging.getLogger("hotwire.control_api")

SCHEMA_VERSION = 1
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
    created_at   double precision NOT NULL,
    metadata     json NOT NULL DEFAULT '{{}}'
);
ALTER TABLE hotwire_presets ADD COLUMN IF NOT EXISTS metadata json NOT NULL DEFAULT '{{}}';
""".format(version=SCHEMA_VERSION)
# libpq settings that make a dead server or network noticed in seconds; a DSN's own win.
_CONNECT_DEFAULTS = {"connect_timeout": "5", "keepalives": "1", "keepalives_idle": "10",
                     "keepalives_interval": "5", "keepalives_count": "3",
                     "tcp_user_timeout": "15000"}

T = TypeVar("T")


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` of a DSN, for logs: never the password."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"{user}{info.get('host') or 'localhost'}{port}/{info.get('dbname') or ''}"


def unavailable(message: str) -> Unavailable:
    return Unavailable("catalog_unavailable", message)


class Database:
    """Connections to one catalog database; ``where`` names it for logs and errors."""

    def __init__(self, dsn: str, application_name: str):
        try:
            info = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise ValueError(f"HOTWIRE_CATALOG_DSN is not a valid PostgreSQL DSN: {e}") from None
        self._conninfo = {**_CONNECT_DEFAULTS, "application_name": application_name, **info}
        self.where = describe_dsn(dsn)
        self.problem: str | None = None  # why the database is unreachable now, or None
        self._lock = threading.Lock()  # the writer connection
        self._writer: psycopg.Connection | None = None

    def open(self) -> None:
        """Connect the writer and create the schema (replicas starting together included);
        ``psycopg.Error`` when the database cannot be reached."""
        with self._lock:
            self._writer = self._writer or self.connect()
            with self._writer.transaction():
                # Replicas starting together: CREATE ... IF NOT EXISTS is not safe concurrently.
                self._writer.execute("SELECT pg_advisory_xact_lock(hashtext('hotwire_catalog_schema'))")
                self._writer.execute(_SCHEMA)
                (version,) = self._writer.execute(
                    "SELECT schema_version FROM hotwire_catalog_state").fetchone()
        if version != SCHEMA_VERSION:
            raise RuntimeError(f"the catalog database has schema {version}; this build reads "
                               f"{SCHEMA_VERSION}")

    def connect(self, listener: bool = False) -> psycopg.Connection:
        """A new connection; the listener's is named ``<application_name>-listener``."""
        info = dict(self._conninfo)
        if listener:
            info["application_name"] = f"{info['application_name']}-listener"
        return psycopg.connect(**info, autocommit=True)

    def require_reachable(self) -> None:
        """``Unavailable`` while :attr:`problem` is set."""
        if self.problem is not None:
            raise unavailable(f"{self.problem}; retry once it is back")

    def write(self, body: Callable[[psycopg.Connection], T]) -> T:
        """``body`` in one transaction."""
        return self.run(body, transaction=True)

    def run(self, body: Callable[[psycopg.Connection], T], transaction: bool = False) -> T:
        """Run ``body`` on the writer connection, once more on a new one if the first died
        before committing (a server restart shows only on first use); else ``Unavailable``.
        While :attr:`problem` is set, ``Unavailable`` at once. A write the server refused for
        want of space (SQLSTATE 53100 ``disk_full``: "could not extend file") is
        :class:`.records.CatalogFull`, rolled back, the connection kept: the database is
        reachable, retrying elsewhere would not help."""
        self.require_reachable()
        with self._lock:
            for attempt in range(2):
                committing = False
                try:
                    conn = self._writer = self._writer or self.connect()
                    if not transaction:
                        return body(conn)
                    with conn.transaction():
                        result = body(conn)
                        committing = True
                    return result
                except psycopg.errors.DiskFull as e:
                    raise CatalogFull(f"the catalog database {self.where}", " ".join(str(e).split())) from e
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

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
