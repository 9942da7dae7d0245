"""Engine side of the mailbox: apply the control API's slot table and report back.

The runner thread applies pending changes at every step boundary, before new requests are
resolved, so a request sent after a registration returned sees the vector. A daemon thread
keeps the heartbeat and applies changes while the engine is idle. Both take one lock, which
the runner holds through CUDA-graph capture (:meth:`MailboxSync.pause`): no copy into the
bank is ever enqueued, or captured, while graphs are being recorded. Bank rows are written on the current
stream; a slot the control API rewrites is by protocol unreferenced (invariant 6), and the
binding that makes it reachable is made only after its row copy is enqueued.

Nothing read from the file is trusted (invariant 8): an entry the mailbox finds corrupt is
rejected (logged, counted, acknowledged as holding nothing, its slot unbound), and a file that
becomes unreadable (truncated, say) stops the sync with one error line and a counter, while the
engine keeps serving with the vectors it holds; restart the engine to restore registration.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np
import torch

from hotwire.shared.mailbox import ACTIVE, EngineMailbox, MailboxError, SlotEntry

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
        self.broken: str | None = None  # why the file can no longer be used; the sync has stopped
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

    def apply(self) -> None:
        """Apply every consistent pending change; publish refs, then the applied generation."""
        with self.lock, self._guard() as usable:
            if usable and self.box.target_gen() != self._done:
                self._apply_pending()

    def _apply_pending(self) -> None:
        self._publish_refs()  # refs must be current before any retirement is acked
        target, entries, torn = self.box.pending()
        self._apply(entries)
        if torn:
            self.counters.add("mailbox_torn_reads", torn)
        self.box.publish(None if torn else target, *self.registry.refs_to_publish())
        if not torn:
            self._done = target

    @torch.inference_mode()
    def _apply(self, entries: list[SlotEntry]) -> None:
        active = [e for e in entries if e.state == ACTIVE and e.problem is None]
        if active:
            write_rows(self.bank, [e.slot for e in active], np.stack([e.row for e in active]))
            self.counters.add("mailbox_rows_applied", len(active))
        for e in entries:
            if e.problem is not None:
                self.registry.unbind(e.slot)
                self.counters.add("mailbox_rejected")
                log.error("hotwire: mailbox %s: slot %d rejected: %s", self.box.path, e.slot, e.problem)
            elif e.state == ACTIVE:
                self.registry.bind(e.slot, e.vector_id, e.layer, e.gen, float(np.abs(e.row).max(initial=0.0)))
            else:
                self.registry.unbind(e.slot)
            self.box.ack(e)

    def _publish_refs(self) -> None:
        self.box.publish(None, *self.registry.refs_to_publish())

    def publish_changed_refs(self) -> None:
        """Publish references only when a steered request came or went: most steps skip it."""
        if self.registry.refs_changed:
            with self._guard() as usable:
                if usable:
                    self._publish_refs()

    @contextlib.contextmanager
    def _guard(self):
        """Run a mailbox access, unless the file is already known unusable; on an error, stop
        the sync for good and keep the engine serving."""
        if self.broken is not None:
            yield False
            return
        try:
            yield True
        except (MailboxError, OSError, ValueError) as e:
            self.broken = str(e)
            self.counters.add("mailbox_errors")
            log.error("hotwire: mailbox %s is unusable (%s); runtime registration stopped, the engine "
                      "keeps serving with the vectors it holds; restart it to restore registration",
                      self.box.path, e)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S) and self.broken is None:
            with self.lock:
                self.apply()
                self.counters.publish_step_time()
                with self._guard() as usable:
                    if usable:
                        self.box.beat()
