"""``benchmarks/arch_matrix.py --smoke`` on CPU: non-Qwen families steer, and a model hotwire
cannot arm (OLMo 2 on vLLM's Transformers modeling backend) serves exactly like plugin-free."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import engine_env, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]

MATRIX = Path(__file__).resolve().parents[1] / "benchmarks" / "arch_matrix.py"


def test_smoke_matrix_rows(tmp_path):
    out = tmp_path / "matrix"
    proc = subprocess.run([sys.executable, str(MATRIX), "--smoke", "--only", "llama3", "gemma2", "olmo2-hf",
                           "--jobs", "3", "--out", str(out)], env=engine_env(tmp_path), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((out / "arch_matrix.json").read_text())["rows"]}
    assert sorted(rows) == ["gemma2", "llama3", "olmo2-hf"]
    for name in ("llama3", "gemma2"):
        v = rows[name]["verify"]
        assert v["status"] == "pass" and v["armed"] and v["armed_layers"] == 2, name
        assert v["fires"] and v["batchmates_exact"] and v["graphs"]["equal_plugin_free"], name
    control = rows["olmo2-hf"]["verify"]
    assert control["status"] == "not armed" and not control["armed"] and control["all_exact"]
    assert any("found no decoder layers to arm" in line for line in control["log"])
    table = (out / "arch_matrix.md").read_text()
    assert "| Gemma2ForCausalLM |" in table and "pass (not armed, as expected)" in table
