"""How many tokens each gate of a finished request opened: read back without stalling a step.

The op counts per request row on the device (:class:`.steer_op.GateScratch` ``counts``). When a
gated request finishes, its row's counts are copied to pinned host memory behind the work already
queued, and the row is zeroed for its next request; a later step logs the counts once the copy
has landed (an event query, never a wait) and adds them to ``gate_opened_tokens``.
"""

from __future__ import annotations

import logging

import torch

from .counters import Counters

log = logging.getLogger("vllm.hotwire")


class GateReport:
    def __init__(self, counts: torch.Tensor, counters: Counters):
        self.counts, self.counters = counts, counters  # counts: [R+1, G] int32
        self._cuda = counts.is_cuda
        self._pending: list[tuple[str, torch.Tensor, torch.cuda.Event | None]] = []

    @torch.inference_mode()
    def finish(self, req_id: str, row: int, gates: int) -> None:
        """Queue the read of ``row``'s first ``gates`` counts, then clear the row."""
        host = torch.empty(gates, dtype=self.counts.dtype, pin_memory=self._cuda)
        host.copy_(self.counts[row, :gates], non_blocking=self._cuda)
        event = None
        if self._cuda:
            event = torch.cuda.Event()
            event.record()
        self.counts[row].zero_()
        self._pending.append((req_id, host, event))

    def poll(self) -> None:
        """Report every read that has landed."""
        if not self._pending:
            return
        waiting = []
        for req_id, host, event in self._pending:
            if event is not None and not event.query():
                waiting.append((req_id, host, event))
                continue
            opened = host.tolist()
            self.counters.add("gate_opened_tokens", sum(opened))
            log.info("hotwire: request %s: its gates opened for %s tokens", req_id,
                     ", ".join(f"gate {g + 1}: {n}" for g, n in enumerate(opened)))
        self._pending = waiting
