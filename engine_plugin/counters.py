"""Why requests ran unsteered: counted, logged once per request, mirrored into the mailbox."""

from __future__ import annotations

import logging
from collections import Counter

from hotwire.shared.mailbox import COUNTER_INDEX, EngineMailbox

log = logging.getLogger("vllm.hotwire")


class Counters:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.mailbox: EngineMailbox | None = None

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n
        if self.mailbox is not None and name in COUNTER_INDEX:
            self.mailbox.add_counter(name, n)

    def unsteered(self, req_id: str, reason: str, detail: str) -> None:
        self.add(f"unsteered_{reason}")
        log.warning("hotwire: request %s runs unsteered (%s): %s", req_id, reason, detail)
