"""Request-scoped access to the app's services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from ..slots.engines import Engines
from ..slots.replicas import ReplicaReports
from ..store.catalog import CatalogStore
from .metrics import Metrics
from .settings import Settings
from .uploads import UploadGate


@dataclass(frozen=True)
class Services:
    """Everything a route needs; made by the app's lifespan, one set per app. ``engines``: the
    slot tables of every engine (DP rank) this API feeds."""

    settings: Settings
    catalog: CatalogStore
    engines: Engines
    replicas: ReplicaReports
    metrics: Metrics
    uploads: UploadGate = field(default_factory=UploadGate)


def services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]
