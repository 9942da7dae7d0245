"""Errors of the control service's domain: what a caller did that cannot be done, as data.

Each carries a stable machine-readable ``code`` and a ``message`` saying what was wrong and,
where it helps, what to do. The kind (the class) says what sort of refusal it is; the HTTP API
maps each kind to its status in one place (:mod:`.api.http_errors`), so nothing below the API
knows about HTTP.
"""

from __future__ import annotations


class ControlError(Exception):
    """A refusal: ``code`` is stable, ``message`` is for people."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class NotFound(ControlError):
    """No such vector (``not_found``)."""


class Conflict(ControlError):
    """The name is taken (``exists``, ``preset_exists``) or belongs to the engine
    (``startup_vector``)."""


class Unavailable(ControlError):
    """Not now; retrying later may succeed: no engine (``no_engine``, ``engine_starting``,
    ``engine_unresponsive``, ``engine_restarted``) or no writable catalog (``catalog_lost``,
    ``catalog_unavailable``)."""


class NoRoom(ControlError):
    """The engines' slots cannot take it (``no_space``, ``evict_timeout``)."""


class StorageFull(ControlError):
    """The catalog's storage took nothing in (``storage_full``): its disk or a quota is full, a
    file size limit is reached, or the disk fails; the write was rolled back."""
