"""How busy a GPU is while servers run on it: ``nvidia-smi``'s utilization, sampled in the background.

Why: the simultaneous design puts every server on one GPU and reads a host-bound step. If the
servers' kernels together keep the GPU busy nearly all the time, a server's step also waits for the
others' kernels, and one with more GPU work per step (steering's kernels) loses more than its own
work costs. Each window of a simultaneous stretch records the share of samples in which a kernel
ran (``gpu_util``, nvidia-smi's ``utilization.gpu``: the percentage of its sample period with a
kernel executing), the SM clock, the board's power draw and why the clock was held below its
maximum (nvidia-smi's ``clocks_event_reasons.active`` bits: power cap, thermal, ...), so a ratio
can be read beside how saturated the GPU was and a slow window beside a clock the GPU held down.
Sequential windows (one server alone on the GPU) and ``--gpu-each`` windows (a GPU per server)
record their server's own GPU the same way: a clock that sags in some windows shows there.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable


BASE = "index,utilization.gpu,clocks.sm"
EXTRA = ",power.draw,clocks_event_reasons.active"  # older drivers name the second clocks_throttle_reasons
# clocks_event_reasons bits worth naming (nvidia-smi -q -d PERFORMANCE); 0x1 (idle) is left out
REASONS = {0x2: "app clocks", 0x4: "sw power cap", 0x8: "hw slowdown", 0x10: "sync boost",
           0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake", 0x100: "display clocks"}


def reasons(mask: int) -> list[str]:
    """The named reasons of one ``clocks_event_reasons.active`` mask."""
    return [name for bit, name in REASONS.items() if mask & bit]


class GpuBusy:
    """``nvidia-smi`` sampling every ``period_ms`` while in the ``with`` block; :meth:`between`
    summarises the samples taken between two ``time.monotonic()`` readings, of one GPU or of all.
    Without ``nvidia-smi`` it samples nothing and :meth:`between` returns None."""

    def __init__(self, period_ms: int = 200):
        self._period_ms = period_ms
        # (monotonic s, GPU index, utilization %, SM MHz, power W or None, clock-event mask or None)
        self._samples: list[tuple[float, int, float, float, float | None, int | None]] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> "GpuBusy":
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            fields = next((BASE + extra for extra in (EXTRA, EXTRA.replace("event", "throttle"))
                           if _accepted(exe, BASE + extra)), BASE)
            self._proc = subprocess.Popen([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                           f"-lms={self._period_ms}"], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            values = [v.strip() for v in line.split(",")]
            try:
                index, util, clock = (float(v) for v in values[:3])
            except ValueError:
                continue  # a GPU that reports "[N/A]"
            power = _field(values[3], float) if len(values) > 3 else None
            mask = _field(values[4], lambda text: int(text, 16)) if len(values) > 4 else None
            self._samples.append((time.monotonic(), int(index), util, clock, power, mask))

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def between(self, t0: float, t1: float, gpu: int | None = None) -> dict | None:
        """``{"gpu_util": mean %, "gpu_util_min": %, "sm_mhz": mean, "sm_mhz_min": MHz, "gpu_samples":
        n}`` over ``[t0, t1]``, of GPU ``gpu`` (nvidia-smi's index; None: every GPU's samples), and
        where the driver reports them ``"power_w"`` (mean) and ``"clock_held"`` (each named reason:
        the share of samples it held the clock down); None when nothing was sampled there."""
        got = [x[2:] for x in list(self._samples) if t0 <= x[0] <= t1 and gpu in (None, x[1])]
        if not got:
            return None
        utils, clocks = [x[0] for x in got], [x[1] for x in got]
        out = {"gpu_util": round(sum(utils) / len(utils), 1), "gpu_util_min": min(utils),
               "sm_mhz": round(sum(clocks) / len(clocks)), "sm_mhz_min": min(clocks), "gpu_samples": len(got)}
        power = [x[2] for x in got if x[2] is not None]
        if power:
            out["power_w"] = round(sum(power) / len(power), 1)
        masks = [x[3] for x in got if x[3] is not None]
        if masks:
            held = Counter(name for mask in masks for name in reasons(mask))
            out["clock_held"] = {name: round(n / len(masks), 2) for name, n in sorted(held.items())}
        return out


def _accepted(exe: str, fields: str) -> bool:
    """Does this driver's nvidia-smi know every one of ``fields``?"""
    try:
        return subprocess.run([exe, f"--query-gpu={fields}", "--format=csv"], capture_output=True,
                              timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _field(text: str, parse: Callable[[str], float | int]) -> float | int | None:
    """A sample's field parsed, None where the driver says "[N/A]" or the like."""
    try:
        return parse(text)
    except ValueError:
        return None
