"""Engine-side settings, read from the environment of every vLLM process."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hotwire.shared.mailbox import DEFAULT_MAILBOX
from hotwire.shared.spec import layer_ranges


@dataclass(frozen=True)
class HotwireConfig:
    slots: int = 1024  # bank rows: one per (vector, layer), or per vector for (hidden,) vectors
    layers: str = "all"  # decoder layers to arm: "all" or e.g. "0,4,10-20"
    entries: int = 4  # routing columns: entries one request may put on one layer
    vectors_dir: str | None = None  # startup vectors, loaded before the mailbox opens
    mailbox: str | None = DEFAULT_MAILBOX  # None disables the control-API mailbox

    @classmethod
    def from_env(cls) -> "HotwireConfig":
        env = os.environ
        mailbox = env.get("HOTWIRE_MAILBOX", DEFAULT_MAILBOX)
        return cls(
            slots=int(env.get("HOTWIRE_SLOTS", cls.slots)),
            layers=env.get("HOTWIRE_LAYERS", cls.layers),
            entries=int(env.get("HOTWIRE_ENTRIES", cls.entries)),
            vectors_dir=env.get("HOTWIRE_VECTORS") or None,
            mailbox=None if mailbox.lower() in ("", "off", "none") else mailbox,
        )

    def armed_layers(self, n_layers: int) -> list[int]:
        """Parse ``layers`` against a model with ``n_layers`` decoder layers."""
        if self.layers.strip().lower() == "all":
            return list(range(n_layers))
        return sorted({i for i in layer_ranges(self.layers) if 0 <= i < n_layers})
