"""Presets as model names: ``<served-name>:<preset>``, listed in ``/v1/models`` as vLLM lists LoRA
adapters (``parent`` = the base model).

The served names are read from vLLM's own ``/v1/models`` answer (see
:meth:`.middleware.HotwireMiddleware`), never from vLLM internals: a base model is a card
without a parent, and a name vLLM serves (a base model or an adapter, even one with a ``:`` in
it) is always vLLM's, never a preset.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .preset_source import Preset

SEPARATOR = ":"


@dataclass(frozen=True)
class ServedModels:
    cards: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, listing: Any) -> ServedModels:
        """From a ``/v1/models`` body; ValueError when it is not one."""
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list) or not all(isinstance(c, dict) and "id" in c for c in data):
            raise ValueError("not a model list")
        return cls(tuple(data))

    @property
    def bases(self) -> list[dict[str, Any]]:
        return [c for c in self.cards if c.get("parent") is None]

    def preset_of(self, model: str) -> tuple[str, str] | None:
        """``(base, preset)`` when ``model`` names a preset of a served base model."""
        if SEPARATOR not in model or any(c["id"] == model for c in self.cards):
            return None
        base, _, preset = model.rpartition(SEPARATOR)
        if not preset or all(c["id"] != base for c in self.bases):
            return None
        return base, preset


def with_presets(listing: dict[str, Any], presets: Iterable[Preset]) -> dict[str, Any]:
    """``listing`` plus one card per (base model, preset): the base's card, renamed, parented."""
    served = ServedModels.of(listing)
    extra = [{**base, "id": f"{base['id']}{SEPARATOR}{p.name}", "parent": base["id"],
              "created": p.created if p.created is not None else base.get("created")}
             for base in served.bases for p in presets]
    return {**listing, "data": [*listing["data"], *extra]}
