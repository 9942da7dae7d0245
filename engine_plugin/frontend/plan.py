"""What the API server does with one generation request's body, before vLLM validates it.

1. ``"model": "<served-name>:<preset>"`` becomes the served name plus the preset's entries
   (an unknown preset of a served model: 404, as vLLM answers an unknown LoRA adapter).
2. ``vllm_xargs.hotwire`` given as a JSON object or list (vLLM accepts only scalars there for
   completions, and refuses a dict with a confusing 400) becomes the JSON string the engine reads.
3. ``{"preset": "<name>"}`` items of the spec are replaced by the preset's entries; an unknown one
   leaves the spec as sent, and the engine runs the request unsteered (``preset_unresolved``).
4. The engine's admission decision is taken on the resulting spec (:class:`.engine_view.EngineView`):
   it becomes the ``x-hotwire`` header, or, in strict mode, a 400 naming the reason, before any
   compute. Strict mode is the server's ``HOTWIRE_STRICT``, or the request's
   ``vllm_xargs.hotwire_strict`` (true or false), which wins; that key goes no further.

Presets need the control API: when it cannot answer, a request that names a preset gets a 503
saying so, and requests that name none are not affected. Anyone who can send a request names
the presets, so what one request costs is bounded before anything is asked: a spec of more items
than the engine takes (:data:`~hotwire.shared.spec.MAX_ENTRIES`) is judged as it stands, no
preset looked up; looking up stops at the first unknown name; and presets that would expand past
the engine's limits on a spec are refused by counting their entries and characters, without
building the text. The engine then receives a short text it refuses for the same reason, so it
counts what the header says.

The reason in the header and in a refusal's message can tell which vectors exist and how large
they are. With a read token configured (``HOTWIRE_READ_TOKEN``), only a caller that sends it is
told (:meth:`Plan.withheld` is what everyone else gets).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from hotwire.shared.spec import MAX_ENTRIES, MAX_SPEC_CHARS, SPEC_KEY, spec_text

from .engine_view import EngineView
from .models import SEPARATOR, ServedModels
from .preset_source import Preset, PresetSource, PresetsUnavailable
from .verdict import APPLIED, UNVERIFIED, Verdict

STRICT_KEY = "hotwire_strict"


UNSTEERED_WITHHELD = ("hotwire: the request would run unsteered (the reason is told to callers "
                      "that send the read token in the x-hotwire-token header)")
UNCHECKED_WITHHELD = "hotwire: the steering this request asks for cannot be checked now; retry later"


@dataclass(frozen=True)
class Refusal:
    """An answer given instead of vLLM's, in vLLM's error shape. ``withheld``: the message for a
    caller who may not read the catalog, when ``message`` says more than it may know."""

    status: int
    type: str
    message: str
    param: str
    verdict: Verdict | None = None
    withheld: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


@dataclass(frozen=True)
class Plan:
    body: dict[str, Any] | None  # the body to send on; None: the original bytes, unchanged
    verdict: Verdict | None  # None: the request asked for no steering
    refusal: Refusal | None = None

    def withheld(self) -> Plan:
        """The plan as told to a caller without the read token: the same decision, the verdict
        without its reason, a refusal without the detail."""
        refusal = self.refusal
        if refusal is not None and refusal.verdict is not None:
            refusal = replace(refusal, message=refusal.withheld or refusal.message,
                              verdict=refusal.verdict.withheld())
        return replace(self, verdict=None if self.verdict is None else self.verdict.withheld(),
                       refusal=refusal)


class _Refused(Exception):
    def __init__(self, refusal: Refusal):
        self.refusal = refusal


class Planner:
    def __init__(self, strict: bool, engine: EngineView, presets: PresetSource | None):
        self.strict, self.engine, self.presets = strict, engine, presets

    async def plan(self, doc: dict[str, Any], served: Callable[[], Awaitable[ServedModels]],
                   reader: bool = True) -> Plan:
        """``doc`` is the request body (changed in place); ``served`` lists vLLM's models, asked
        only for a model name that may name a preset; ``reader``: the caller may be told why a
        spec would run unsteered (see :meth:`Plan.withheld`)."""
        try:
            plan = await self._plan(doc, served)
        except _Refused as e:
            plan = Plan(None, e.refusal.verdict, e.refusal)
        return plan if reader else plan.withheld()

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

        text, verdict = await self._spec(raw, model, model_preset)
        if text != raw:
            if xargs is None:
                xargs = doc["vllm_xargs"] = {}
            xargs[SPEC_KEY] = text
            changed = True
        if verdict is None:
            verdict = self.engine.judge(text)
        if strict and verdict is not None and verdict.state != APPLIED:
            if verdict.state == UNVERIFIED:
                raise _Refused(Refusal(503, "ServiceUnavailableError", "hotwire strict mode cannot "
                                       f"check the spec: {verdict.detail}", "vllm_xargs.hotwire",
                                       verdict, UNCHECKED_WITHHELD))
            raise _Refused(Refusal(400, "BadRequestError", "hotwire: the request would run "
                                   f"unsteered ({verdict.reason}): {verdict.detail}",
                                   "vllm_xargs.hotwire", verdict, UNSTEERED_WITHHELD))
        return Plan(doc if changed else None, verdict)

    async def _spec(self, raw: Any, model: Any, model_preset: str | None) -> tuple[str, Verdict | None]:
        """The spec text for the engine, presets expanded, and the verdict when hotwire decides
        it here (a preset unresolved, presets expanding past the engine's limits); None: the
        engine's admission decides on the text."""
        items = _items(raw)
        if items is None or len(items) > MAX_ENTRIES:
            return _as_sent(raw), None  # the engine refuses it as it stands (malformed, too_large, ...)
        if model_preset is None and all(_preset_ref(item) is None for item in items):
            return (raw if isinstance(raw, str) else spec_text(items)), None  # nothing to expand
        entries: list[Any] = []
        size = _Size()
        if model_preset is not None:
            preset = await self._preset(model_preset, "model")
            if preset is None:
                raise _Refused(Refusal(404, "NotFoundError", f"The model `{model}` does not exist.",
                                       "model", Verdict.unsteered("preset_unresolved",
                                                                  f"no preset {model_preset!r}")))
            entries += preset.entries
            size.add(len(preset.entries), preset.chars)
        for item in items:
            if (over := size.over()) is not None:
                return _REFUSED_TEXT[over.reason], over
            name = _preset_ref(item)
            preset = None if name is None else await self._preset(name, "vllm_xargs.hotwire")
            if name is not None and preset is None:
                return _as_sent(raw), Verdict.unsteered("preset_unresolved", (
                    f"no preset {name!r}" if self.presets is not None
                    else f"preset {name!r}: no control API (HOTWIRE_CONTROL_URL) to ask"))
            if preset is not None:
                entries += preset.entries
                size.add(len(preset.entries), preset.chars)
            else:
                entries.append(item)
                size.add(1, len(spec_text([item])) - 2)
        if (over := size.over()) is not None:
            return _REFUSED_TEXT[over.reason], over
        return spec_text(entries), None

    async def _preset(self, name: str, param: str) -> Preset | None:
        if self.presets is None:
            return None
        try:
            return await self.presets.get(name)
        except PresetsUnavailable as e:
            raise _Refused(Refusal(503, "ServiceUnavailableError",
                                   f"hotwire: preset {name!r} cannot be read: {e}", param,
                                   Verdict.unsteered("presets_unavailable", str(e)),
                                   UNCHECKED_WITHHELD)) from None


class _Size:
    """The entries and characters of a spec text being expanded, counted before it is built."""

    def __init__(self) -> None:
        self.entries = self.chars = 0  # chars: the entries' own, without brackets and commas

    def add(self, entries: int, chars: int) -> None:
        self.entries += entries
        self.chars += chars

    def over(self) -> Verdict | None:
        """The engine's refusal of the text these entries make (its length is checked first)."""
        length = 2 + self.chars + max(self.entries - 1, 0)
        if length > MAX_SPEC_CHARS:
            return Verdict.unsteered("too_large", f"the presets expand to more than {MAX_SPEC_CHARS} "
                                     "characters of spec")
        if self.entries > MAX_ENTRIES:
            return Verdict.unsteered("too_many_entries", f"the presets expand to more than "
                                     f"{MAX_ENTRIES} entries")
        return None


# Short texts the engine's parser refuses for these reasons (length first, then the count), sent
# in place of an expansion refused before it was built.
_REFUSED_TEXT = {"too_large": "[" + " " * MAX_SPEC_CHARS + "]",
                 "too_many_entries": spec_text([{}] * (MAX_ENTRIES + 1))}


def _as_sent(raw: Any) -> str:
    return raw if isinstance(raw, str) else json.dumps(raw)


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
