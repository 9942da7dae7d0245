"""Named presets from the control API, briefly cached.

Contract: ``GET {url}/steer/presets`` -> ``{"presets": [preset, ...]}`` and
``GET {url}/steer/presets/{name}`` -> one preset or 404, where a preset is
``{"name": str, "entries": [entry, ...], "description": str | None, "created_at": str}``; reads
carry ``Authorization: Bearer <read token>`` when one is set. Every answer is reused for
``ttl_s``, a "no such preset" too: anyone who can send a request chooses the names, so a name
costs the control API at most one GET per ``ttl_s`` however many requests carry it, and requests
that ask for one name at the same time share one GET. A preset made a moment ago is found at
once unless its name was asked for (and missing) within ``ttl_s``. A name that is not a preset
name (:func:`~hotwire.shared.spec.valid_id`) is unknown without asking. Anything but an answer
(unreachable, 5xx, refused token, a body of the wrong shape) raises :class:`PresetsUnavailable`:
the caller fails the preset request, clearly, and leaves every other request alone.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from hotwire.shared.spec import spec_text, valid_id

T = TypeVar("T")
CACHED_NAMES = 4096  # answers kept, presets and unknown names together; the oldest go first


class PresetsUnavailable(RuntimeError):
    """The control API gave no usable answer; the message says what happened."""


@dataclass(frozen=True)
class Preset:
    name: str
    entries: tuple[dict[str, Any], ...]
    created: int | None  # Unix time, from ``created_at``
    chars: int = 0  # the entries' length in a spec text: the text without its brackets and commas

    @classmethod
    def of(cls, raw: Any) -> Preset:
        """ValueError unless ``raw`` is a preset object as the contract says."""
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ValueError("a preset must be an object with a string 'name'")
        entries = raw.get("entries")
        if not isinstance(entries, list):
            raise ValueError(f"preset {raw['name']!r}: 'entries' must be a list")
        chars = len(spec_text(entries)) - 1 - max(len(entries), 1)
        return cls(raw["name"], tuple(entries), _unix(raw.get("created_at")), chars)


def _unix(text: Any) -> int | None:
    try:
        return int(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


class PresetSource:
    def __init__(self, base_url: str, read_token: str | None, ttl_s: float,
                 timeout_s: float = 3.0):
        headers = {"Authorization": f"Bearer {read_token}"} if read_token else {}
        self.base_url, self.ttl_s = base_url, ttl_s
        self._client = httpx.AsyncClient(base_url=base_url, headers=headers,
                                         timeout=httpx.Timeout(timeout_s))
        self._one: dict[str, tuple[float, Preset | None]] = {}  # None: no such preset
        self._asking: dict[str, asyncio.Future[Preset | None]] = {}
        self._all: tuple[float, tuple[Preset, ...]] | None = None

    async def get(self, name: str) -> Preset | None:
        """The preset called ``name``, or None when the control API has none by that name."""
        if not valid_id(name):
            return None
        hit = self._one.get(name)
        if hit is not None and self._fresh(hit[0]):
            return hit[1]
        asking = self._asking.get(name)
        if asking is None:
            asking = self._asking[name] = asyncio.ensure_future(self._fetch(name))
            asking.add_done_callback(lambda done: self._asked(name, done))
        return await asyncio.shield(asking)  # a caller that gives up leaves the others their answer

    def _asked(self, name: str, done: asyncio.Future[Preset | None]) -> None:
        del self._asking[name]
        if not done.cancelled():
            done.exception()  # retrieved, also when every caller gave up

    async def _fetch(self, name: str) -> Preset | None:
        r = await self._get(f"/steer/presets/{quote(name, safe='')}")
        preset = None if r.status_code in (400, 404, 422) else self._parse(r, Preset.of)
        self._keep(time.monotonic(), [(name, preset)])
        return preset

    def _keep(self, at: float, answers: list[tuple[str, Preset | None]]) -> None:
        for name, preset in answers:
            self._one.pop(name, None)  # re-inserted last: the dict's order is the answers' age
            self._one[name] = (at, preset)
        while len(self._one) > CACHED_NAMES:
            del self._one[next(iter(self._one))]

    async def all(self) -> tuple[Preset, ...]:
        """Every preset, as listed by the control API."""
        if self._all is not None and self._fresh(self._all[0]):
            return self._all[1]
        r = await self._get("/steer/presets")
        presets = self._parse(r, lambda body: tuple(Preset.of(p) for p in body["presets"]))
        now = time.monotonic()
        self._all = (now, presets)
        self._keep(now, [(p.name, p) for p in presets])
        return presets

    def _fresh(self, at: float) -> bool:
        return time.monotonic() - at < self.ttl_s

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._client.get(path)
        except httpx.HTTPError as e:
            raise PresetsUnavailable(f"control API at {self.base_url} unreachable: "
                                     f"{type(e).__name__}: {e}") from None

    def _parse(self, r: httpx.Response, build: Callable[[Any], T]) -> T:
        if r.status_code != 200:
            raise PresetsUnavailable(f"control API at {self.base_url} answered {r.status_code} "
                                     f"to GET {r.request.url.path}: {r.text[:200]}")
        try:
            return build(r.json())
        except (ValueError, KeyError, TypeError) as e:
            raise PresetsUnavailable(f"control API at {self.base_url} sent a preset body of "
                                     f"the wrong shape: {e}") from None
