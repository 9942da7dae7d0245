"""hotwire's request row for each of the V2 runner's request states.

vLLM's V2 model runner keeps every request in flight in a fixed state row (``RequestState``: taken
in ``add_requests`` for each of the step's new requests, resumed ones included, freed when the
request finishes or is preempted), and builds each step's map from batch entries to state rows
itself (``InputBatch.idx_mapping``, on the host and on the device). Keyed by the same rows,
hotwire's routing needs no per-step lookup of the batch's requests: the token map is
``rows[idx_mapping]`` expanded over the step's tokens (on the device where the upload kernel can:
:mod:`.upload_triton`), and this table changes only as requests arrive.

Contract: every state row the runner's batch names was taken by a request of some step's
``scheduled_new_reqs`` (the only way the V2 runner takes one), and :meth:`place` has been told of
it (:meth:`arrived`) before the batch is routed: its entry holds that request's row (0 when it is
not steered, so an unsteered request in a state row a steered one left reads the null row:
invariant 1). Entries of freed state rows are stale and never read; an entry is written again
when its state row is taken by the next request.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np


class StateRows:
    def __init__(self, states: int):
        # hotwire's request row of each state row: written and compared per arrival through the
        # array (numpy's scalar path costs ~2 µs more on a cold step thread), read per step as
        # ``rows`` [states] int32, a numpy view of the same memory (the batch's gather, the upload)
        self._rows = array("i", bytes(4 * states))
        self.rows = np.frombuffer(self._rows, dtype=np.int32)
        self._arrived: list[str] = []  # requests the runner takes a state row for, not yet placed

    def arrived(self, req_ids: Iterable[str]) -> None:
        """The step's new requests (the runner takes their state rows in this step's ``execute_model``)."""
        self._arrived.extend(req_ids)

    def place(self, state_of: Mapping[str, int], row_of: Mapping[str, int]) -> bool:
        """Write the row of each request that arrived into its state row (``state_of``: the runner's
        ``req_id_to_index``; ``row_of``: the steered requests' rows); True where an entry changed.
        A request that left before its state row was read (finished in the same step) is skipped."""
        changed = False
        for req_id in self._arrived:
            state = state_of.get(req_id)
            if state is not None:
                row = row_of.get(req_id, 0)
                if self._rows[state] != row:
                    self._rows[state] = row
                    changed = True
        self._arrived.clear()
        return changed


class StateBatch(NamedTuple):
    """A V2 runner's settled batch as the routing reads it (from its ``InputBatch``)."""

    states: np.ndarray  # [n] int32 the state row of each batch entry (idx_mapping_np)
    num_tokens: np.ndarray  # [n] int32 the tokens of each entry (num_scheduled_tokens)
    tokens: int  # their sum (num_tokens)
    states_at: int  # device address of the same states, [n] int32 (idx_mapping)
    starts_at: int  # device address of where each entry's tokens start, [n+1] int32 (query_start_loc)
