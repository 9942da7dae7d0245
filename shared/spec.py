"""Request spec: what a request asks to be steered with.

Wire format (compatible with the original hotwire): ``extra_args["hotwire"]`` is a JSON string
(vLLM's OpenAI server forwards scalars only), a dict, or a list of entries::

    {"id": "tesla_car", "layer": 20, "scale": 1.5, "decode_only": true}

Additions: several entries on one layer add up; ``scale`` is any float finite in float32 and costs no
table space; ``positions`` picks tokens: ``"all"`` (default), ``"prompt"``, ``"generated"``
(same as ``decode_only``) or ``[start, end)`` absolute token positions.

Parsing never raises past :func:`parse_spec` except :class:`SpecError`, whose ``reason`` is a
short stable code used as a metric label. Callers run such requests unsteered.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import struct
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SPEC_KEY = "hotwire"
MAX_ENTRIES = 16
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NO_END = 2**31 - 1  # "until the end of the sequence" as an int32 position bound

_ID_RE = re.compile(ID_PATTERN)
_F32 = struct.Struct("<f")  # the op computes in float32: a scale is stored as its float32 bits

Positions = Union[Literal["all", "prompt", "generated"], tuple[int, int]]


class SpecError(ValueError):
    """A spec that cannot be honoured; ``reason`` is a metric label, ``detail`` is for logs."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SteerEntry(BaseModel):
    """One ``h_L += scale * v_L`` term of a request."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    id: str = Field(pattern=ID_PATTERN)
    layer: int = Field(ge=0)
    scale: float = 1.0
    decode_only: bool = False
    positions: Positions = "all"

    @field_validator("scale")
    @classmethod
    def _finite(cls, v: float) -> float:
        try:
            if math.isfinite(v):
                _F32.pack(v)  # OverflowError where float32 rounds it to infinity
                return v
        except OverflowError:
            pass
        raise ValueError("scale must be finite in float32 (|scale| < 3.4e38)")

    @field_validator("positions")
    @classmethod
    def _range(cls, v: Positions) -> Positions:
        if isinstance(v, tuple) and not (0 <= v[0] < v[1] <= NO_END):
            raise ValueError("positions range must satisfy 0 <= start < end")
        return v

    @model_validator(mode="after")
    def _decode_only(self) -> "SteerEntry":
        if self.decode_only and self.positions not in ("all", "generated"):
            raise ValueError("decode_only conflicts with positions")
        return self

    @property
    def where(self) -> Positions:
        """Effective token selector (``decode_only`` folded into ``positions``)."""
        return "generated" if self.decode_only else self.positions

    def scale_bits(self) -> int:
        """The scale rounded to float32, as the int32 with the same bits (a route-table word)."""
        return int.from_bytes(_F32.pack(self.scale), "little", signed=True)

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
        where = self.where
        return {"id": self.id, "layer": self.layer, "scale": self.scale,
                "positions": list(where) if isinstance(where, tuple) else where}


def parse_spec(raw: Any) -> tuple[SteerEntry, ...]:
    """Parse ``extra_args["hotwire"]`` into entries, or raise :class:`SpecError`.

    An empty list means "not steered" and parses to ``()``.
    """
    if isinstance(raw, (str, bytes)):
        return _parse_text(raw)
    return _parse_items(raw)


@functools.lru_cache(maxsize=4096)
def _parse_text(raw: str | bytes) -> tuple[SteerEntry, ...]:
    """JSON text, the form the OpenAI server forwards. Parsed once per distinct text: a deployment
    steers with a handful of specs, each request's is parsed twice (prefix-cache salt, routing) on
    the engine's threads, and the entries are frozen, so sharing them is safe. Refusals are not
    cached (an exception is never stored)."""
    try:
        items = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise SpecError("malformed", f"not JSON: {e}") from None
    return _parse_items(items)


def _parse_items(raw: Any) -> tuple[SteerEntry, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_ENTRIES:
        raise SpecError("too_many_entries", f"{len(items)} entries, at most {MAX_ENTRIES}")
    entries = []
    for item in items:
        if not isinstance(item, dict):
            raise SpecError("malformed", f"entry must be an object, got {type(item).__name__}")
        try:
            entries.append(SteerEntry.model_validate(item))
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "entry"
            raise SpecError("malformed", f"{loc}: {first['msg']}") from None
    return tuple(entries)


def spec_from_extra_args(extra_args: dict[str, Any] | None) -> Any:
    """The raw spec of a request, or ``None`` when it asks for no steering."""
    if not extra_args:
        return None
    return extra_args.get(SPEC_KEY)


def canonical_json(entries: tuple[SteerEntry, ...]) -> str:
    """Order-independent JSON form of a spec: equal steering gives equal text."""
    rows = sorted((e.canonical() for e in entries), key=lambda r: json.dumps(r, sort_keys=True))
    return json.dumps(rows, sort_keys=True, separators=(",", ":"))


def cache_salt(entries: tuple[SteerEntry, ...], versions: dict[str, int] | None = None) -> str:
    """Prefix-cache salt for a steered request (invariant 5).

    ``versions`` maps vector ids to their registration generation when known, so a replaced
    vector never reuses KV blocks computed under the old one.
    """
    text = canonical_json(entries)
    if versions:
        text += json.dumps({e.id: versions.get(e.id, 0) for e in entries}, sort_keys=True)
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
    return bool(_ID_RE.match(vector_id))
