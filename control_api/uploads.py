"""Read a vector upload: JSON with base64 values, or multipart with a safetensors file.

Everything that needs no engine is checked here (size, content type, fields, id syntax, dtype,
encoding); shape, finiteness and layers are checked against the attached engine's model by the
slot manager. The body is read with a hard cap, so an oversized upload costs at most the cap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import Message, Scope

from hotwire.shared.spec import ID_PATTERN, valid_id
from hotwire.shared.wire import decode_base64, decode_safetensors, dtype_code

from .errors import ApiError, describe_validation

_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


class UploadOptions(BaseModel):
    """What an upload says about the vector, besides its values."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description=f"vector id, matching {ID_PATTERN}")
    layers: list[int] | None = Field(None, description="decoder layers to materialise a "
                                     "[n_layers, hidden] vector on; default: every armed layer")
    pin: bool = Field(False, description="never evict this vector")
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form JSON object")
    replace: bool = Field(False, description="replace an existing vector of this id")


class JsonUpload(UploadOptions):
    """``application/json`` upload: raw little-endian values, base64-encoded."""

    data: str = Field(description="base64 of the raw little-endian values")
    dtype: str = Field(description="float32, float16, bfloat16 or float64")
    shape: list[int] = Field(description="[hidden] or [n_layers, hidden]")


FORM_SCHEMA = {
    "type": "object",
    "required": ["file", "id"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "safetensors file"},
        "id": {"type": "string", "pattern": ID_PATTERN},
        "key": {"type": "string", "description": "tensor to take when the file holds several"},
        "layers": {"type": "string", "description": "JSON list or comma list, e.g. 10,11,12"},
        "pin": {"type": "boolean"},
        "metadata": {"type": "string", "description": "JSON object"},
        "replace": {"type": "boolean"},
    },
}
OPENAPI_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": JsonUpload.model_json_schema()},
    "multipart/form-data": {"schema": FORM_SCHEMA},
}}}


@dataclass(frozen=True)
class Upload:
    vector_id: str
    vector: np.ndarray  # float32, in the uploaded shape
    dtype: str  # element type as uploaded
    layers: tuple[int, ...] | None
    pinned: bool
    metadata: dict[str, Any]
    replace: bool


async def read_upload(request: Request, max_bytes: int) -> Upload:
    body = await _read_capped(request, max_bytes)
    content_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type == "application/json":
        return _from_json(body)
    if content_type == "multipart/form-data":
        return await _from_form(request.scope, body)
    raise ApiError(415, "unsupported_media_type", f"content type {content_type or 'none'!r}: send "
                   "application/json (base64 values) or multipart/form-data (a safetensors file)")


async def _read_capped(request: Request, max_bytes: int) -> bytes:
    too_large = ApiError(413, "too_large", f"upload is larger than the limit of {max_bytes} bytes "
                         "(HOTWIRE_MAX_UPLOAD_BYTES)")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _from_json(body: bytes) -> Upload:
    try:
        req = JsonUpload.model_validate_json(body)
    except ValidationError as e:
        raise ApiError(422, "invalid_request", describe_validation(e.errors())) from None
    _check_id(req.id)
    vector = decode_base64(req.data, req.dtype, req.shape)
    return _upload(req, vector, _DTYPE_NAMES[dtype_code(req.dtype)])


async def _from_form(scope: Scope, body: bytes) -> Upload:
    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(scope, replay).form(max_files=1, max_fields=8)
    except (MultiPartException, HTTPException) as e:
        detail = e.detail if isinstance(e, HTTPException) else e.message
        raise ApiError(422, "invalid_request", f"malformed multipart body: {detail}") from None
    try:
        fields = dict(form)
        file = fields.pop("file", None)
        if not isinstance(file, UploadFile):
            raise ApiError(422, "invalid_request", "multipart upload needs a `file` part "
                           "(a safetensors file)")
        blob = await file.read()
        key = fields.pop("key", None) or None
        if "layers" in fields:
            fields["layers"] = _parse_layers(str(fields["layers"]))
        if "metadata" in fields:
            fields["metadata"] = _parse_json_object(str(fields["metadata"]))
        try:
            options = UploadOptions.model_validate(fields)
        except ValidationError as e:
            raise ApiError(422, "invalid_request", describe_validation(e.errors())) from None
    finally:
        await form.close()
    _check_id(options.id)
    vector = decode_safetensors(blob, key)
    return _upload(options, vector, _safetensors_dtype(blob, key))


def _upload(options: UploadOptions, vector: np.ndarray, dtype: str) -> Upload:
    return Upload(options.id, vector, dtype,
                  None if options.layers is None else tuple(options.layers),
                  options.pin, options.metadata, options.replace)


def _check_id(vector_id: str) -> None:
    if not valid_id(vector_id):
        raise ApiError(422, "bad_id", f"id {vector_id!r} must match {ID_PATTERN}")


def _parse_layers(text: str) -> list[int]:
    """``"[10, 11]"`` or ``"10,11"``."""
    try:
        layers = json.loads(text) if text.lstrip().startswith("[") else [
            int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        layers = None
    if not isinstance(layers, list) or not all(type(x) is int for x in layers):
        raise ApiError(422, "bad_layers", f"layers {text!r} must be a JSON list or a comma "
                       "list of layer indices")
    return layers


def _parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ApiError(422, "invalid_request", f"metadata is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ApiError(422, "invalid_request", "metadata must be a JSON object")
    return value


def _safetensors_dtype(blob: bytes, key: str | None) -> str:
    """Element type of the tensor :func:`decode_safetensors` took (the file is valid by now)."""
    header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
    name = key or next(k for k in header if k != "__metadata__")
    return _DTYPE_NAMES[header[name]["dtype"]]
