"""What the engine counts: why requests ran unsteered (logged once per request), and the host
time its per-step work takes, by hook and apart for steps in which requests arrived or left;
mirrored into the mailbox for the control API's metrics.

One set per process (:func:`process_counters`): where a rank shares the engine core's process
(one GPU), its host time lands beside the core's and reaches the same mailbox."""

from __future__ import annotations

import logging
from collections import Counter

from hotwire.shared.engine_counters import STEP_TIME
from hotwire.shared.mailbox import COUNTER_INDEX, EngineMailbox

log = logging.getLogger("vllm.hotwire")


class Counters:
    """``counts`` by name; and one int attribute per step-time counter (:data:`STEP_TIME`:
    ``steps``, ``host_ns``, ``host_ns_core``, ...; what each counts is declared in
    :mod:`hotwire.shared.engine_counters`), which the step thread only adds to."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.mailbox: EngineMailbox | None = None
        for name in STEP_TIME:
            setattr(self, name, 0)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n
        if self.mailbox is not None and name in COUNTER_INDEX:
            self.mailbox.add_counter(name, n)

    def unsteered(self, req_id: str, reason: str, detail: str) -> None:
        self.add(f"unsteered_{reason}")
        log.warning("hotwire: request %s runs unsteered (%s): %s", req_id, reason, detail)

    def publish_step_time(self) -> None:
        """Copy the step and host-time counts to the mailbox: from the heartbeat, off the step
        thread, which only adds to ints."""
        if self.mailbox is not None:
            for name in STEP_TIME:
                self.mailbox.set_counter(name, getattr(self, name))


_PROCESS: Counters | None = None


def process_counters() -> Counters:
    """This process's counters, shared by the engine core's sync and a rank in the same process."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = Counters()
    return _PROCESS
