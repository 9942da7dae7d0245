"""Probes and metrics: ``/healthz`` (process up), ``/readyz`` (engine usable), ``/metrics``.

The probes are open to anyone (orchestrators call them without credentials); ``/metrics`` is a
read, guarded like the catalog when ``HOTWIRE_READ_TOKEN`` is set.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from ..auth import require_reader
from ..dependencies import ServicesDep
from ..http_errors import responses

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    reason: str | None = None


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and serving HTTP."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(svc: ServicesDep) -> JSONResponse:
    """200 when an engine is attached, armed, beating and in sync with the catalog; else 503."""
    problem = svc.engines.readiness_problem()
    body = Readiness(ready=problem is None, reason=problem)
    return JSONResponse(body.model_dump(), status_code=200 if problem is None else 503)


@router.get("/metrics", response_class=Response, dependencies=[Depends(require_reader)],
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **responses(401)})
async def metrics(svc: ServicesDep) -> Response:
    """Prometheus text exposition."""
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)
