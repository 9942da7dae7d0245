"""``/steer/vectors``: register, list, inspect and delete steering vectors."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, Field

from hotwire.shared.mailbox import ANY_LAYER
from hotwire.shared.spec import ID_PATTERN

from ..catalog import VectorRecord
from ..dependencies import ServicesDep, require_reader, require_writer
from ..errors import ApiError, responses
from ..slots import EngineView, ResidencyState, SlotManager
from ..uploads import OPENAPI_BODY, read_upload

PATH = "/steer/vectors"
router = APIRouter(prefix=PATH, tags=["vectors"])
# pydantic checks patterns with a regex engine whose ``$`` is the end of the text: no "id\n".
VectorId = Annotated[str, Path(pattern=ID_PATTERN, description=f"vector id, matching {ID_PATTERN}",
                               examples=["tesla_car"])]


class SlotRef(BaseModel):
    slot: int
    layer: int | None = Field(description="null: serves every layer")


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
    resident: bool = Field(description="every row is in the engine's slot table")
    state: ResidencyState
    reason: str | None = Field(description="why it is not resident")
    slots: list[SlotRef]


class VectorList(BaseModel):
    vectors: list[VectorInfo]


def vector_info(record: VectorRecord, slots: SlotManager, view: EngineView | None) -> VectorInfo:
    where = slots.residency(record, view)
    return VectorInfo(
        id=record.id, generation=record.generation, dtype=record.dtype, shape=list(record.shape),
        layers=None if record.layers is None else list(record.layers), pinned=record.pinned,
        metadata=record.metadata,
        created_at=datetime.fromtimestamp(record.created_at, timezone.utc),
        updated_at=datetime.fromtimestamp(record.updated_at, timezone.utc),
        resident=where.resident, state=where.state, reason=where.reason,
        slots=[SlotRef(slot=s, layer=None if layer == ANY_LAYER else layer) for s, layer in where.slots])


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
    record, created = await svc.slots.register(upload)
    if not created:
        response.status_code = 200
    return vector_info(record, svc.slots, svc.slots.view())


@router.get("", response_model=VectorList, dependencies=[Depends(require_reader)],
            responses=responses(401))
async def list_vectors(svc: ServicesDep) -> VectorList:
    view = svc.slots.view()
    records = sorted(svc.catalog.records().values(), key=lambda r: r.id)
    return VectorList(vectors=[vector_info(r, svc.slots, view) for r in records])


@router.get("/{vector_id}", response_model=VectorInfo, dependencies=[Depends(require_reader)],
            responses=responses(401, 404, 422))
async def get_vector(vector_id: VectorId, svc: ServicesDep) -> VectorInfo:
    record = svc.catalog.get(vector_id)
    if record is None:
        raise ApiError(404, "not_found", f"no vector {vector_id!r}")
    return vector_info(record, svc.slots, svc.slots.view())


@router.delete("/{vector_id}", status_code=204, response_class=Response,
               dependencies=[Depends(require_writer)], responses=responses(401, 404, 409, 422, 507))
async def delete_vector(vector_id: VectorId, svc: ServicesDep) -> Response:
    """Retire the vector's slots and drop it from the catalog (pinned vectors too)."""
    await svc.slots.remove(vector_id)
    return Response(status_code=204)
