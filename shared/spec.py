"""Request spec: what a request asks to be steered with.

Wire format (compatible with the original hotwire): ``extra_args["hotwire"]`` is a JSON string
(vLLM's OpenAI server forwards scalars only), a dict, or a list of entries::

    {"id": "tesla_car", "layer": 20, "scale": 1.5, "decode_only": true}

Additions: several entries on one layer add up; ``scale`` is any float finite in float32 and costs no
table space; ``positions`` picks tokens: ``"all"`` (default), ``"prompt"``, ``"generated"``
(same as ``decode_only``) or ``[start, end)`` absolute token positions; ``layers`` (a list, or
``"all"``: every armed layer) instead of ``layer`` applies one entry at many layers; ``mode`` says
what the entry does to the stream (``Mode``, default ``"add"``: the original wire format),
``lo``/``hi`` bound a ``clamp``; ``gate`` applies the entry only to tokens whose stream at an
earlier (or the same) layer projects on a probe vector above a threshold. The formulas are in
:mod:`hotwire.engine_plugin.interventions`.
An item ``{"preset": name}`` names a preset, which the OpenAI server expands before the engine
sees the request; the engine refuses one that reaches it (``preset_unresolved``).

Parsing never raises past :func:`parse_spec` except :class:`SpecError`, whose ``reason`` is a
short stable code used as a metric label. Callers run such requests unsteered.

Spec texts are parsed once each: the engine parses every request's spec on its hot path, and a
deployment steers with a handful of specs. Anyone who can send a request chooses the text, so the
cache is bounded by bytes, a text is at most :data:`MAX_SPEC_CHARS` long, and texts that mean the
same entries share one parsed copy. It is bounded by count too: every parsed spec it keeps is a
few objects Python's collector walks in each full collection of the engine core, whose frozen
start-up heap leaves little else there.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import sys
import threading
from collections import OrderedDict
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

SPEC_KEY = "hotwire"
MAX_ENTRIES = 16
# What users and the OpenAPI schema see. Python's ``$`` also matches before a final newline, so
# Python code checks ids with :func:`valid_id` (a full match), never ``re.match(ID_PATTERN)``.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NO_END = 2**31 - 1  # "until the end of the sequence" as an int32 position bound
MAX_SPEC_CHARS = 16 * 1024  # a spec text longer than this is refused ("too_large")
SPEC_CACHE_BYTES = 4 * 2**20  # parsed spec texts kept, counted as below
# ... and at most this many texts. With the byte budget alone, a server sent a new two-entry spec
# with every other request kept about 1,600 texts (11,000 objects for the collector to walk), and
# its engine core's full collections took twice as long as a plugin-free one's (14 against 7 ms;
# H100, 256 in flight). A request's spec is parsed on arrival and again at admission, a step or
# so later: a few hundred texts keep that second parse a hit.
SPEC_CACHE_TEXTS = 256
# Memory the cache counts, measured with tracemalloc (CPython 3.11, canonical texts made):
_SLOT_BYTES = 250  # one text's slot: its dict node and tuple (measured about 220)
_SPEC_BYTES = 400  # one parsed Spec: the tuple, its attribute dict, its canonical texts (about 360)
_ENTRY_BYTES = 850  # one SteerEntry and its canonical row, twice (about 830)

_ID_RE = re.compile(ID_PATTERN)
# The canonical row's JSON (sorted keys, compact); json.dumps builds an encoder per call when given
# options, so it is made once. :meth:`SteerEntry.canonical_text` writes the same text field by field
# and uses it for a gate only (the salt of a steered request is made on the engine core's input
# thread, whose GIL the step thread shares).
_ROW_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_STR_JSON = json.encoder.encode_basestring_ascii  # a JSON string literal (C)
_F32 = struct.Struct("<f")  # the op computes in float32: a scale is stored as its float32 bits

# JSON types, never coerced: a boolean is not a layer or a scale (``true`` would be 1), text is
# not a number, a number is not a flag. A strict float still takes an int (``"scale": 2``).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Positions = Union[Literal["all", "prompt", "generated"], tuple[Int, Int]]
Mode = Literal["add", "norm", "ablate", "clamp"]
PROJECTION_MODES = frozenset({"norm", "ablate", "clamp"})  # need the stream h, and v's direction
MAX_PROJECTION_SCALE = 64.0  # |scale| of norm/ablate: past it an entry only saturates the stream


def _f32_finite(v: float, what: str) -> float:
    try:
        if math.isfinite(v):
            _F32.pack(v)  # OverflowError where float32 rounds it to infinity
            return v
    except OverflowError:
        pass
    raise ValueError(f"{what} must be finite in float32 (|{what}| < 3.4e38)")


def f32_bits(v: float) -> int:
    """``v`` rounded to float32, as the int32 with the same bits (a route-table word)."""
    return int.from_bytes(_F32.pack(v), "little", signed=True)


class SpecError(ValueError):
    """A spec that cannot be honoured; ``reason`` is a metric label, ``detail`` is for logs."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Gate(BaseModel):
    """Apply the entry only to tokens with ``h_P · p̂ > threshold`` (``h_P``: the stream at the end of
    probe layer ``P``, before that layer's own entries; ``p̂``: the probe vector, normalised).
    ``scope: "prompt"`` decides once, on the prompt's last token, for that token and every later
    one (the request's earlier tokens are never steered by it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    probe: str = Field(pattern=ID_PATTERN)
    layer: Int = Field(ge=0)
    threshold: Float = 0.0
    scope: Literal["token", "prompt"] = "token"

    @field_validator("threshold")
    @classmethod
    def _finite(cls, v: float) -> float:
        return _f32_finite(v, "threshold")


class SteerEntry(BaseModel):
    """One intervention of a request: a vector, where (layers, tokens) and what (mode)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    id: str = Field(pattern=ID_PATTERN)
    layer: Int | None = Field(None, ge=0)
    layers: tuple[Annotated[Int, Field(ge=0)], ...] | Literal["all"] | None = None
    mode: Mode = "add"
    scale: Float = 1.0
    lo: Float | None = None
    hi: Float | None = None
    gate: Gate | None = None
    decode_only: Bool = False
    positions: Positions = "all"

    @field_validator("scale")
    @classmethod
    def _finite(cls, v: float) -> float:
        return _f32_finite(v, "scale")

    @field_validator("lo", "hi")
    @classmethod
    def _finite_bound(cls, v: float | None, info) -> float | None:
        return None if v is None else _f32_finite(v, info.field_name)

    @field_validator("positions")
    @classmethod
    def _range(cls, v: Positions) -> Positions:
        if isinstance(v, tuple) and not (0 <= v[0] < v[1] <= NO_END):
            raise ValueError("positions range must satisfy 0 <= start < end")
        return v

    @field_validator("layers")
    @classmethod
    def _layer_list(cls, v):
        if isinstance(v, tuple):
            if not v:
                raise ValueError("layers must name at least one layer")
            if len(set(v)) != len(v):
                raise ValueError("layers must not repeat a layer")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SteerEntry":
        if (self.layer is None) == (self.layers is None):
            raise ValueError("give exactly one of layer and layers")
        if self.decode_only and self.positions not in ("all", "generated"):
            raise ValueError("decode_only conflicts with positions")
        if self.mode == "clamp":
            if self.lo is None and self.hi is None:
                raise ValueError("clamp needs lo, hi or both")
            if self.lo is not None and self.hi is not None and self.lo > self.hi:
                raise PydanticCustomError("bad_params", "clamp needs lo <= hi, got lo={lo} > hi={hi}",
                                          {"lo": self.lo, "hi": self.hi})
        elif self.lo is not None or self.hi is not None:
            raise ValueError(f"lo and hi bound a clamp; mode is {self.mode!r}")
        if self.gate is not None and self.layers != "all":  # "all": checked against the armed layers
            first = self.layer if self.layer is not None else min(self.layers)  # type: ignore[arg-type]
            if self.gate.layer > first:
                raise PydanticCustomError("bad_params", "a gate reads an earlier layer: its layer {p} is "
                                          "after the entry's layer {first}", {"p": self.gate.layer, "first": first})
        if self.mode in ("norm", "ablate") and abs(self.scale) > MAX_PROJECTION_SCALE:
            raise ValueError(f"{self.mode} scale must be within +-{MAX_PROJECTION_SCALE:g}")
        return self

    @property
    def where(self) -> Positions:
        """Effective token selector (``decode_only`` folded into ``positions``)."""
        return "generated" if self.decode_only else self.positions

    @property
    def relative_to_prompt(self) -> bool:
        """Do the tokens this entry steers depend on where the prompt ends?"""
        return self.where in ("prompt", "generated") or (self.gate is not None and self.gate.scope == "prompt")

    def targets(self, armed: frozenset[int] | set[int]) -> tuple[int, ...]:
        """The decoder layers this entry applies at: ``layers: "all"`` means every armed layer."""
        if self.layer is not None:
            return (self.layer,)
        return tuple(sorted(armed)) if self.layers == "all" else self.layers  # type: ignore[return-value]

    def span(self, prompt_len: int) -> tuple[int, int]:
        """Absolute position interval ``[lo, hi)`` this entry steers for a prompt of that length."""
        where = self.where
        if where == "all":
            return 0, NO_END
        if where == "prompt":
            return 0, prompt_len
        if where == "generated":
            return prompt_len, NO_END
        return where  # type: ignore[return-value]

    def canonical(self) -> dict[str, Any]:
        """Equal steering, equal form; an add on one layer keeps the original form. Its JSON text
        (sorted keys, compact) is :meth:`canonical_text`."""
        where = self.where
        form: dict[str, Any] = {"id": self.id, "scale": self.scale,
                                "positions": list(where) if isinstance(where, tuple) else where}
        if self.layer is not None:
            form["layer"] = self.layer
        else:
            form["layers"] = self.layers if self.layers == "all" else list(self.layers)
        if self.mode != "add":
            form["mode"] = self.mode
        if self.mode == "clamp":
            form["lo"], form["hi"] = self.lo, self.hi
        if self.gate is not None:
            form["gate"] = self.gate.model_dump()
        return form

    def canonical_text(self) -> str:
        """``canonical()`` as JSON with sorted keys and no spaces, written field by field (a third
        of the encoder's time: this runs for every new spec text on the engine core)."""
        where = self.where
        if self.mode == "add" and self.layer is not None and self.gate is None and isinstance(where, str):
            return (f'{{"id":{_STR_JSON(self.id)},"layer":{int.__repr__(self.layer)},"positions":"{where}",'
                    f'"scale":{float.__repr__(self.scale)}}}')  # the common entry, in one go
        parts = []
        if self.gate is not None:
            parts.append('"gate":' + _ROW_JSON(self.gate.model_dump()))
        if self.mode == "clamp":
            parts.append('"hi":' + _number(self.hi))
        parts.append('"id":' + _STR_JSON(self.id))
        if self.layer is not None:
            parts.append(f'"layer":{int.__repr__(self.layer)}')
        else:
            parts.append('"layers":' + ('"all"' if self.layers == "all" else
                                        "[" + ",".join(map(int.__repr__, self.layers)) + "]"))  # type: ignore[arg-type]
        if self.mode == "clamp":
            parts.append('"lo":' + _number(self.lo))
        if self.mode != "add":
            parts.append(f'"mode":"{self.mode}"')
        parts.append('"positions":' + (f"[{int.__repr__(where[0])},{int.__repr__(where[1])}]"
                                       if isinstance(where, tuple) else f'"{where}"'))
        parts.append('"scale":' + float.__repr__(self.scale))
        return "{" + ",".join(parts) + "}"


