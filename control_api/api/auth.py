"""The bearer-token guards: ``HOTWIRE_TOKEN`` for writes, ``HOTWIRE_READ_TOKEN`` (or the write
token) for reads."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from .dependencies import services
from .http_errors import ApiError

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(
    HTTPBearer(auto_error=False, description="HOTWIRE_TOKEN (writes and reads) or "
               "HOTWIRE_READ_TOKEN (reads)"))]


async def require_writer(request: Request, credentials: Credentials) -> None:
    """Writes need ``Authorization: Bearer $HOTWIRE_TOKEN`` when a token is configured."""
    token = services(request).settings.token
    if token is not None:
        _check_bearer(credentials, [token], "writes")


async def require_reader(request: Request, credentials: Credentials) -> None:
    """Reads of the catalog, the slot table and the metrics need ``HOTWIRE_READ_TOKEN`` or the
    write token when a read token is configured; without one they are open."""
    settings = services(request).settings
    if settings.read_token is not None:
        _check_bearer(credentials, [t for t in (settings.read_token, settings.token) if t], "reads")


def _check_bearer(credentials: HTTPAuthorizationCredentials | None, tokens: list[SecretStr],
                  what: str) -> None:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", f"{what} need an `Authorization: Bearer <token>` header",
                       challenge)
    given = credentials.credentials.encode()
    # Compare with every token, so the time taken does not say which one nearly matched.
    matches = [secrets.compare_digest(given, t.get_secret_value().encode()) for t in tokens]
    if not any(matches):
        raise ApiError(401, "unauthorized", "the bearer token is not valid", challenge)
