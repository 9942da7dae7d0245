"""``/steer/vectors``: register, list, inspect and delete steering vectors."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, Field

from hotwire.shared.mailbox import ANY_LAYER
from hotwire.shared.spec import ID_PATTERN

from ...slots.engines import Engines
from ...slots.residency import Residency, ResidencyState
from ...slots.snapshot import EngineSnapshot
from ...store.records import VectorRecord
from ..auth import require_reader, require_writer
from ..dependencies import ServicesDep
from ..http_errors import ApiError, responses
from ..uploads import OPENAPI_BODY, read_upload

PATH = "/steer/vectors"
router = APIRouter(prefix=PATH, tags=["vectors"])
# pydantic checks patterns with a regex engine whose ``$`` is the end of the text: no "id\n".
VectorId = Annotated[str, Path(pattern=ID_PATTERN, description=f"vector id, matching {ID_PATTERN}",
                               examples=["tesla_car"])]


class SlotRef(BaseModel):
    slot: int
    layer: int | None = Field(description="null: serves every layer")


class RankInfo(BaseModel):
    dp_rank: int = Field(description="data-parallel rank of the engine (0 without DP)")
    resident: bool
    state: ResidencyState
    reason: str | None
    slots: list[SlotRef]


class ReplicaInfo(BaseModel):
    replica: str
    generation: int | None = Field(description="the catalog generation the report is about")
    state: ResidencyState | None = Field(description="null: the replica's report does not "
                                         "mention the vector")
    reason: str | None
    age_s: float = Field(description="since the replica last reported; 0 for this replica "
                         "(read live)")
    stale: bool = Field(description="older than a few seconds, or not about the current "
                        "generation")


class VectorInfo(BaseModel):
    id: str
    generation: int = Field(description="grows on every replace; salts the engine's prefix cache")
    dtype: str = Field(description="element type as uploaded (stored as float32)")
    shape: list[int]
    layers: list[int] | None = Field(description="layers asked for; null: every armed layer")
    pinned: bool
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    resident: bool = Field(description="every row is in the slot table of every engine (DP "
                           "rank) of this replica")
    state: ResidencyState = Field(description="resident, or the state of the first rank that "
                                  "lacks it")
    reason: str | None = Field(description="why it is not resident (per rank, with DP)")
    slots: list[SlotRef] = Field(description="rank 0's slots")
    ranks: list[RankInfo] = Field(description="residency on each DP rank of this replica")
    replicas: list[ReplicaInfo] | None = Field(
        None, description="GET /steer/vectors/{id} only: every replica's report (with SQLite: "
        "this replica alone)")


class VectorList(BaseModel):
    vectors: list[VectorInfo]


def _slot_refs(where: Residency) -> list[SlotRef]:
    return [SlotRef(slot=s, layer=None if layer == ANY_LAYER else layer) for s, layer in where.slots]


def vector_info(record: VectorRecord, engines: Engines,
                views: dict[int, EngineSnapshot | None]) -> VectorInfo:
    where = engines.residency(record, views)
    overall = where.overall
    return VectorInfo(
        id=record.id, generation=record.generation, dtype=record.dtype, shape=list(record.shape),
        layers=None if record.layers is None else list(record.layers), pinned=record.pinned,
        metadata=record.metadata,
        created_at=datetime.fromtimestamp(record.created_at, timezone.utc),
        updated_at=datetime.fromtimestamp(record.updated_at, timezone.utc),
        resident=overall.resident, state=overall.state, reason=overall.reason,
        slots=_slot_refs(overall),
        ranks=[RankInfo(dp_rank=r.rank, resident=r.residency.resident, state=r.residency.state,
                        reason=r.residency.reason, slots=_slot_refs(r.residency))
               for r in where.ranks])


@router.post("", status_code=201, response_model=VectorInfo, openapi_extra=OPENAPI_BODY,
             dependencies=[Depends(require_writer)],
             responses={200: {"model": VectorInfo, "description": "replaced"},
                        **responses(401, 409, 413, 415, 422, 503, 507)})
async def register_vector(request: Request, response: Response, svc: ServicesDep) -> VectorInfo:
    """Register a vector (201), or replace one with ``replace=true`` (200).

    JSON: ``{id, data (base64), dtype, shape, layers?, pin?, metadata?, replace?}``.
    Multipart: ``file`` (safetensors), ``id``, and optionally ``key``, ``layers``, ``pin``,
    ``metadata``, ``replace``. Two uploads are received at a time; others wait their turn
    (503 ``busy`` after 30 s).
    """
    async with svc.uploads.turn():
        upload = await read_upload(request, svc.settings.max_upload_bytes)
    record, created = await svc.engines.register(upload)
    if not created:
        response.status_code = 200
    return vector_info(record, svc.engines, svc.engines.views())


@router.get("", response_model=VectorList, dependencies=[Depends(require_reader)],
            responses=responses(401))
async def list_vectors(svc: ServicesDep) -> VectorList:
    views = svc.engines.views()
    records = sorted(svc.catalog.records().values(), key=lambda r: r.id)
    return VectorList(vectors=[vector_info(r, svc.engines, views) for r in records])


@router.get("/{vector_id}", response_model=VectorInfo, dependencies=[Depends(require_reader)],
            responses=responses(401, 404, 422))
async def get_vector(vector_id: VectorId, svc: ServicesDep) -> VectorInfo:
    record = svc.catalog.get(vector_id)
    if record is None:
        raise ApiError(404, "not_found", f"no vector {vector_id!r}")
    info = vector_info(record, svc.engines, svc.engines.views())
    reports = await svc.replicas.of(record, info.state, info.reason)
    info.replicas = [ReplicaInfo(**vars(r)) for r in reports]
    return info


@router.delete("/{vector_id}", status_code=204, response_class=Response,
               dependencies=[Depends(require_writer)], responses=responses(401, 404, 409, 422, 507))
async def delete_vector(vector_id: VectorId, svc: ServicesDep) -> Response:
    """Retire the vector's slots and drop it from the catalog (pinned vectors too)."""
    await svc.engines.remove(vector_id)
    return Response(status_code=204)
