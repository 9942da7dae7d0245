"""Errors as data: every failure leaves the API as ``{"error": {"code", "message"}}``.

``code`` is stable and machine-readable; ``message`` says what was wrong and, where it helps,
what to do. Codes in use:

=====  =========================================================================
401    ``unauthorized``: missing or wrong bearer token on a write
404    ``not_found``: unknown vector id or route
405    ``method_not_allowed``
409    ``exists`` (id taken; use replace), ``startup_vector`` (id owned by the engine)
413    ``too_large``: request body over the upload limit
415    ``unsupported_media_type``: upload neither JSON nor multipart
422    ``invalid_request``, ``bad_id``, ``bad_layers``, and the vector codes of
       :class:`hotwire.shared.wire.VectorError`: ``bad_dtype``, ``bad_shape``,
       ``bad_encoding``, ``not_finite``
503    ``no_engine``, ``engine_starting``, ``engine_unresponsive``, ``engine_restarted``
507    ``no_space`` (nothing evictable), ``evict_timeout`` (evicted slots stayed busy)
=====  =========================================================================
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from hotwire.shared.wire import VectorError


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """Raise anywhere below a route to answer with ``status`` and an error body."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def responses(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI ``responses=`` entries documenting the error body for these statuses."""
    return {s: {"model": ErrorBody} for s in statuses}


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    async def vector_error(_: Request, exc: VectorError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.detail)

    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", describe_validation(exc.errors()))

    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return error_response(exc.status_code, code, str(exc.detail), exc.headers)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(VectorError, vector_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)


def describe_validation(errors: list[dict]) -> str:
    """One line per pydantic error: ``field.path: message``."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)
