"""NVIDIA's Multi-Process Service for the servers of one served benchmark, sharing one GPU.

Why: without it the GPU time-slices between processes, so the kernels of servers run side by side
never overlap and each server's step waits on the others' kernels. At 256 in flight four servers
kept the H200 busy 99.5 % of the time (``gpu_busy.py``), every server's throughput then following
how the GPU shared its time, not only its own work. Under MPS the servers' kernels run at once, on
the GPU's multiprocessors together, as a server alone on its GPU runs them (a Qwen3 0.6B decode
step fills a fraction of an H200).

The control daemon gets pipe and log folders of the run's own (``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``), and so does each server: a client finds the daemon through that pipe
folder, and one started without it looks in the default folder, finds no daemon and runs
time-sliced, without a word. The servers are made before the daemon starts, with their environment
fixed then, so :class:`Mps` adds the two folders to each one's environment itself (until session 37
it set them in this process's environment only, after the servers had copied it: the runs it meant
to put under MPS ran time-sliced). The daemon is told to quit when the run ends.

``split``: each server may use only an equal share of the GPU's multiprocessors
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, per client), so the servers' kernels never take each other's
SMs: a one-GPU stand-in for a GPU per server where a step is GPU-bound (8B), without the bias of
shared SMs (a server with more kernel boundaries a step lets its neighbour's kernels in more often,
docs/performance.md, session 33). Memory bandwidth and caches stay shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CONTROL = "nvidia-cuda-mps-control"


class Mps:
    """The daemon for ``servers`` (not yet started; each has an ``env`` dict its process gets)."""

    def __init__(self, work: Path, servers: Iterable[Any], split: bool = False):
        self.pipes, self.logs = work / "mps-pipe", work / "mps-log"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipes), "CUDA_MPS_LOG_DIRECTORY": str(self.logs)}
        self.servers = list(servers)
        # each server's share of the SMs, in percent (None: all of them, as MPS gives by default)
        self.share = 100 // len(self.servers) if split and self.servers else None
        self._control: str | None = None

    def __enter__(self) -> "Mps":
        control = self._control = shutil.which(CONTROL)
        if control is None:
            raise SystemExit(f"--mps: no {CONTROL} on PATH (it comes with NVIDIA's driver utilities)")
        self.pipes.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        for server in self.servers:
            server.env.update(self.env)
            if self.share is not None:
                server.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.share)
        subprocess.run([control, "-d"], check=True, env=self._daemon_env(), stdin=subprocess.DEVNULL)
        return self

    def check(self) -> None:
        """Once the servers are up: the daemon has started an MPS server (it does when its first
        client connects); without one every server runs time-sliced, and the run says so and stops."""
        out = subprocess.run([self._control], input=b"get_server_list\n", capture_output=True, check=False,
                             env=self._daemon_env())
        if not out.stdout.split():
            raise SystemExit(f"--mps: no server reached the MPS daemon (pipe folder {self.pipes}; its log: "
                             f"{self.logs / 'control.log'}); they would share the GPU by time slices")

    def __exit__(self, *exc) -> None:
        subprocess.run([self._control], input=b"quit\n", check=False, env=self._daemon_env())

    def _daemon_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}
