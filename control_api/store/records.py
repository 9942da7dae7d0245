"""What a catalog holds (vector and preset records) and how its writes refuse, for every backend."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import Conflict, StorageFull


@dataclass(frozen=True)
class VectorRecord:
    id: str
    generation: int
    dtype: str
    shape: tuple[int, ...]
    layers: tuple[int, ...] | None
    pinned: bool
    metadata: dict[str, Any]
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: tuple) -> VectorRecord:
        vid, gen, dtype, shape, layers, pinned, metadata, created, updated = row
        return cls(vid, gen, dtype, tuple(json.loads(shape)),
                   None if layers is None else tuple(json.loads(layers)),
                   bool(pinned), json.loads(metadata), created, updated)


@dataclass(frozen=True)
class PresetRecord:
    """One stored preset; ``entries`` as they were posted (JSON objects), in their order;
    ``metadata`` what made it (a JSON object: e.g. the measurements of a calibration sweep)."""

    name: str
    entries: tuple[dict[str, Any], ...]
    description: str | None
    created_at: float
    metadata: dict[str, Any]

    @classmethod
    def from_row(cls, row: tuple) -> PresetRecord:
        name, entries, description, created_at, metadata = row
        return cls(name, tuple(json.loads(entries)), description, created_at,
                   json.loads(metadata))


class VectorExists(Conflict):
    """``put(replace=False)`` of an id the catalog holds (possibly written by another replica
    a moment ago)."""

    def __init__(self, vector_id: str, generation: int):
        super().__init__("exists", f"vector {vector_id!r} exists (generation {generation}); send "
                         "replace=true to replace it")
        self.vector_id, self.generation = vector_id, generation


class PresetExists(Conflict):
    """``put_preset(replace=False)`` of a name the catalog holds (possibly written by another
    replica a moment ago)."""

    def __init__(self, name: str):
        super().__init__("preset_exists", f"preset {name!r} exists; send replace=true to replace it")
        self.name = name


class CatalogFull(StorageFull):
    """A write the catalog's storage refused (``cause``: what the database said), rolled back."""

    def __init__(self, where: str, cause: str):
        super().__init__("storage_full", f"the catalog could not be written ({cause}): {where} "
                         "is full, over a quota or a file size limit, or failing; nothing was "
                         "changed. Free space there (or raise the limit) and retry")


class StaleGeneration(ValueError):
    """``put(generation=G)`` where the catalog holds a newer generation of the id than ``G``."""
