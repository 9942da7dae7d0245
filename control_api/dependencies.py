"""Request-scoped access to the app's services, and the bearer-token guard for writes."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .catalog import Catalog
from .errors import ApiError
from .metrics import Metrics
from .settings import Settings
from .slots import SlotManager


@dataclass(frozen=True)
class Services:
    """Everything a route needs; made by the app's lifespan, one set per app."""

    settings: Settings
    catalog: Catalog
    slots: SlotManager
    metrics: Metrics


def services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]
_bearer = HTTPBearer(auto_error=False, description="the control API's HOTWIRE_TOKEN")


async def require_writer(request: Request,
                         credentials: Annotated[HTTPAuthorizationCredentials | None,
                                                Depends(_bearer)]) -> None:
    """Writes need ``Authorization: Bearer $HOTWIRE_TOKEN`` when a token is configured."""
    token = services(request).settings.token
    if token is None:
        return
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", "writes need an `Authorization: Bearer <token>` header",
                       challenge)
    if not secrets.compare_digest(credentials.credentials.encode(), token.get_secret_value().encode()):
        raise ApiError(401, "unauthorized", "the bearer token is not valid", challenge)
