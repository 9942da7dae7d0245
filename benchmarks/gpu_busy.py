"""How busy a GPU is while servers run on it: ``nvidia-smi``'s utilization, sampled in the background.

Why: the simultaneous design puts every server on one GPU and reads a host-bound step. If the
servers' kernels together keep the GPU busy nearly all the time, a server's step also waits for the
others' kernels, and one with more GPU work per step (steering's kernels) loses more than its own
work costs. Each window of a simultaneous stretch records the share of samples in which a kernel
ran (``gpu_util``, nvidia-smi's ``utilization.gpu``: the percentage of its sample period with a
kernel executing) and the SM clock, so a ratio can be read beside how saturated the GPU was.
Sequential windows (one server alone on the GPU) and ``--gpu-each`` windows (a GPU per server)
record their server's own GPU the same way: a clock that sags in some windows shows there.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time


class GpuBusy:
    """``nvidia-smi`` sampling every ``period_ms`` while in the ``with`` block; :meth:`between`
    summarises the samples taken between two ``time.monotonic()`` readings, of one GPU or of all.
    Without ``nvidia-smi`` it samples nothing and :meth:`between` returns None."""

    def __init__(self, period_ms: int = 200):
        self._period_ms = period_ms
        self._samples: list[tuple[float, int, float, float]] = []  # (monotonic s, GPU index, utilization %, SM MHz)
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> "GpuBusy":
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self._proc = subprocess.Popen([exe, "--query-gpu=index,utilization.gpu,clocks.sm",
                                           "--format=csv,noheader,nounits",
                                           f"-lms={self._period_ms}"], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                index, util, clock = (float(v) for v in line.split(",")[:3])
            except ValueError:
                continue  # a GPU that reports "[N/A]"
            self._samples.append((time.monotonic(), int(index), util, clock))

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def between(self, t0: float, t1: float, gpu: int | None = None) -> dict | None:
        """``{"gpu_util": mean %, "gpu_util_min": %, "sm_mhz": mean, "gpu_samples": n}`` over
        ``[t0, t1]``, of GPU ``gpu`` (nvidia-smi's index; None: every GPU's samples); None when
        nothing was sampled there."""
        got = [(u, c) for t, i, u, c in list(self._samples) if t0 <= t <= t1 and gpu in (None, i)]
        if not got:
            return None
        utils = [u for u, _ in got]
        return {"gpu_util": round(sum(utils) / len(utils), 1), "gpu_util_min": min(utils),
                "sm_mhz": round(sum(c for _, c in got) / len(got)), "gpu_samples": len(got)}
