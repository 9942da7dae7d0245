"""What the engine counts: why requests ran unsteered (each counted; logged at most once per
reason every :data:`REFUSAL_LOG_PERIOD_S`), and the host time its per-step work takes, by hook
and apart for steps in which requests arrived or left (or the batch's requests changed);
mirrored into the mailbox for the control API's metrics.

One set per process (:func:`process_counters`): where a rank shares the engine core's process
(one GPU), its host time lands beside the core's and reaches the same mailbox."""

from __future__ import annotations

import logging
import time
from collections import Counter

from hotwire.shared.engine_counters import STEP_TIME
from hotwire.shared.mailbox import COUNTER_INDEX, EngineMailbox

log = logging.getLogger("vllm.hotwire")

# One refusal line per reason per period: a client sending refused specs at a high rate must not
# flood the log or slow the engine core's step thread, where admission runs (measured on the H200
# at 256 in flight, one refusal per step: the core hook took 256 µs a step against 91 steering).
REFUSAL_LOG_PERIOD_S = 10.0


class Counters:
    """``counts`` by name; and one int attribute per step-time counter (:data:`STEP_TIME`:
    ``steps``, ``host_ns``, ``host_ns_core``, ...; what each counts is declared in
    :mod:`hotwire.shared.engine_counters`), which the step thread only adds to."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.mailbox: EngineMailbox | None = None
        self._refusals_logged: dict[str, tuple[float, int]] = {}  # reason -> (last line, refusals since)
        for name in STEP_TIME:
            setattr(self, name, 0)
        self.core_step_ns = 0  # the engine core's hook time at the current step (not published)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n
        if self.mailbox is not None and name in COUNTER_INDEX:
            self.mailbox.add_counter(name, n)

    def unsteered(self, req_id: str, reason: str, detail: str) -> None:
        """Count a refused request; log it unless a line for the same reason went out within the
        period, and then say how many went unlogged since."""
        self.add(f"unsteered_{reason}")
        now = time.monotonic()
        last, quiet = self._refusals_logged.get(reason, (-REFUSAL_LOG_PERIOD_S, 0))
        if now - last < REFUSAL_LOG_PERIOD_S:
            self._refusals_logged[reason] = (last, quiet + 1)
            return
        self._refusals_logged[reason] = (now, 0)
        since = f" ({quiet} more since the last such line, counted in unsteered_{reason})" if quiet else ""
        log.warning("hotwire: request %s runs unsteered (%s): %s%s", req_id, reason, detail, since)

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
