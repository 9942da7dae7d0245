"""The ASGI middleware hotwire puts into vLLM's OpenAI server (see :mod:`.install`).

It works on HTTP only, so it holds across vLLM versions: generation requests (``POST`` to the
paths of :data:`.routes.GENERATE` whose routes take ``vllm_xargs``) are read whole, planned
(:mod:`.plan`), refused or sent on rewritten, and their response carries the ``x-hotwire`` header
from its first message (streams included); ``GET /v1/models`` gains the presets. It sits inside
vLLM's own middleware (CORS, ``--api-key``): a request it sees is authenticated. Whatever fails
inside hotwire, the request goes on as it came: hotwire never keeps vLLM from serving.

With ``HOTWIRE_READ_TOKEN`` set, why a spec would run unsteered is told only to a caller that
sends that token in the ``x-hotwire-token`` header (:data:`TOKEN_HEADER`; not ``Authorization``,
which holds vLLM's ``--api-key`` and which OpenAI clients always send); the header goes no
further than hotwire.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import HotwireConfig
from .engine_view import EngineView
from .models import ServedModels, with_presets
from .plan import Planner, Refusal
from .preset_source import PresetSource, PresetsUnavailable
from .routes import MODELS
from .settings import FrontendSettings
from .verdict import HEADER

log = logging.getLogger("vllm.hotwire")
TOKEN_HEADER = b"x-hotwire-token"  # carries the read token: the caller may be told the reasons


class HotwireMiddleware:
    def __init__(self, app: ASGIApp, paths: frozenset[str]):
        """``paths``: the generation paths to work on (:func:`.routes.steerable_paths`)."""
        self.app, self.paths = app, paths
        self.presets: PresetSource | None = None
        self.planner: Planner | None = None
        self.read_token: bytes | None = None
        try:
            settings, cfg = FrontendSettings.from_env(), HotwireConfig.from_env()
        except ValueError:  # the engine cannot read them either, and serves unsteered
            log.exception("hotwire: bad settings; the API server passes requests on unchecked")
            return
        if settings.read_token is not None:
            self.read_token = settings.read_token.encode()
        if settings.control_url is not None:
            self.presets = PresetSource(settings.control_url, settings.read_token,
                                        settings.presets_ttl_s)
        self.planner = Planner(settings.strict, EngineView(cfg.mailbox), self.presets)
        log.info("hotwire: API server checks specs on %s before the engine (strict %s, presets "
                 "from %s)", ", ".join(sorted(paths)), "on" if settings.strict else "off",
                 settings.control_url or "nowhere")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.planner is not None:
            path = _route(scope)
            if scope["method"] == "POST" and path in self.paths:
                return await self._generate(scope, receive, send)
            if scope["method"] == "GET" and path == MODELS and self.presets is not None:
                return await self._models(scope, receive, send)
        await self.app(scope, receive, send)

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader = self._reader(scope["headers"])
        scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != TOKEN_HEADER]}
        body, more = await _read_body(receive)
        doc = _json_object(scope, body) if more is None else None
        plan = None
        if doc is not None:
            try:
                plan = await self.planner.plan(doc, lambda: self._served(scope), reader)
            except Exception:
                log.exception("hotwire: could not plan a request; it goes on as sent")
        if plan is not None and plan.refusal is not None:
            return await _refuse(send, plan.refusal)
        if plan is not None and plan.body is not None:
            body = json.dumps(plan.body).encode()
            scope = {**scope, "headers": _with_length(scope["headers"], len(body))}
        if plan is not None and plan.verdict is not None:
            send = _with_header(send, plan.verdict.header)
        await self.app(scope, _replay(body, more, receive), send)

    def _reader(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """May this request be told the reasons: no read token is configured, or it carries it."""
        if self.read_token is None:
            return True
        given = [v for k, v in headers if k.lower() == TOKEN_HEADER]
        return len(given) == 1 and hmac.compare_digest(given[0], self.read_token)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        start, body = await _capture(self.app, scope, receive)
        if start["status"] == 200:
            try:
                body = json.dumps(with_presets(json.loads(body), await self.presets.all())).encode()
            except PresetsUnavailable as e:
                log.warning("hotwire: /v1/models lists no presets: %s", e)
            except Exception:
                log.exception("hotwire: presets not listed in /v1/models")
        await send({**start, "headers": _with_length(start.get("headers", []), len(body))})
        await send({"type": "http.response.body", "body": body})

    async def _served(self, request: Scope) -> ServedModels:
        """vLLM's own model list, asked in process (behind the authentication already passed)."""
        path = request.get("root_path", "") + MODELS
        scope = {**request, "method": "GET", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "headers": []}

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        start, body = await _capture(self.app, scope, nothing)
        if start["status"] != 200:
            raise ValueError(f"{MODELS} answered {start['status']}")
        return ServedModels.of(json.loads(body))


def _route(scope: Scope) -> str:
    """The path routes are matched on (``root_path`` taken off, as Starlette does)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole request body, and the message that ended it early (a disconnect) or None."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _json_object(scope: Scope, body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (vLLM answers whatever else it is)."""
    ctype = dict(scope["headers"]).get(b"content-type", b"application/json")
    if b"json" not in ctype.lower():
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _replay(body: bytes, early: Message | None, receive: Receive) -> Receive:
    """A receive that hands out ``body`` once, then whatever the client sends next."""
    first: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if early is not None:
        first.append(early)

    async def replay() -> Message:
        return first.pop(0) if first else await receive()

    return replay


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    return [*((k, v) for k, v in headers if k.lower() != b"content-length"),
            (b"content-length", str(length).encode())]


def _with_header(send: Send, value: bytes) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] < 400:
            message = {**message, "headers": [*message.get("headers", []), (HEADER, value)]}
        await send(message)

    return sending


async def _refuse(send: Send, refusal: Refusal) -> None:
    body = json.dumps(refusal.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.verdict is not None:
        headers.append((HEADER, refusal.verdict.header))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _capture(app: ASGIApp, scope: Scope, receive: Receive) -> tuple[Message, bytes]:
    """Run ``app`` and keep its whole answer: ``(start message, body)``."""
    start: Message = {"type": "http.response.start", "status": 500, "headers": []}
    chunks: list[bytes] = []

    async def keep(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, keep)
    return start, b"".join(chunks)
