"""What the API server does with one generation request's body, before vLLM validates it.

1. ``"model": "<served-name>:<preset>"`` becomes the served name plus the preset's entries
   (an unknown preset of a served model: 404, as vLLM answers an unknown LoRA adapter).
2. ``vllm_xargs.hotwire`` given as a JSON object or list (vLLM accepts only scalars there for
   completions, and refuses a dict with a confusing 400) becomes the JSON string the engine reads.
3. ``{"preset": "<name>"}`` items of the spec are replaced by the preset's entries; an unknown one
   is left in place and the engine runs the request unsteered (``preset_unresolved``).
4. The engine's admission decision is taken on the resulting spec (:class:`.engine_view.EngineView`):
   it becomes the ``x-hotwire`` header, or, in strict mode, a 400 naming the reason, before any
   compute. Strict mode is the server's ``HOTWIRE_STRICT``, or the request's
   ``vllm_xargs.hotwire_strict`` (true or false), which wins; that key goes no further.

Presets need the control API: when it cannot answer, a request that names a preset gets a 503
saying so, and requests that name none are not affected.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hotwire.shared.spec import MAX_SPEC_CHARS, SPEC_KEY

from .engine_view import EngineView
from .models import SEPARATOR, ServedModels
from .preset_source import Preset, PresetSource, PresetsUnavailable
from .verdict import APPLIED, UNVERIFIED, Verdict

STRICT_KEY = "hotwire_strict"


@dataclass(frozen=True)
class Refusal:
    """An answer given instead of vLLM's, in vLLM's error shape."""

    status: int
    type: str
    message: str
    param: str
    verdict: Verdict | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


@dataclass(frozen=True)
class Plan:
    body: dict[str, Any] | None  # the body to send on; None: the original bytes, unchanged
    verdict: Verdict | None  # None: the request asked for no steering
    refusal: Refusal | None = None


class _Refused(Exception):
    def __init__(self, refusal: Refusal):
        self.refusal = refusal


class Planner:
    def __init__(self, strict: bool, engine: EngineView, presets: PresetSource | None):
        self.strict, self.engine, self.presets = strict, engine, presets

    async def plan(self, doc: dict[str, Any], served: Callable[[], Awaitable[ServedModels]]) -> Plan:
        """``doc`` is the request body (changed in place); ``served`` lists vLLM's models, asked
        only for a model name that may name a preset."""
        try:
            return await self._plan(doc, served)
        except _Refused as e:
            return Plan(None, e.refusal.verdict, e.refusal)

    async def _plan(self, doc: dict[str, Any], served: Callable[[], Awaitable[ServedModels]]) -> Plan:
        changed = False
        model_preset = None
        model = doc.get("model")
        if self.presets is not None and isinstance(model, str) and SEPARATOR in model:
            named = (await served()).preset_of(model)
            if named is not None:
                doc["model"], model_preset = named
                changed = True
        xargs = doc.get("vllm_xargs")
        xargs = xargs if isinstance(xargs, dict) else None  # anything else: vLLM's own 400
        strict = self.strict
        if xargs is not None and STRICT_KEY in xargs:
            strict = xargs.pop(STRICT_KEY)
            changed = True
            if not isinstance(strict, bool):
                raise _Refused(Refusal(400, "BadRequestError", f"{STRICT_KEY} must be true or false",
                                       f"vllm_xargs.{STRICT_KEY}"))
        raw = None if xargs is None else xargs.get(SPEC_KEY)
        if raw is None and model_preset is None:
            return Plan(doc if changed else None, None)

        text, unresolved = await self._spec(raw, model, model_preset)
        if text != raw:
            if xargs is None:
                xargs = doc["vllm_xargs"] = {}
            xargs[SPEC_KEY] = text
            changed = True
        if unresolved:
            verdict: Verdict | None = Verdict.unsteered("preset_unresolved", unresolved)
        else:
            verdict = self.engine.judge(text)
        if strict and verdict is not None and verdict.state != APPLIED:
            if verdict.state == UNVERIFIED:
                raise _Refused(Refusal(503, "ServiceUnavailableError", "hotwire strict mode cannot "
                                       f"check the spec: {verdict.detail}", "vllm_xargs.hotwire",
                                       verdict))
            raise _Refused(Refusal(400, "BadRequestError", "hotwire: the request would run "
                                   f"unsteered ({verdict.reason}): {verdict.detail}",
                                   "vllm_xargs.hotwire", verdict))
        return Plan(doc if changed else None, verdict)

    async def _spec(self, raw: Any, model: Any, model_preset: str | None) -> tuple[str, str]:
        """The spec text for the engine, presets expanded, and why a preset stays unresolved
        ("" when none does)."""
        entries: list[Any] = []
        if model_preset is not None:
            preset = await self._preset(model_preset, "model")
            if preset is None:
                raise _Refused(Refusal(404, "NotFoundError", f"The model `{model}` does not exist.",
                                       "model", Verdict.unsteered("preset_unresolved",
                                                                  f"no preset {model_preset!r}")))
            entries += preset.entries
        items = _items(raw)
        if items is None:  # not a spec's shape: the engine says why (malformed, too_large)
            return raw if isinstance(raw, str) else json.dumps(raw), ""
        unresolved = ""
        expanded = model_preset is not None
        for item in items:
            name = _preset_ref(item)
            preset = None if name is None else await self._preset(name, "vllm_xargs.hotwire")
            if preset is not None:
                entries += preset.entries
                expanded = True
                continue
            if name is not None and not unresolved:
                unresolved = (f"no preset {name!r}" if self.presets is not None
                              else f"preset {name!r}: no control API (HOTWIRE_CONTROL_URL) to ask")
            entries.append(item)
        if isinstance(raw, str) and not expanded:
            return raw, unresolved  # the text as sent: nothing to change in it
        return json.dumps(entries, separators=(",", ":")), unresolved

    async def _preset(self, name: str, param: str) -> Preset | None:
        if self.presets is None:
            return None
        try:
            return await self.presets.get(name)
        except PresetsUnavailable as e:
            raise _Refused(Refusal(503, "ServiceUnavailableError",
                                   f"hotwire: preset {name!r} cannot be read: {e}", param,
                                   Verdict.unsteered("presets_unavailable", str(e)))) from None


def _items(raw: Any) -> list[Any] | None:
    """A spec's items (a JSON text parsed), or None when it has no item structure."""
    if raw is None:
        return []
    if isinstance(raw, str):
        if len(raw) > MAX_SPEC_CHARS:
            return None
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return None
    if isinstance(raw, dict):
        return [raw]
    return raw if isinstance(raw, list) else None


def _preset_ref(item: Any) -> str | None:
    """The name in a ``{"preset": "<name>"}`` item."""
    if isinstance(item, dict) and len(item) == 1 and isinstance(item.get("preset"), str):
        return item["preset"]
    return None
