"""``hotwire verify`` and ``hotwire demo`` end to end on the tiny model (CPU): real engines, a
report, exit 0, each phase on stderr as it starts, no temporary directory left behind."""

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import engine_env, requires_vllm
from hotwire.tools.demo import LOG_TO_STDERR, QUIET

pytestmark = [requires_vllm, pytest.mark.vllm]


def test_verify_reports_steering_fires_and_exact_batchmates(tiny_model, tmp_path):
    env = engine_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hotwire.control_api.cli", "verify", "--model", str(tiny_model),
                           "--quick", "--batch", "3", "--json", str(tmp_path / "report.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    report = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_phases(proc.stderr, "hotwire verify", [
        "read ", "plan: 2 engines in turn (plugin-free, then hotwire), each: start, a batch of 3 requests, "
        "4 timed calls; 144 decode steps per engine", "plugin-free engine: start (load the model)",
        "plugin-free engine: run 1 batch of 3", "plugin-free engine: time decode steps: idle vs steered, batch 3, 1 round",
        "the plugin-free engine took ", "hotwire engine: start (load the model)", "hotwire engine: run 1 batch of 3",
        "hotwire engine: time decode", "compare", "done: pass"])
    assert not list((tmp_path / "tmp").glob("hotwire-*")), "verify left its temporary directory"
    assert "plugin       loaded" in report
    assert "armed        4/4 decoder layers" in report
    assert "steering     fires" in report
    assert "batchmates   2 unsteered requests bit-identical to a plugin-free run" in report
    assert "graphs       none (CPU: no CUDA graphs); dynamo compiles" in report
    assert "; all counts = plugin-free" in report
    assert "result       PASS" in report
    assert "(wall clock, one round)" in report
    fields = json.loads((tmp_path / "report.json").read_text())
    assert fields["pass"] and fields["armed_layers"] == 4 and fields["layers"] == 4
    assert fields["graphs"]["equal_plugin_free"] and fields["ms"]["steered"] > 0


def test_verify_stopped_by_sigterm_stops_its_engine_and_removes_its_directory(tiny_model, tmp_path):
    """SIGTERM while the first engine starts: verify exits 143, its engine process is gone and
    so is its ``hotwire-verify-*`` directory (job files, mailbox, compile cache)."""
    env = engine_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "hotwire.control_api.cli", "verify", "--model",
                             str(tiny_model), "--quick"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "plugin-free engine: start" in line:
                break
        [work] = (tmp_path / "tmp").glob("hotwire-verify-*")
        engines = _processes_naming(work)
        assert engines, f"no engine process runs in {work}: {''.join(seen)}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert not work.exists(), f"verify left {sorted(p.name for p in work.iterdir())}"
    assert not _processes_naming(work), "verify left its engine running"


def _processes_naming(path: Path) -> list[int]:
    """Pids of live processes with ``path`` in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _assert_phases(stderr: str, tool: str, expected: list[str]) -> None:
    """The phase lines (``TOOL [  12.3 s] TEXT``) start with ``expected``, in order, their elapsed
    times growing. An engine's compile and capture phases are left out: whether vLLM compiles
    anything on CPU depends on its version."""
    found = re.findall(rf"^{tool} \[\s*([0-9.]+) s\] (.*)$", stderr, re.M)
    texts = [text for _, text in found if not re.search(r"(^|: )(compile|capture) ", text)]
    assert len(texts) == len(expected) and all(t.startswith(e) for t, e in zip(texts, expected)), texts
    times = [float(t) for t, _ in found]
    assert times == sorted(times), found


def test_demo_tiny_prints_phases_and_cleans_up(tmp_path):
    """``hotwire demo --model tiny`` with vLLM's engine core in its own process (the default): it
    steers, reports each phase, stops the engine (else the exit waits for it forever) and removes
    its directory and vLLM's IPC sockets."""
    # A short TMPDIR: vLLM's IPC socket paths (under the demo's directory) must fit in 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="hw-"))
    try:
        env = engine_env(tmp_path, VLLM_ENABLE_V1_MULTIPROCESSING="1", TMPDIR=str(tmp))
        for name in ("HOTWIRE_MAILBOX", *QUIET, *LOG_TO_STDERR):
            env.pop(name, None)
        proc = subprocess.run([sys.executable, "-m", "hotwire.control_api.cli", "demo", "--model", "tiny",
                               "--max-tokens", "8"], env=env, capture_output=True, text=True, timeout=600)
        left = sorted(p.name for p in tmp.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[8 x target]" in proc.stdout
    _assert_phases(proc.stderr, "hotwire demo", ["build model: a tiny random Qwen3", "make the vector:",
                                                 "start engine (load the model)", "run: "])
    assert not left, f"the demo left {left} in TMPDIR"
    noise = [line for line in proc.stderr.splitlines() if re.search(r"\bINFO\b|it/s\]", line)]
    assert not noise, f"vLLM's log lines or progress bars between the phases: {noise[:5]}"
    report = proc.stdout.strip().splitlines()
    assert report[0] == "=" * 72 and report[-1] == "=" * 72, "stdout holds more than the answers"


def test_differences_tell_tokens_from_logprobs():
    from hotwire.tools.verify import differences

    want = [{"tokens": [1, 2], "logprobs": [-1.0, -2.0]}] * 3
    got = [{"tokens": [1, 3], "logprobs": [-1.0, -2.0]},      # a token changed
           {"tokens": [1, 2], "logprobs": [-1.0, -2.25]},     # same tokens, one logprob moved
           {"tokens": [1, 2], "logprobs": [-1.0, -2.0]}]      # identical
    assert differences(got, want) == {"requests": 3, "tokens_differ": 1, "logprobs_only_differ": 1,
                                       "max_logprob_diff": 0.25}


def test_determinism_control_finds_two_plugin_free_engines_identical(tiny_model, tmp_path):
    """benchmarks/determinism.py: the control behind every bit-exactness comparison (CPU engines)."""
    from pathlib import Path

    script = Path(__file__).parents[1] / "benchmarks" / "determinism.py"
    proc = subprocess.run([sys.executable, str(script), "--model", str(tiny_model), "--batch", "3",
                           "--engine-args", json.dumps({"dtype": "float32", "kv_cache_memory_bytes": 128 * 2**20}),
                           "--out", str(tmp_path / "det.json")],
                          env=engine_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "det.json").read_text())
    assert report["identical"] and report["diff"] == {"requests": 3, "tokens_differ": 0, "logprobs_only_differ": 0,
                                                      "max_logprob_diff": 0.0}
