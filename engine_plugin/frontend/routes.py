"""Which of the server's generation routes hand ``vllm_xargs`` to the engine.

Found from the app itself, not from vLLM's version: a POST route of a generation path whose
endpoint takes a request model with a ``vllm_xargs`` field. A route whose model lacks it (vLLM
0.25's ``/v1/messages``) would drop a spec silently, so hotwire leaves it alone: no header that
would claim steering, no rewriting.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

GENERATE = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"})
MODELS = "/v1/models"
XARGS = "vllm_xargs"


def steerable_paths(app: Any) -> frozenset[str]:
    """The generation paths of ``app`` (a FastAPI app) whose requests carry ``vllm_xargs``."""
    return frozenset(
        route.path for route in getattr(app, "routes", ())
        if getattr(route, "path", None) in GENERATE and "POST" in (getattr(route, "methods", None) or ())
        and _takes_xargs(getattr(route, "endpoint", None)))


def _takes_xargs(endpoint: Any) -> bool:
    try:
        params = inspect.signature(endpoint, eval_str=True).parameters.values()
    except (TypeError, ValueError, NameError):
        return False
    return any(_has_xargs(p.annotation) for p in params)


def _has_xargs(annotation: Any) -> bool:
    fields = getattr(annotation, "model_fields", None) if isinstance(annotation, type) else None
    if isinstance(fields, dict):
        return XARGS in fields
    return any(_has_xargs(arg) for arg in typing.get_args(annotation))