def _number(v: float | None) -> str:
    """A finite float or None as JSON writes it."""
    return "null" if v is None else float.__repr__(v)


class Spec(tuple):
    """A parsed spec: its entries in the order written (a tuple of :class:`SteerEntry`), with what
    its prefix-cache salt reads made once, when it is built: its canonical texts, the ids it reads,
    whether its tokens depend on the prompt's end. The spec cache shares one ``Spec`` between every
    request that sends the same text, so the salt of each of them (:func:`cache_salt`, on the
    engine core's input thread, whose GIL the step thread shares) costs a hash, not the JSON again.
    (Plain attributes: a ``cached_property`` took a lock per read on Python 3.11.)"""

    form: str  # the entries' canonical texts in their order: equal texts for equal steering
    canonical: str  # the same, order-independent (:func:`canonical_json`)
    reads: tuple[str, ...]  # the ids of every vector it reads, its entries' and its gates' probes, sorted
    relative_to_prompt: bool  # does any entry choose its tokens relative to the prompt's end?

    def __new__(cls, entries=()):
        spec = super().__new__(cls, entries)
        rows, reads, relative = [], set(), False
        for e in spec:
            rows.append(e.canonical_text())
            reads.add(e.id)
            if e.gate is not None:
                reads.add(e.gate.probe)
            relative = relative or e.relative_to_prompt
        spec.form = "[" + ",".join(rows) + "]"  # entries on one layer are summed in the order written
        rows.sort()
        spec.canonical = "[" + ",".join(rows) + "]"
        spec.reads = tuple(sorted(reads))
        spec.relative_to_prompt = relative
        return spec


