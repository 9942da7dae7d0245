"""The simultaneous design of ``serve_throughput.py``: every server under its own closed loop at the
same time, measured in windows that share their edges.

Why: the sequential design measures one server at a time, so whatever else runs on the host at
that moment (the shared machine's other work, the host's own CPU state) lands on that server's
window alone; on the H200 one server's windows scattered by 8-14 % and consecutive windows'
residuals were correlated, whichever server ran. Two windows over the same seconds share that
noise, and their ratio cancels it.

Each edge reads every server's snapshot, one after the other; the read order alternates from edge
to edge (:func:`read_order`), so that a server read early at a window's start is read late at its
end and every server's window is centred on the same moment.
"""

from __future__ import annotations

import math
import time

import httpx

from server_kinds import load_of
from serving import Load, Server, snapshot, window_row

IN_FLIGHT_PER_CLIENT = 128  # default requests in flight per load-generator process (Load: one tops out)
CLIENTS_PER_CORE = 2  # load-generator processes to a physical core: on the H200 a process with 64 in
                      # flight used ~0.47 CPU s per 5 s window, a tenth of a core


def default_processes(concurrency: int) -> int:
    """Load-generator processes per server at ``concurrency`` requests in flight: 1 up to 128, 2 at 256."""
    return max(1, math.ceil(concurrency / IN_FLIGHT_PER_CLIENT))


def read_order(items: list, edge: int) -> list:
    """The order edge number ``edge`` reads the servers in: as given at even edges, reversed at odd
    ones. The server read i-th at a window's first edge is read (n-1-i)-th at its second, so the
    read slots of every server's window add up to the same n-1: their midpoints coincide."""
    return list(items) if edge % 2 == 0 else list(items)[::-1]


class LoadSet:
    """One :class:`serving.Load` per server, started and stopped together."""

    def __init__(self, servers: list[Server], processes: int):
        self.servers = servers
        self.loads = {s.name: Load(processes) for s in servers}

    def start(self, concurrency: int, make: dict, deadline: float, processes: int) -> None:
        """Every server's closed loop of ``concurrency`` requests, the same request sequence (``make``;
        a server whose kind does not steer gets it without specs)."""
        for s in self.servers:
            self.loads[s.name].start(s.url, concurrency, load_of(s.name, make), deadline, processes)

    def wait(self, until: float) -> None:
        """Sleep until ``until`` (monotonic), failing at once when any load-generator process failed."""
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))
            for load in self.loads.values():
                load.check()

    def stop(self) -> dict[str, dict]:
        """Stop every load at once (all stop events first), then each one's counts (``Load.stop``)."""
        for load in self.loads.values():
            load.stop_event.set()
        return {name: load.stop() for name, load in self.loads.items()}

    def shutdown(self) -> None:
        for load in self.loads.values():
            load.shutdown()


def edge(servers: list[Server], loads: LoadSet, client: httpx.Client, k: int) -> dict[str, dict]:
    """Window edge number ``k``: every server's snapshot in :func:`read_order`, each with its own
    load's CPU seconds and its read slot."""
    out = {}
    for slot, s in enumerate(read_order(servers, k)):
        out[s.name] = {**snapshot(s, client), "client_cpu": loads.loads[s.name].cpu_seconds(), "slot": slot}
    return out


def windows(a: dict[str, dict], b: dict[str, dict]) -> dict[str, dict]:
    """Each server's window between edges ``a`` and ``b`` (``serving.window_row``), with its load's
    CPU seconds per process and the server's read slot at either edge."""
    rows = {}
    for name in a:
        row = window_row(a[name], b[name])
        row["client_cpu_s"] = [round(y - x, 2) for x, y in zip(a[name]["client_cpu"], b[name]["client_cpu"])]
        row["read_slots"] = [a[name]["slot"], b[name]["slot"]]
        rows[name] = row
    return rows
