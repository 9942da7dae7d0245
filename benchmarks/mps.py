"""NVIDIA's Multi-Process Service for the servers of one served benchmark, sharing one GPU.

Why: without it the GPU time-slices between processes, so the kernels of servers run side by side
never overlap and each server's step waits on the others' kernels. At 256 in flight four servers
kept the H200 busy 99.5 % of the time (``gpu_busy.py``), every server's throughput then following
how the GPU shared its time, not only its own work. Under MPS the servers' kernels run at once, on
the GPU's multiprocessors together, as a server alone on its GPU runs them (a Qwen3 0.6B decode
step fills a fraction of an H200).

The control daemon gets pipe and log folders of the run's own (``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``), set in this process's environment so every server started after
inherits them, and is told to quit when the run ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"


class Mps:
    def __init__(self, work: Path):
        self.pipes, self.logs = work / "mps-pipe", work / "mps-log"
        self._env: dict[str, str | None] = {}
        self._control: str | None = None

    def __enter__(self) -> "Mps":
        control = self._control = shutil.which(CONTROL)
        if control is None:
            raise SystemExit(f"--mps: no {CONTROL} on PATH (it comes with NVIDIA's driver utilities)")
        self.pipes.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        for name, value in (("CUDA_MPS_PIPE_DIRECTORY", self.pipes), ("CUDA_MPS_LOG_DIRECTORY", self.logs)):
            self._env[name] = os.environ.get(name)
            os.environ[name] = str(value)
        subprocess.run([control, "-d"], check=True)
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run([self._control], input=b"quit\n", check=False)
        for name, value in self._env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