def parse_spec(raw: Any) -> Spec:
    """Parse ``extra_args["hotwire"]`` into entries, or raise :class:`SpecError`.

    An empty list means "not steered" and parses to ``()``.
    """
    if isinstance(raw, (str, bytes)):
        return _parse_text(raw)
    return _parse_items(raw)


def _parse_text(raw: str | bytes) -> Spec:
    """JSON text, the form the OpenAI server forwards: parsed once per distinct text. The entries
    are frozen, so requests share them; refusals are not cached."""
    entries = _cache.get(raw)
    if entries is not None:
        return entries
    if len(raw) > MAX_SPEC_CHARS:
        raise SpecError("too_large", f"spec is {len(raw)} characters long, at most {MAX_SPEC_CHARS}")
    valid = _valid_json(raw)
    if valid is not None:
        return _cache.put(raw, Spec(valid))
    try:
        items = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise SpecError("malformed", f"not JSON: {e}") from None
    return _cache.put(raw, _parse_items(items))


_ENTRY_LIST = TypeAdapter(Annotated[list[SteerEntry], Field(max_length=MAX_ENTRIES)])


def _valid_json(raw: str | bytes) -> list[SteerEntry] | None:
    """The entries of a valid spec text, parsed and validated in one pass by pydantic's JSON parser
    (half the time of ``json.loads`` then validation), or None for any text it does not take: the
    slower path then finds out why, in the words a refusal gives (:func:`_parse_items`)."""
    try:
        if raw.lstrip()[:1] in ("[", b"["):
            return _ENTRY_LIST.validate_json(raw)
        return [SteerEntry.model_validate_json(raw)]
    except ValidationError:
        return None


