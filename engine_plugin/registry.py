"""Which vector (id, layer) lives in which bank slot, and who is using each slot.

Slot ``s`` (0-based, as in the mailbox) is bank row ``s + 1``; row 0 is the null vector.
Binding is newest-wins per ``(id, layer)`` so a replace can load new slots first and retire
the old ones after; a ``(hidden,)`` vector binds under ``ANY_LAYER`` and serves every layer.
Each slot also keeps its row's largest magnitude and its norm (as the bank holds it), so
admission can refuse an entry whose ``|scale| * max|v|`` would overflow the stream (invariant 8)
and compute the projecting modes' coefficients without reading the bank.
"""

from __future__ import annotations

import time

import numpy as np

from hotwire.shared.mailbox import ANY_LAYER


# holds and releases recorded before the step thread counts them itself: where no mailbox thread
# reads the references, nothing else would
MOVES_KEPT = 1024


class Registry:
    def __init__(self, n_slots: int):
        self._where: dict[tuple[str, int], int] = {}
        self._key: dict[int, tuple[str, int]] = {}
        self.versions: dict[str, int] = {}  # vector id -> registration generation
        self._inflight = np.zeros(n_slots, dtype=np.uint32)  # steered requests holding each slot
        self._last_used_ns = np.zeros(n_slots, dtype=np.uint64)
        self._moves: list[tuple[tuple[int, ...], bool, int]] = []  # (slots, held, time ns), not yet counted
        self.absmax = np.zeros(n_slots, dtype=np.float64)  # max |row| of each bound slot
        self.norm = np.zeros(n_slots, dtype=np.float64)  # ‖row‖ of each bound slot, in the bank's dtype
        self.refs_changed = False  # hold/release since the references were last published
        self.binding_changes = 0  # binds and unbinds so far: a resolution made at another count is stale

    def bind(self, slot: int, vector_id: str, layer: int, gen: int, absmax: float, norm: float) -> None:
        """Make ``slot`` the newest home of ``(vector_id, layer)``; a reused slot starts unused."""
        self.unbind(slot)
        self.binding_changes += 1
        self._where[(vector_id, layer)] = slot
        self._key[slot] = (vector_id, layer)
        self.versions[vector_id] = max(gen, self.versions.get(vector_id, 0))
        self.absmax[slot], self.norm[slot] = absmax, norm
        self._last_used_ns[slot] = 0
        self.refs_changed = True

    def unbind(self, slot: int) -> None:
        self._count()
        key = self._key.pop(slot, None)
        if key is None:
            return
        self.binding_changes += 1
        if self._where.get(key) == slot:
            del self._where[key]
            if not any(k[0] == key[0] for k in self._where):
                self.versions.pop(key[0], None)

    def resolve(self, vector_id: str, layer: int) -> int | None:
        slot = self._where.get((vector_id, layer))
        return self._where.get((vector_id, ANY_LAYER)) if slot is None else slot

    def hold(self, slots: tuple[int, ...]) -> None:
        """One more in-flight request on each of ``slots`` (distinct, at most a few), from now."""
        self._moves.append((slots, True, time.time_ns()))
        self.refs_changed = True
        if len(self._moves) >= MOVES_KEPT:
            self._count()

    def release(self, slots: tuple[int, ...]) -> None:
        """One in-flight request fewer on each of ``slots``, each of which it held."""
        self._moves.append((slots, False, time.time_ns()))
        self.refs_changed = True

    def _count(self) -> None:
        """The references with every hold and release so far counted in.

        Why recorded first and counted later: admissions and finishes hold and release slots on
        the engine core's step thread, on nearly every step at high concurrency, while the counts
        are read only where the references are published (the mailbox thread, under the core's
        lock, as the holds are made) or a slot is bound anew. A step thread that counts each one
        meets numpy's scalar path with cold caches: counted here, the core's hook on a changed step
        took 42-44 µs instead of 46-49 (``benchmarks/served_step.py --runner v2``, caches evicted,
        a 2-core CPU box, five runs each)."""
        moves, self._moves = self._moves, []
        for slots, held, now in moves:
            for s in slots:
                if held:
                    self._inflight[s] += 1
                else:
                    self._inflight[s] -= 1
                self._last_used_ns[s] = now

    @property
    def inflight(self) -> np.ndarray:
        """Steered requests holding each slot ``[n_slots]`` uint32."""
        self._count()
        return self._inflight

    @property
    def last_used_ns(self) -> np.ndarray:
        """When a request last took or let go of each slot ``[n_slots]`` uint64 (0: never, or
        unused since it was bound)."""
        self._count()
        return self._last_used_ns

    def refs_to_publish(self) -> tuple[np.ndarray, np.ndarray]:
        """``(inflight, last_used_ns)`` for the mailbox, every hold and release counted; from here
        on ``refs_changed`` is False."""
        self._count()
        self.refs_changed = False
        return self._inflight, self._last_used_ns

    def bound(self) -> dict[tuple[str, int], int]:
        return dict(self._where)
