"""``hotwire verify`` end to end on the tiny model (CPU): two real engines, a report, exit 0."""

import json
import subprocess
import sys

import pytest

from conftest import engine_env, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]


def test_verify_reports_steering_fires_and_exact_batchmates(tiny_model, tmp_path):
    env = engine_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hotwire.control_api.cli", "verify", "--model", str(tiny_model),
                           "--batch", "3", "--timing-steps", "16", "--json", str(tmp_path / "report.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    report = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "plugin       loaded" in report
    assert "armed        4/4 decoder layers" in report
    assert "steering     fires" in report
    assert "batchmates   2 unsteered requests bit-identical to a plugin-free run" in report
    assert "graphs       none (CPU: no CUDA graphs); dynamo compiles" in report
    assert "; all counts = plugin-free" in report
    assert "result       PASS" in report
    fields = json.loads((tmp_path / "report.json").read_text())
    assert fields["pass"] and fields["armed_layers"] == 4 and fields["layers"] == 4
    assert fields["graphs"]["equal_plugin_free"] and fields["ms"]["steered"] > 0


def test_differences_tell_tokens_from_logprobs():
    from hotwire.engine_plugin.verify import differences

    want = [{"tokens": [1, 2], "logprobs": [-1.0, -2.0]}] * 3
    got = [{"tokens": [1, 3], "logprobs": [-1.0, -2.0]},      # a token changed
           {"tokens": [1, 2], "logprobs": [-1.0, -2.25]},     # same tokens, one logprob moved
           {"tokens": [1, 2], "logprobs": [-1.0, -2.0]}]      # identical
    assert differences(got, want) == {"requests": 3, "tokens_differ": 1, "logprobs_only_differ": 1,
                                       "max_logprob_diff": 0.25}
