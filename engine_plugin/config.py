"""Engine-side settings, read from the environment of every vLLM process."""

from __future__ import annotations

import grp
import os
from dataclasses import dataclass

from hotwire.shared.mailbox import DEFAULT_MAILBOX
from hotwire.shared.spec import layer_ranges


@dataclass(frozen=True)
class HotwireConfig:
    slots: int = 1024  # bank rows: one per (vector, layer), or per vector for (hidden,) vectors
    layers: str = "all"  # decoder layers to arm: "all" or e.g. "0,4,10-20"
    # armed layers whose op also reads the residual, so the projecting modes (norm, ablate, clamp)
    # and gate probes can run there; "" (default): none, "all", or a list as for ``layers``
    projection_layers: str = ""
    # capture every CUDA graph a second time without the op, replayed on steps in which no
    # request is steered (:mod:`.idle_graphs`); off: those steps keep one launch per armed layer
    idle_graphs: bool = True
    # inside captured graphs, switch the op's kernels off on layers no request of the step steers
    # (:mod:`.graph_switch`); off: every armed layer's kernel runs on every steered step. Off by
    # default: ~1 µs of GPU time a layer a steered step, no served gain measured, the e2e suite not
    # yet run with it (docs/performance.md, "Session 37")
    graph_switch: bool = False
    entries: int = 4  # routing columns: entries one request may put on one layer
    vectors_dir: str | None = None  # startup vectors, loaded before the mailbox opens
    mailbox: str | None = DEFAULT_MAILBOX  # None disables the control-API mailbox
    mailbox_group: str | None = None  # group (name or gid) the mailbox file is given, mode 0660

    @classmethod
    def from_env(cls) -> "HotwireConfig":
        env = os.environ
        mailbox = env.get("HOTWIRE_MAILBOX", DEFAULT_MAILBOX)
        return cls(
            slots=int(env.get("HOTWIRE_SLOTS", cls.slots)),
            layers=env.get("HOTWIRE_LAYERS", cls.layers),
            projection_layers=env.get("HOTWIRE_PROJECTION_LAYERS", cls.projection_layers),
            idle_graphs=_flag(env.get("HOTWIRE_IDLE_GRAPHS", "1"), "HOTWIRE_IDLE_GRAPHS"),
            graph_switch=_flag(env.get("HOTWIRE_GRAPH_SWITCH", "0"), "HOTWIRE_GRAPH_SWITCH"),
            entries=int(env.get("HOTWIRE_ENTRIES", cls.entries)),
            vectors_dir=env.get("HOTWIRE_VECTORS") or None,
            mailbox=None if mailbox.lower() in ("", "off", "none") else mailbox,
            mailbox_group=env.get("HOTWIRE_MAILBOX_GROUP") or None,
        )

    def armed_layers(self, n_layers: int) -> list[int]:
        """Parse ``layers`` against a model with ``n_layers`` decoder layers."""
        return _layers(self.layers, n_layers)

    def projecting_layers(self, n_layers: int) -> frozenset[int]:
        """The armed layers where the projecting modes can run (``projection_layers``)."""
        return frozenset(_layers(self.projection_layers, n_layers)) & frozenset(self.armed_layers(n_layers))


    def mailbox_gid(self) -> int | None:
        """The gid of ``mailbox_group`` (None: the engine's own); ValueError for an unknown group."""
        group = self.mailbox_group
        if group is None or group.isdigit():
            return None if group is None else int(group)
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"HOTWIRE_MAILBOX_GROUP={group}: no such group") from None


def _flag(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{name}={text!r}: expected 1 or 0")


def _layers(text: str, n_layers: int) -> list[int]:
    if text.strip().lower() == "all":
        return list(range(n_layers))
    return sorted({i for i in layer_ranges(text) if 0 <= i < n_layers})
