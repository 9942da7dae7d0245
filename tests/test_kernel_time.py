"""benchmarks/kernel_time.py end to end on the CPU (``--smoke``: the figures mean nothing): each
engine process runs, the steered requests it was sent are the ones its engine counted, and the
summary holds every condition's decode row and the prefill step's kernel differences. GPU time is
given per session, so a benchmark broken on the CPU must not reach the GPU first."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "kernel_time.py"
sys.path.insert(0, str(SCRIPT.parent))

from kernel_time import summed  # noqa: E402


def test_a_cpu_ops_negative_self_time_counts_as_none():
    """The CPU profile files a child from another thread under an op shorter than it: the op's self
    time comes out negative, and summed as it was an idle step's kernel time fell below zero
    (a CI run of the smoke test below failed so)."""
    cpu, cuda = "cpu", "cuda"
    events = [SimpleNamespace(device_type=cpu, name="aten::mm", self_cpu_time_total=30.0),
              SimpleNamespace(device_type=cpu, name="aten::mm", self_cpu_time_total=-1900.0),
              SimpleNamespace(device_type=cpu, name="aten::add", self_cpu_time_total=5.0),
              SimpleNamespace(device_type=cuda, name="gemm", self_cpu_time_total=7.0)]
    assert summed(events, cpu, cpu=True) == {"aten::mm": [30.0, 2], "aten::add": [5.0, 1]}


@pytest.mark.vllm
def test_the_smoke_run_measures_both_processes_and_lists_prefill_kernel_differences(tmp_path):
    out = tmp_path / "kt.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--processes", "plugin_free", "hotwire",
                          "--repeats", "1", "--batches", "4", "--steps", "4", "--prefill", "64", "--top", "200",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert all(row[f"{c}_kernel_us"] > 0 for c in ("plugin_free", "idle", "steered"))
    (hotwire,) = result["samples"]["steered"]
    assert hotwire["counters"]["steered_requests"] > 0  # checked equal to those sent, in the child
    prefill = [d for d in result["top_kernels"] if d["batch"] == "prefill 64"]
    assert {d["condition"] for d in prefill} == {"idle", "steered"}
    assert any(d["kernel"] == "hotwire::steer_" and d["plugin_free_us"] == 0 for d in prefill)