class _SpecCache:
    """Spec text -> entries, least recently used first out, within ``budget`` bytes and ``texts``
    texts.

    A text costs its own size; its entries are interned by their (order-preserving) canonical
    form and cost once however many texts spell them, so padding a spec with whitespace costs
    the padding only. Thread-safe: the engine parses on more than one thread.
    """

    def __init__(self, budget: int, texts: int):
        self.budget, self.texts = budget, texts
        self.size = 0
        self._texts: OrderedDict[str | bytes, tuple[str, Spec]] = OrderedDict()
        self._forms: dict[str, list] = {}  # canonical form -> [entries, texts using it]
        self._lock = threading.Lock()

    def get(self, raw: str | bytes) -> Spec | None:
        with self._lock:
            hit = self._texts.get(raw)
            if hit is None:
                return None
            self._texts.move_to_end(raw)
            return hit[1]

    def put(self, raw: str | bytes, entries: Spec) -> Spec:
        form = entries.form
        cost = sys.getsizeof(raw) + _SLOT_BYTES
        with self._lock:
            if raw in self._texts:
                return self._texts[raw][1]
            shared = self._forms.get(form)
            if shared is None:
                shared = self._forms[form] = [entries, 0]
                self.size += _form_bytes(form, entries)
            shared[1] += 1
            self._texts[raw] = (form, shared[0])
            self.size += cost
            while (self.size > self.budget or len(self._texts) > self.texts) and len(self._texts) > 1:
                self._evict_oldest()
            return shared[0]

    def _evict_oldest(self) -> None:
        raw, (form, _) = self._texts.popitem(last=False)
        self.size -= sys.getsizeof(raw) + _SLOT_BYTES
        shared = self._forms[form]
        shared[1] -= 1
        if not shared[1]:
            del self._forms[form]
            self.size -= _form_bytes(form, shared[0])


