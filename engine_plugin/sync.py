"""Engine side of the mailbox: apply the control API's slot table and report back.

The runner thread applies pending changes at every step boundary, before new requests are
resolved, so a request sent after a registration returned sees the vector. A daemon thread
keeps the heartbeat and applies changes while the engine is idle. Both take one lock, which
the runner holds through CUDA-graph capture (:meth:`MailboxSync.pause`): no copy into the
bank is ever enqueued, or captured, while graphs are being recorded. Bank rows are written on the current
stream; a slot the control API rewrites is by protocol unreferenced (invariant 6), and the
binding that makes it reachable is made only after its row copy is enqueued.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np
import torch

from hotwire.shared.mailbox import ACTIVE, EngineMailbox, MailboxError

from .counters import Counters
from .registry import Registry
from .staging import to_device

log = logging.getLogger("vllm.hotwire")

HEARTBEAT_S = 0.25


def write_rows(bank: torch.Tensor, slots: list[int], rows: np.ndarray) -> None:
    """Copy float32 ``rows [n, H]`` into bank rows ``slots + 1`` (model dtype)."""
    idx = to_device(np.array(slots, dtype=np.int64) + 1, bank.device)
    bank.index_copy_(0, idx, to_device(rows, bank.device).to(bank.dtype))


class MailboxSync:
    def __init__(self, box: EngineMailbox, bank: torch.Tensor, registry: Registry, counters: Counters):
        self.box, self.bank, self.registry, self.counters = box, bank, registry, counters
        self.lock = threading.RLock()
        self.paused = False  # True while the runner captures CUDA graphs (lock held)
        self._stop = threading.Event()
        self._done = -1  # target generation fully applied; skip the scan while it is unchanged
        self._thread = threading.Thread(target=self._beat, name="hotwire-mailbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @contextlib.contextmanager
    def pause(self):
        with self.lock:
            self.paused = True
            try:
                yield
            finally:
                self.paused = False

    @torch.inference_mode()
    def apply(self) -> None:
        """Apply every consistent pending change; publish refs, then the applied generation."""
        with self.lock:
            if int(self.box.header["target_gen"]) == self._done:
                return
            self.publish_refs()  # refs must be current before any retirement is acked
            target, entries, torn = self.box.pending()
            active = [e for e in entries if e.state == ACTIVE]
            if active:
                write_rows(self.bank, [e.slot for e in active], np.stack([e.row for e in active]))
                self.counters.add("mailbox_rows_applied", len(active))
            for e in entries:
                if e.state == ACTIVE:
                    self.registry.bind(e.slot, e.vector_id, e.layer, e.gen)
                else:
                    self.registry.unbind(e.slot)
                self.box.ack(e)
            if torn:
                self.counters.add("mailbox_torn_reads", torn)
            self.box.publish(None if torn else target, *self.registry.refs_to_publish())
            if not torn:
                self._done = target

    def publish_refs(self) -> None:
        self.box.publish(None, *self.registry.refs_to_publish())

    def publish_changed_refs(self) -> None:
        """Publish references only when a steered request came or went: most steps skip it."""
        if self.registry.refs_changed:
            self.publish_refs()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                with self.lock:
                    self.apply()
                    self.counters.publish_step_time()
                    self.box.beat()
            except (MailboxError, ValueError, RuntimeError) as e:
                log.error("hotwire: mailbox thread stopped: %s", e)
                return
