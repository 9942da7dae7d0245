"""API-server settings, read from the environment of vLLM's OpenAI server process.

The engine's own settings (mailbox path, entries per layer) come from
:class:`hotwire.engine_plugin.config.HotwireConfig`: the API server and the engine core are started
from the same environment, so both read the same values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class FrontendSettings:
    strict: bool = False  # refuse (HTTP 400) every spec that would run unsteered
    control_url: str | None = None  # the control API, where presets come from; None: no presets
    read_token: str | None = None  # bearer token for the control API's reads
    presets_ttl_s: float = 5.0  # how long a fetched preset (or the list) is reused

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FrontendSettings:
        """ValueError for a value that means nothing (a server must not start half-configured)."""
        env = os.environ if environ is None else environ
        strict = env.get("HOTWIRE_STRICT", "").strip().lower()
        if strict not in _TRUE + _FALSE:
            raise ValueError(f"HOTWIRE_STRICT={strict!r}: say 1 or 0")
        ttl = float(env.get("HOTWIRE_PRESETS_TTL_S", cls.presets_ttl_s))
        if not ttl >= 0:
            raise ValueError(f"HOTWIRE_PRESETS_TTL_S={ttl}: must be >= 0")
        return cls(strict=strict in _TRUE,
                   control_url=env.get("HOTWIRE_CONTROL_URL", "").rstrip("/") or None,
                   read_token=env.get("HOTWIRE_READ_TOKEN") or None,
                   presets_ttl_s=ttl)
