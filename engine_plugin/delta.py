"""The change to the slot bindings that one engine step carries to every rank.

The engine core takes every decision (:mod:`.core_sync`): it reads the mailbox, and the changes
it accepted since the last step ride the next ``SchedulerOutput`` (:class:`.step_decision.StepDecision`)
to the workers through vLLM's own transport, rows included: in process, through the
multiprocessing executor's broadcast queue, or Ray, on one node or many, with no shared file
system. The engine core binds the slots at the start of the step, before it admits that step's
requests; every rank writes the rows into its bank at the same step (invariant 9).

Per slot only the last change counts (a step sees the table as it is when it starts), so a delta
is: slots to unbind, then slots to bind in the order they were bound (newest-wins per
``(id, layer)``), each bind with its row, the row's largest magnitude and its norm once rounded
to the model's dtype (what the bank holds: the projecting modes divide by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .registry import Registry
from .staging import to_device


@dataclass(frozen=True)
class Bind:
    slot: int
    vector_id: str
    layer: int
    gen: int
    absmax: float
    norm: float


@dataclass(frozen=True)
class SyncDelta:
    unbinds: tuple[int, ...]
    binds: tuple[Bind, ...]
    rows: np.ndarray  # [len(binds), H] float32: row i for binds[i]

    def apply(self, registry: Registry | None, bank: torch.Tensor | None) -> None:
        """Bindings into ``registry`` (None on a rank, which admits nothing itself) and rows into
        ``bank`` (None on the engine core, which holds no bank)."""
        if registry is not None:
            for slot in self.unbinds:
                registry.unbind(slot)
        if self.binds and bank is not None:
            write_rows(bank, [b.slot for b in self.binds], self.rows)
        if registry is not None:
            for b in self.binds:
                registry.bind(b.slot, b.vector_id, b.layer, b.gen, b.absmax, b.norm)


@torch.inference_mode()
def write_rows(bank: torch.Tensor, slots: list[int], rows: np.ndarray) -> None:
    """Copy float32 ``rows [n, H]`` into bank rows ``slots + 1`` (model dtype)."""
    idx = to_device(np.array(slots, dtype=np.int64) + 1, bank.device)
    bank.index_copy_(0, idx, to_device(rows, bank.device).to(bank.dtype))


@dataclass
class PendingDelta:
    """Changes accepted since the last step, coalesced per slot (the engine core's side)."""

    hidden: int
    dtype: torch.dtype  # the bank's
    _binds: dict[int, tuple[Bind, np.ndarray]] = field(default_factory=dict)
    _unbinds: set[int] = field(default_factory=set)

    def bind(self, slot: int, vector_id: str, layer: int, gen: int, row: np.ndarray) -> None:
        self._binds.pop(slot, None)  # re-inserted last: binds apply in the order they were made
        self._unbinds.discard(slot)
        norm = float(torch.tensor(row).to(self.dtype).double().norm())
        self._binds[slot] = (Bind(slot, vector_id, layer, gen, float(np.abs(row).max(initial=0.0)), norm), row)

    def unbind(self, slot: int) -> None:
        self._binds.pop(slot, None)
        self._unbinds.add(slot)

    def __bool__(self) -> bool:
        """Changes wait for the next step."""
        return bool(self._binds or self._unbinds)

    def take(self) -> SyncDelta | None:
        """The delta for the step being scheduled (None when nothing changed); starts anew."""
        if not (self._binds or self._unbinds):
            return None
        rows = [row for _, row in self._binds.values()]
        delta = SyncDelta(tuple(sorted(self._unbinds)), tuple(b for b, _ in self._binds.values()),
                          np.stack(rows) if rows else np.zeros((0, self.hidden), np.float32))
        self._binds, self._unbinds = {}, set()
        return delta
