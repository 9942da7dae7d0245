"""Putting :class:`.middleware.HotwireMiddleware` into vLLM's OpenAI server, with no flag.

vLLM loads general plugins in its API server process while it builds the engine configuration,
after the server's modules are imported and before the app is built; the module functions that
build the app are bound by name in several modules, and they moved between vLLM versions. What
every version shares is a FastAPI app, whose middleware stack Starlette builds on the app's
first ASGI call. So the class method that builds it is wrapped (on whichever class of FastAPI's
MRO defines it): an app with generation routes that take ``vllm_xargs`` (:mod:`.routes`) gets the
middleware appended to its user middleware, innermost, inside vLLM's CORS and ``--api-key``
middleware. Other apps are left alone.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from starlette.middleware import Middleware

from .middleware import HotwireMiddleware
from .routes import steerable_paths

log = logging.getLogger("vllm.hotwire")


def patch_fastapi(module: ModuleType) -> None:
    """Wrap ``build_middleware_stack`` of ``module.FastAPI`` once (a post-import patch)."""
    owner = next((c for c in module.FastAPI.__mro__ if "build_middleware_stack" in c.__dict__), None)
    if owner is None:
        log.error("hotwire: FastAPI has no build_middleware_stack; the API server does not check "
                  "specs (no strict mode, no x-hotwire header, no presets)")
        return
    build = owner.__dict__["build_middleware_stack"]
    if getattr(build, "__hotwire__", False):
        return

    @functools.wraps(build)
    def build_middleware_stack(self: Any):
        user = getattr(self, "user_middleware", None)
        if isinstance(user, list) and not any(m.cls is HotwireMiddleware for m in user):
            paths = steerable_paths(self)
            if paths:
                user.append(Middleware(HotwireMiddleware, paths=paths))
        return build(self)

    build_middleware_stack.__hotwire__ = True
    owner.build_middleware_stack = build_middleware_stack

