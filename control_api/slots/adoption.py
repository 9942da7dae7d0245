"""What the catalog makes of each live slot, and how an engine's unknown vectors are adopted.

Why: a control API started with an empty or wrong catalog must not wipe what a running engine
holds (invariant 7). Each ACTIVE, non-startup slot gets a :data:`Verdict` from its generation,
the catalog's record of its id and the id's generation high-water mark (deletes included):

- ``keep``: the catalog's record, same generation.
- ``stale``: older than the record; a newer write replaces it.
- ``deleted``: the catalog holds no record but has given the id this generation or a later
  one, so this catalog deleted it; retiring it is what the delete asked for.
- ``unknown``: an id, or a generation of a deleted id, this catalog never gave out.
- ``newer``: newer than the record: the engine holds a later write than the catalog.

``unknown`` and ``newer`` vectors are adopted by default: :func:`plan_adoptions` rebuilds each
from its rows, keeping the engine's generation so the engine's prefix-cache salts stay valid.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hotwire.shared.mailbox import ACTIVE, ANY_LAYER, ControlMailbox

from ..store.catalog import CatalogStore
from ..store.records import VectorRecord
from .snapshot import SlotUse, TableSnapshot

Verdict = Literal["keep", "stale", "deleted", "unknown", "newer"]
UnknownVectors = Literal["adopt", "retire"]


def verdict(use: SlotUse, record: VectorRecord | None, high_water: int | None) -> Verdict:
    if record is None:
        deleted = high_water is not None and use.generation <= high_water
        return "deleted" if deleted else "unknown"
    if use.generation == record.generation:
        return "keep"
    return "stale" if use.generation < record.generation else "newer"


@dataclass(frozen=True)
class Adoption:
    """One vector rebuilt from an engine's rows, ready to go into the catalog."""

    vector_id: str
    generation: int
    slots: tuple[int, ...]
    vector: np.ndarray  # (hidden,) for one ANY_LAYER row, else (n_layers, hidden)
    layers: tuple[int, ...] | None  # the layers present; None for an ANY_LAYER vector
    pinned: bool
    replaces: int | None  # generation of the catalog record it supersedes


def plan_adoptions(box: ControlMailbox, table: TableSnapshot,
                   catalog: CatalogStore) -> tuple[list[Adoption], dict[str, str]]:
    """Adoptions for the ``unknown`` and ``newer`` vectors of ``table``, newest generation of an
    id only, and why the others of those could not be rebuilt (``{id: problem}``).

    Rows are read again under the mailbox's seqlock; a slot that changed since ``table`` was
    taken leaves its vector for the next pass.
    """
    groups: dict[str, dict[int, list[SlotUse]]] = defaultdict(lambda: defaultdict(list))
    for use in table.uses:
        if use.state != ACTIVE or use.startup:
            continue
        record = catalog.get(use.vector_id)
        if verdict(use, record, catalog.high_water(use.vector_id)) in ("unknown", "newer"):
            groups[use.vector_id][use.generation].append(use)
    adoptions, problems = [], {}
    for vector_id, by_generation in groups.items():
        generation = max(by_generation)
        record = catalog.get(vector_id)
        built = _rebuild(box, by_generation[generation])
        if isinstance(built, str):
            problems[vector_id] = built
            continue
        vector, layers, slots = built
        pinned = all(u.pinned for u in by_generation[generation])
        adoptions.append(Adoption(vector_id, generation, slots, vector, layers, pinned,
                                  None if record is None else record.generation))
    return adoptions, problems


def _rebuild(box: ControlMailbox, uses: list[SlotUse]
             ) -> tuple[np.ndarray, tuple[int, ...] | None, tuple[int, ...]] | str:
    """``(vector, layers, slots)`` from one (id, generation)'s slots, or why it cannot be."""
    rows: dict[int, tuple[int, np.ndarray]] = {}
    for use in sorted(uses, key=lambda u: u.slot):
        if use.layer in rows:
            continue  # a duplicate row: the first is adopted, the reconciler retires the rest
        entry = box.read_entry(use.slot, with_row=True)
        if (entry is None or entry.state != ACTIVE or entry.gen != use.generation
                or entry.vector_id != use.vector_id or entry.layer != use.layer
                or entry.row is None):
            return f"slot {use.slot} changed while being read"
        rows[use.layer] = (use.slot, np.asarray(entry.row, dtype=np.float32))
    fp = box.fingerprint
    if set(rows) == {ANY_LAYER}:
        slot, row = rows[ANY_LAYER]
        return row.copy(), None, (slot,)
    if ANY_LAYER in rows:
        return "it has both a row for every layer and rows for single layers"
    outside = sorted(set(rows) - set(range(fp.n_layers)))
    if outside:
        return f"rows for layers {outside}, outside the model's 0..{fp.n_layers - 1}"
    vector = np.zeros((fp.n_layers, fp.hidden), dtype=np.float32)
    for layer, (_, row) in rows.items():
        vector[layer] = row
    layers = tuple(sorted(rows))
    return vector, layers, tuple(rows[layer][0] for layer in layers)
