"""API-server settings, read from the environment of vLLM's OpenAI server process.

The engine's own settings (mailbox path, entries per layer) come from
:class:`hotwire.engine_plugin.config.HotwireConfig`: the API server and the engine core are started
from the same environment, so both read the same values.

Reading never fails: the middleware is built on the server's first ASGI call, where an exception
would leave a server that answers 500 to everything. A value that means nothing is logged and
read the safe way: ``HOTWIRE_STRICT`` is on unless it says off, a bad TTL is the default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("vllm.hotwire")

_OFF, _ON = ("", "0", "false", "no", "off"), ("1", "true", "yes", "on")


@dataclass(frozen=True)
class FrontendSettings:
    strict: bool = False  # refuse (HTTP 400) every spec that would run unsteered
    control_url: str | None = None  # the control API, where presets come from; None: no presets
    read_token: str | None = None  # bearer token for the control API's reads
    presets_ttl_s: float = 5.0  # how long a fetched preset (or the list) is reused

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FrontendSettings:
        env = os.environ if environ is None else environ
        strict = env.get("HOTWIRE_STRICT", "").strip().lower()
        if strict not in _OFF + _ON:
            log.error("hotwire: HOTWIRE_STRICT=%r is neither on nor off; strict mode is on", strict)
        return cls(strict=strict not in _OFF,
                   control_url=env.get("HOTWIRE_CONTROL_URL", "").strip().rstrip("/") or None,
                   read_token=env.get("HOTWIRE_READ_TOKEN") or None,
                   presets_ttl_s=_ttl(env.get("HOTWIRE_PRESETS_TTL_S")))


def _ttl(text: str | None) -> float:
    if text is None or not text.strip():
        return FrontendSettings.presets_ttl_s
    try:
        ttl = float(text)
    except ValueError:
        ttl = -1.0
    if not 0 <= ttl < float("inf"):
        log.error("hotwire: HOTWIRE_PRESETS_TTL_S=%r is not a number of seconds; using %g", text,
                  FrontendSettings.presets_ttl_s)
        return FrontendSettings.presets_ttl_s
    return ttl
