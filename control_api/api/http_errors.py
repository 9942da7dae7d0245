"""Errors as data: every failure leaves the API as ``{"error": {"code", "message"}}``.

``code`` is stable and machine-readable; ``message`` says what was wrong and, where it helps,
what to do. This is the one place failures become HTTP: the domain's errors
(:mod:`hotwire.control_api.errors`) by their kind (:data:`STATUS`), the vector checks'
(:class:`~hotwire.shared.wire.VectorError`) by their own status, and the API layer's own
refusals (:class:`ApiError`: tokens, bodies, request syntax) as raised. Codes in use:

=====  =========================================================================
401    ``unauthorized``: missing or wrong bearer token on a write (or on a read, when
       ``HOTWIRE_READ_TOKEN`` is set)
404    ``not_found``: unknown vector id or route; ``unknown_preset``: unknown preset name
405    ``method_not_allowed`` (the ``Allow`` header lists every method of the path;
       ``OPTIONS`` on a known path answers 204 with it)
409    ``exists`` (id taken; use replace), ``startup_vector`` (id owned by the engine),
       ``preset_exists`` (preset name taken; use replace)
413    ``too_large``: request body over the upload limit
415    ``unsupported_media_type``: upload neither JSON nor multipart
422    ``invalid_request``, ``bad_id``, ``bad_layers``, ``bad_entries`` (a preset's
       entries do not parse as a spec; the message starts with the parser's reason), and
       the vector codes of :class:`hotwire.shared.wire.VectorError`: ``bad_dtype``,
       ``bad_shape``, ``bad_encoding``, ``not_finite``
500    ``internal_error``: a bug; the traceback is logged
503    ``no_engine``, ``engine_starting``, ``engine_unresponsive``, ``engine_restarted``,
       ``busy`` (uploads waited too long for their turn), ``catalog_lost`` (the SQLite file
       was removed or replaced), ``catalog_unavailable`` (PostgreSQL unreachable)
507    ``no_space`` (nothing evictable), ``evict_timeout`` (evicted slots stayed busy),
       ``storage_full`` (the catalog's storage took nothing in: a full disk, a quota, a file
       size limit, a failing disk; nothing was changed; or another file could not be written
       for want of space)
=====  =========================================================================
"""

from __future__ import annotations

import errno
import logging

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hotwire.shared.wire import VectorError

from ..errors import Conflict, ControlError, NoRoom, NotFound, StorageFull, Unavailable

log = logging.getLogger("hotwire.control_api")
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # a write the file system would not take


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


STATUS: dict[type[ControlError], int] = {NotFound: 404, Conflict: 409, Unavailable: 503,
                                         NoRoom: 507, StorageFull: 507}


class ApiError(Exception):
    """A refusal the API layer decides itself (a token, a body, the request's syntax, a route's
    own lookup): answered with ``status`` and an error body. Code below the API raises a domain
    error (:mod:`hotwire.control_api.errors`) instead."""

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
    """Every failure answers with the error body, whatever raised it."""

    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    async def domain_error(_: Request, exc: ControlError) -> JSONResponse:
        return error_response(status_of(exc), exc.code, exc.message)

    async def vector_error(_: Request, exc: VectorError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.detail)

    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", describe_validation(exc.errors()))

    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 405:
            return _method_not_allowed(request)
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return error_response(exc.status_code, code, str(exc.detail), exc.headers)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(ControlError, domain_error)
    app.add_exception_handler(VectorError, vector_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_middleware(UnhandledErrors)


def status_of(error: ControlError) -> int:
    """The HTTP status of a domain error, by its kind (500 for a kind :data:`STATUS` lacks)."""
    return next((STATUS[kind] for kind in type(error).__mro__ if kind in STATUS), 500)


def _method_not_allowed(request: Request) -> Response:
    """405 with every method the path serves (Starlette names only the first route's), or, for
    ``OPTIONS``, 204 with the same ``Allow``."""
    methods = {"OPTIONS"}
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    allow = {"Allow": ", ".join(sorted(methods))}
    if request.method == "OPTIONS":
        return Response(status_code=204, headers=allow)
    return error_response(405, "method_not_allowed", f"{request.method} is not served at "
                          f"{request.url.path}; allowed: {allow['Allow']}", allow)


class UnhandledErrors:
    """ASGI middleware: an exception no handler took still answers with the error body.

    A file write the file system refused for want of space (``ENOSPC``, ``EFBIG``, ``EDQUOT``;
    the catalog's own are :class:`~hotwire.control_api.errors.StorageFull` already) is 507
    ``storage_full``; anything else is 500 ``internal_error`` with its traceback logged. Once a
    response has started, the exception goes on to the server, which closes the connection.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:
                raise
            refused = _no_space(exc)
            if refused is not None:
                log.error("%s %s: a file could not be written: %s", scope["method"], scope["path"],
                          refused)
                where = f" {refused.filename}" if refused.filename else ""
                response = error_response(507, "storage_full", f"a file{where} could not be "
                                          f"written ({refused.strerror}); free space there (or "
                                          "raise the limit) and retry")
            else:
                log.exception("%s %s failed", scope["method"], scope["path"])
                response = error_response(500, "internal_error", f"internal error "
                                          f"({type(exc).__name__}); the control API's log has the "
                                          "traceback")
            await response(scope, receive, send)


def _no_space(exc: BaseException | None) -> OSError | None:
    """The out-of-space ``OSError`` that is ``exc`` or that it was raised from, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def describe_validation(errors: list[dict]) -> str:
    """One line per pydantic error: ``field.path: message``."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)
