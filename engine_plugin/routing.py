"""Per-request routing rows and the per-step token -> request map.

Per request, on arrival only: parse the spec, resolve each entry to a bank slot and write one
request row ``[A, K, 4]`` of the route table. Per step: one vectorised ``np.repeat`` of request
rows over the step's token counts; when it or the rows changed, one copy to ``tok_row`` and one
gather of the rows into the per-token table the op reads (decode steps of a steady batch reuse
it: positions, not the map, move the token windows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import torch

from hotwire.shared.spec import MAX_ENTRIES, SpecError, SteerEntry, parse_spec, spec_from_extra_args

from .counters import Counters
from .registry import Registry
from .staging import copy_into, to_device
from .steering import ArmedModel


def entry_limit(dtype: torch.dtype) -> float:
    """The largest ``|scale| * max|v|`` one entry may add (invariant 8).

    A request has at most ``MAX_ENTRIES`` entries, so everything it adds to a token's stream,
    over all layers, stays within half the model dtype's range: the stream cannot overflow on
    the steering alone, and a steered token never becomes non-finite (which would reach the KV
    cache, and through reused blocks other requests).
    """
    return float(torch.finfo(dtype).max) / (2 * MAX_ENTRIES)


@dataclass
class _Steered:
    row: int
    slots: tuple[int, ...]  # distinct mailbox slots this request holds a reference on


class Router:
    def __init__(self, armed: ArmedModel, registry: Registry, requests: int, counters: Counters):
        self.armed, self.registry, self.counters = armed, registry, counters
        self.tables = armed.tables
        self.entries = self.tables.route.shape[2]
        self.limit = entry_limit(self.tables.bank.dtype)
        self._ids: list[str] = []  # the last step's batch, to skip unchanged decode steps
        self._counts = np.zeros(0, dtype=np.int32)
        self._dirty = False  # a request arrived or left since the last route()
        self._rows_written = False  # commit() changed request rows since the last per-token copy
        self.active: dict[str, _Steered] = {}
        self._row_of: dict[str, int] = {}  # active[r].row, looked up per step without Python calls
        self._free = list(range(requests, 0, -1))  # request row 0 is the null row
        self._staged: list[tuple[int, np.ndarray]] = []
        self._tok = np.zeros(0, dtype=np.int32)  # tok_row content on the device, up to its length

    # -- arrival / finish -------------------------------------------------------------------
    def admit(self, req_id: str, extra_args: dict[str, Any] | None, prompt_len: int) -> None:
        """Bind a new (or re-sent) request to a routing row, or count why it runs unsteered."""
        self.finish((req_id,))
        raw = spec_from_extra_args(extra_args)
        if raw is None:
            return
        try:
            entries = parse_spec(raw)
            if not entries:
                return
            route, slots = self._resolve(entries, prompt_len)
            if not self._free:
                raise SpecError("table_full", f"all {len(self.active)} request rows are in use")
        except SpecError as e:
            self.counters.unsteered(req_id, e.reason, e.detail)
            return
        row = self._free.pop()
        self.active[req_id] = _Steered(row, slots)
        self._row_of[req_id] = row
        self._dirty = True
        self.registry.hold(slots)
        self._staged.append((row, route))
        self.counters.add("steered_requests")

    def finish(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            st = self.active.pop(req_id, None)
            if st is not None:
                del self._row_of[req_id]
                self.registry.release(st.slots)
                self._free.append(st.row)
                self._dirty = True

    def _resolve(self, entries: tuple[SteerEntry, ...], prompt_len: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """The request's row ``[A, K, (row, lo, hi, scale bits)]`` and the distinct slots it uses."""
        route = np.zeros((len(self.armed.layers), self.entries, 4), dtype=np.int32)
        used: dict[int, int] = {}  # entries so far per layer position
        slots = set()
        for e in entries:
            i = self.armed.position(e.layer)
            if i is None:
                raise SpecError("unarmed_layer", f"layer {e.layer} is not armed "
                                f"(armed: {list(self.armed.layers)})")
            slot = self.registry.resolve(e.id, e.layer)
            if slot is None:
                raise SpecError("unknown_id", f"no vector {e.id!r} for layer {e.layer}")
            size = abs(e.scale) * float(self.registry.absmax[slot])
            if size > self.limit:
                raise SpecError("out_of_range", f"entry {e.id!r} on layer {e.layer} adds up to "
                                f"{size:.3g} (|scale| * max|v|), over this model's limit of "
                                f"{self.limit:.3g} per entry")
            k = used.get(i, 0)
            if k == self.entries:
                raise SpecError("too_many_entries", f"more than {self.entries} entries on layer {e.layer}")
            used[i] = k + 1
            route[i, k] = (slot + 1, *e.span(prompt_len), e.scale_bits())
            slots.add(slot)
        return route, tuple(slots)

    @torch.inference_mode()
    def commit(self) -> None:
        """Write the rows of requests admitted since the last commit, in one ``index_copy_``
        (:meth:`route` does, before it gathers)."""
        if not self._staged:
            return
        rows, route = zip(*self._staged)
        self._staged.clear()
        dev = self.tables.route.device
        self.tables.route.index_copy_(0, to_device(np.array(rows, dtype=np.int64), dev),
                                      to_device(np.stack(route), dev))
        self._rows_written = True

    # -- per step -----------------------------------------------------------------------------
    def route(self, req_ids: Sequence[str], num_tokens: np.ndarray) -> None:
        """Point each token of this step at its request's row (0 for unsteered requests).

        Must run after vLLM has settled the batch for the step (order, adds, removals).
        A decode step of an unchanged batch costs two comparisons and nothing else.
        """
        if not self._dirty and req_ids == self._ids and np.array_equal(num_tokens, self._counts):
            return
        if self._staged:
            self.commit()
        self._ids, self._counts, self._dirty = list(req_ids), np.array(num_tokens), False
        if self.active:
            rows = np.fromiter(map(self._row_of.get, req_ids, repeat(0)), np.int32, len(req_ids))
            tok = np.repeat(rows, num_tokens) if rows.any() else self._tok[:0]
        else:
            tok = self._tok[:0]
        if not self._rows_written and tok.shape == self._tok.shape and np.array_equal(tok, self._tok):
            return
        n = max(len(tok), len(self._tok))  # the last step's tokens past this one's get the null row
        if n:
            self._upload(tok if n == len(tok) else np.concatenate((tok, np.zeros(n - len(tok), np.int32))))
        self._tok, self._rows_written = tok, False

    @torch.inference_mode()
    def _upload(self, tok: np.ndarray) -> None:
        copy_into(self.tables.tok_row[: len(tok)], tok)
        self.tables.load_tokens(len(tok))