def _form_bytes(form: str, entries: Spec) -> int:
    return sys.getsizeof(form) + _SPEC_BYTES + _ENTRY_BYTES * len(entries)


_cache = _SpecCache(SPEC_CACHE_BYTES, SPEC_CACHE_TEXTS)


def _parse_items(raw: Any) -> Spec:
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_ENTRIES:
        raise SpecError("too_many_entries", f"{len(items)} entries, at most {MAX_ENTRIES}")
    entries = []
    for item in items:
        if not isinstance(item, dict):
            raise SpecError("malformed", f"entry must be an object, got {type(item).__name__}")
        if "preset" in item:
            raise SpecError("preset_unresolved", f"preset {item['preset']!r} reached the engine unexpanded "
                            "(presets are expanded by hotwire in vLLM's OpenAI server)")
        try:
            entries.append(SteerEntry.model_validate(item))
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "entry"
            reason = "bad_params" if first["type"] == "bad_params" else "malformed"
            raise SpecError(reason, f"{loc}: {first['msg']}") from None
    return Spec(entries)


def spec_text(entries: Any) -> str:
    """The JSON text the engine receives for a list of entries (compact, in their order): what the
    OpenAI server builds when it expands presets, and what :data:`MAX_SPEC_CHARS` bounds, so a
    preset is checked against the limit a request using it meets."""
    return json.dumps(list(entries), separators=(",", ":"))


def spec_from_extra_args(extra_args: dict[str, Any] | None) -> Any:
    """The raw spec of a request, or ``None`` when it asks for no steering."""
    if not extra_args:
        return None
    return extra_args.get(SPEC_KEY)


def canonical_json(entries: tuple[SteerEntry, ...]) -> str:
    """Order-independent JSON form of a spec: equal steering gives equal text."""
    return (entries if isinstance(entries, Spec) else Spec(entries)).canonical


def cache_salt(entries: tuple[SteerEntry, ...], versions: dict[str, str] | None = None,
               prompt_len: int | None = None) -> str:
    """Prefix-cache salt for a steered request (invariant 5): two requests get the same salt only
    where every token of theirs is steered the same.

    ``versions`` maps vector ids to their version in the engine (``MailboxView.versions``) for
    every vector the spec reads, its entries' and its gates' probes: a replaced, deleted or
    re-pushed vector never reuses KV blocks computed under other rows. ``prompt_len`` is mixed in
    when an entry's tokens are chosen relative to the prompt's end (``prompt``, ``generated``,
    ``decode_only``, a prompt-scoped gate): a follow-up chat turn carries the last answer, steered
    as generated tokens, as its prompt.
    """
    spec = entries if isinstance(entries, Spec) else Spec(entries)
    text = spec.canonical
    if versions:  # ids are [A-Za-z0-9._-] and versions the engine's own "epoch/slot:seq,...": no quoting
        text += "{" + ",".join(f'"{vid}":"{versions.get(vid, "")}"' for vid in spec.reads) + "}"
    if spec.relative_to_prompt:
        text += f"|prompt_len={prompt_len}"
    return "hotwire:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def layer_ranges(text: str) -> list[int]:
    """``"10-12,20"`` -> ``[10, 11, 12, 20]``, in the order written; ValueError when malformed.

    The one syntax for naming layers, used by ``HOTWIRE_LAYERS`` and the CLI's ``--layers``.
    """
    layers: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        layers.extend(range(int(lo), int(hi or lo) + 1))
    return layers


def valid_id(vector_id: str) -> bool:
    """``vector_id`` matches :data:`ID_PATTERN` as a whole (no trailing newline)."""
    return isinstance(vector_id, str) and _ID_RE.fullmatch(vector_id) is not None
