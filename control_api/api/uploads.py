"""Read a vector upload: JSON with base64 values, or multipart with a safetensors file.

Everything that needs no engine is checked here (size, content type, fields, id syntax, dtype,
encoding, metadata); shape, finiteness and layers are checked against the attached engine's model
by the upload protocol (:mod:`..slots.registration`). The body is read with a hard cap, so an
oversized upload costs at most the cap, and at most :data:`MAX_CONCURRENT_UPLOADS` are read at
once (see :class:`UploadGate`). Decoding runs on a worker thread, in slices that let the event
loop run, so probes and reads answer while large uploads are decoded.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import Message, Scope

from hotwire.shared.metadata import MAX_METADATA_DEPTH, Metadata
from hotwire.shared.spec import ID_PATTERN, valid_id
from hotwire.shared.wire import DTYPE_NAMES, decode_base64, dtype_code, read_safetensors

from ..slots.registration import Upload
from .http_errors import ApiError, describe_validation

MAX_CONCURRENT_UPLOADS = 2  # each costs up to about 4x the upload limit in memory while decoded
UPLOAD_WAIT_S = 30.0  # how long an upload waits for its turn before a 503
_REPLAY_CHUNK = 2**20  # multipart bodies are parsed this many bytes per event-loop turn


class UploadGate:
    """At most ``limit`` uploads are read and decoded at once; the others wait for their turn
    (their bodies unread, so waiting costs a connection, not memory), for ``wait_s`` at most,
    then get 503 ``busy``."""

    def __init__(self, limit: int = MAX_CONCURRENT_UPLOADS, wait_s: float = UPLOAD_WAIT_S):
        self.limit, self.wait_s = limit, wait_s
        self._turns = anyio.Semaphore(limit)

    @property
    def busy(self) -> int:
        """Uploads being read or decoded now."""
        return self.limit - self._turns.value

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        try:
            with anyio.fail_after(self.wait_s):
                await self._turns.acquire()
        except TimeoutError:
            raise ApiError(503, "busy", f"{self.limit} uploads are being received already and none "
                           f"finished within {self.wait_s:g}s; retry later",
                           {"Retry-After": "5"}) from None
        try:
            yield
        finally:
            self._turns.release()


class UploadOptions(BaseModel):
    """What an upload says about the vector, besides its values."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description=f"vector id, matching {ID_PATTERN}",
                    json_schema_extra={"pattern": ID_PATTERN})
    layers: list[int] | None = Field(None, description="decoder layers to materialise a "
                                     "[n_layers, hidden] vector on; default: every armed layer")
    pin: bool = Field(False, description="never evict this vector")
    metadata: Metadata = Field(default_factory=dict, description="free-form JSON object: "
                               f"finite numbers only, nested at most {MAX_METADATA_DEPTH} deep")
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
        "metadata": {"type": "string", "description": "JSON object; empty means {}"},
        "replace": {"type": "boolean"},
    },
}
OPENAPI_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": JsonUpload.model_json_schema()},
    "multipart/form-data": {"schema": FORM_SCHEMA},
}}}


async def read_upload(request: Request, max_bytes: int) -> Upload:
    """The upload in ``request``, or :class:`ApiError` / :class:`VectorError` saying what is wrong.

    Callers hold a :meth:`UploadGate.turn`.
    """
    content_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type not in ("application/json", "multipart/form-data"):
        raise ApiError(415, "unsupported_media_type", f"content type {content_type or 'none'!r}: "
                       "send application/json (base64 values) or multipart/form-data (a "
                       "safetensors file)")
    body = await _read_capped(request, max_bytes)
    if content_type == "application/json":
        return await anyio.to_thread.run_sync(_from_json, body)
    return await _from_form(request.scope, body)


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
    return _upload(req, vector, DTYPE_NAMES[dtype_code(req.dtype)])


async def _from_form(scope: Scope, body: bytes) -> Upload:
    offset = 0

    async def replay() -> Message:
        """The body again, a slice per call, with a loop turn between slices: the multipart
        parser runs on the event loop."""
        nonlocal offset
        await anyio.lowlevel.checkpoint()
        chunk = body[offset:offset + _REPLAY_CHUNK]
        offset += _REPLAY_CHUNK
        return {"type": "http.request", "body": chunk, "more_body": offset < len(body)}

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
        for name, value in fields.items():
            if not isinstance(value, str):
                raise ApiError(422, "invalid_request", f"`{name}` must be a form field, not a file")
        blob = await file.read()
    finally:
        await form.close()
    return await anyio.to_thread.run_sync(_decode_form, fields, blob)


def _decode_form(fields: dict[str, str], blob: bytes) -> Upload:
    key = fields.pop("key", None) or None
    if "metadata" in fields and not fields["metadata"].strip():
        del fields["metadata"]  # an empty field, as forms send an unset one: no metadata
    if "layers" in fields:
        fields["layers"] = _parse_layers(fields["layers"])
    if "metadata" in fields:
        fields["metadata"] = _parse_json_object(fields["metadata"])
    try:
        options = UploadOptions.model_validate(fields)
    except ValidationError as e:
        raise ApiError(422, "invalid_request", describe_validation(e.errors())) from None
    _check_id(options.id)
    vector, dtype = read_safetensors(blob, key)
    return _upload(options, vector, dtype)


def _upload(options: UploadOptions, vector: np.ndarray, dtype: str) -> Upload:
    return Upload(options.id, vector, dtype,
                  None if options.layers is None else tuple(options.layers),
                  options.pin, options.metadata, options.replace)


def _check_id(vector_id: str) -> None:
    if not valid_id(vector_id):
        raise ApiError(422, "bad_id", f"id {_clip(vector_id)} must match {ID_PATTERN}")


def _parse_layers(text: str) -> list[int]:
    """``"[10, 11]"`` or ``"10,11"``."""
    try:
        layers = json.loads(text) if text.lstrip().startswith("[") else [
            int(part) for part in text.split(",") if part.strip()]
    except (ValueError, RecursionError):
        layers = None
    if not isinstance(layers, list) or not all(type(x) is int for x in layers):
        raise ApiError(422, "bad_layers", f"layers {_clip(text)} must be a JSON list or a comma "
                       "list of layer indices")
    return layers


def _parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ApiError(422, "invalid_request", f"metadata is not JSON: {e}") from None
    except RecursionError:
        raise ApiError(422, "invalid_request", f"metadata nests deeper than {MAX_METADATA_DEPTH} "
                       "levels") from None
    if not isinstance(value, dict):
        raise ApiError(422, "invalid_request", "metadata must be a JSON object")
    return value


def _clip(text: str, limit: int = 80) -> str:
    """``repr(text)``, shortened: error messages quote what was sent, not megabytes of it."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"
