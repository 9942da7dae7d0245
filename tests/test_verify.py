"""``hotwire verify`` end to end on the tiny model (CPU): two real engines, a report, exit 0."""

import subprocess
import sys

import pytest

from conftest import engine_env, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]


def test_verify_reports_steering_fires_and_exact_batchmates(tiny_model, tmp_path):
    env = engine_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hotwire.control_api.cli", "verify", "--model", str(tiny_model),
                           "--batch", "3"], env=env, capture_output=True, text=True, timeout=900)
    report = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "steering     fires" in report
    assert "batchmates   2 unsteered requests bit-identical to a plugin-free run" in report
    assert "plugin       loaded" in report
