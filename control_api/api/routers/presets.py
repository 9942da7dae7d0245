"""``/steer/presets``: store, list, show and delete named steering recipes."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hotwire.shared.metadata import MAX_METADATA_DEPTH, Metadata
from hotwire.shared.spec import ID_PATTERN, MAX_ENTRIES, MAX_SPEC_CHARS, valid_id

from ...store.records import PresetRecord
from ..auth import require_reader, require_writer
from ..dependencies import ServicesDep
from ..http_errors import ApiError, describe_validation, responses
from ..preset_entries import check_entries

PATH = "/steer/presets"
MAX_METADATA_CHARS = 64 * 1024  # a calibration sweep's points fit many times over
# room for a description, whitespace around the entries, and the metadata
MAX_BODY_BYTES = 4 * MAX_SPEC_CHARS + MAX_METADATA_CHARS
MAX_DESCRIPTION_CHARS = 1024
router = APIRouter(prefix=PATH, tags=["presets"])
PresetName = Annotated[str, Path(pattern=ID_PATTERN, description=f"preset name, matching "
                                 f"{ID_PATTERN}", examples=["calm"])]


class PresetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description=f"preset name, matching {ID_PATTERN}",
                      json_schema_extra={"pattern": ID_PATTERN})
    entries: list[dict[str, Any]] = Field(
        description=f"at most {MAX_ENTRIES} spec entries and {MAX_SPEC_CHARS} characters as "
        "compact JSON (a spec's limits), as a request's `hotwire` spec holds them (`id`, `layer` "
        "or `layers`, `scale`, `mode`, `positions`, ...); the vectors need not be registered yet")
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_CHARS, pattern=r"^[^\x00]*$",
                                    description="free text, without NUL characters")
    metadata: Metadata = Field(
        default_factory=dict, description="what made the preset (e.g. `hotwire vectors sweep`'s "
        f"measurements): a JSON object, finite numbers only, nested at most {MAX_METADATA_DEPTH} "
        f"deep, at most {MAX_METADATA_CHARS} characters as compact JSON")
    replace: bool = Field(False, description="replace a preset of this name")

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        chars = len(json.dumps(value, separators=(",", ":")))
        if chars > MAX_METADATA_CHARS:
            raise ValueError(f"metadata is {chars} characters as compact JSON; at most "
                             f"{MAX_METADATA_CHARS}")
        return value


class PresetInfo(BaseModel):
    name: str
    entries: list[dict[str, Any]]
    description: str | None
    created_at: datetime
    metadata: dict[str, Any]


class PresetList(BaseModel):
    presets: list[PresetInfo]


OPENAPI_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": PresetIn.model_json_schema()}}}}


def preset_info(record: PresetRecord) -> PresetInfo:
    return PresetInfo(name=record.name, entries=list(record.entries),
                      description=record.description,
                      created_at=datetime.fromtimestamp(record.created_at, timezone.utc),
                      metadata=record.metadata)


@router.post("", status_code=201, response_model=PresetInfo, openapi_extra=OPENAPI_BODY,
             dependencies=[Depends(require_writer)],
             responses={200: {"model": PresetInfo, "description": "replaced"},
                        **responses(401, 409, 413, 415, 422, 503)})
async def store_preset(request: Request, response: Response, svc: ServicesDep) -> PresetInfo:
    """Store a preset (201), or replace one with ``replace=true`` (200).

    JSON ``{name, entries, description?, metadata?, replace?}``; entries are checked as the
    engine parses a spec, within a spec's limits (422 ``bad_entries`` with the parser's reason),
    and may not name presets.
    """
    preset = await _read_preset(request)
    if not valid_id(preset.name):
        raise ApiError(422, "bad_id", f"preset name {preset.name[:80]!r} must match {ID_PATTERN}")
    entries = check_entries(preset.entries)
    svc.catalog.require_writable()
    record, created = svc.catalog.put_preset(preset.name, entries, preset.description,
                                             replace=preset.replace, metadata=preset.metadata)
    if not created:
        response.status_code = 200
    return preset_info(record)


@router.get("", response_model=PresetList, dependencies=[Depends(require_reader)],
            responses=responses(401, 503))
async def list_presets(svc: ServicesDep) -> PresetList:
    return PresetList(presets=[preset_info(p) for p in svc.catalog.presets()])


@router.get("/{name}", response_model=PresetInfo, dependencies=[Depends(require_reader)],
            responses=responses(401, 404, 422, 503))
async def get_preset(name: PresetName, svc: ServicesDep) -> PresetInfo:
    record = svc.catalog.preset(name)
    if record is None:
        raise unknown_preset(name)
    return preset_info(record)


@router.delete("/{name}", status_code=204, response_class=Response,
               dependencies=[Depends(require_writer)], responses=responses(401, 404, 422, 503))
async def delete_preset(name: PresetName, svc: ServicesDep) -> Response:
    svc.catalog.require_writable()
    if not svc.catalog.delete_preset(name):
        raise unknown_preset(name)
    return Response(status_code=204)


def unknown_preset(name: str) -> ApiError:
    return ApiError(404, "unknown_preset", f"no preset {name!r}")


async def _read_preset(request: Request) -> PresetIn:
    """The body, read with a hard cap (413 ``too_large``); 415 unless JSON."""
    content_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", f"content type {content_type or 'none'!r}: "
                       "send application/json")
    too_large = ApiError(413, "too_large", f"a preset body is at most {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise too_large
    try:
        return PresetIn.model_validate_json(body)
    except ValidationError as e:
        raise ApiError(422, "invalid_request", describe_validation(e.errors())) from None
