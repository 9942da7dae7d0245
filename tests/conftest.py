"""Shared fixtures: a tiny random model built offline, startup vectors, real engine runs, and a
running control API on a real engine mailbox."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HIDDEN, LAYERS = 128, 4


def _have_vllm() -> bool:
    try:
        importlib.import_module("vllm")
    except Exception:
        return False
    return True


requires_vllm = pytest.mark.skipif(not _have_vllm(), reason="vLLM is not installed")


@pytest.fixture
def rig(tmp_path):
    """A control API on a real engine mailbox, both started (:class:`control_harness.Rig`);
    suites that need another rig (the engine's, a control API with other settings) define their
    own."""
    from control_harness import Rig

    with Rig.running(tmp_path) as rig:
        yield rig


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from hotwire.tools.tiny_model import build_tiny

    return build_tiny(tmp_path_factory.mktemp("model") / "tiny-qwen3", hidden=HIDDEN, layers=LAYERS)


def make_vectors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    a = (rng.standard_normal(HIDDEN) * 3).astype(np.float32)
    b = (rng.standard_normal(HIDDEN) * 3).astype(np.float32)
    return {
        "boost": (rng.standard_normal(HIDDEN) * 4).astype(np.float32),
        "layered": (rng.standard_normal((LAYERS, HIDDEN)) * 4).astype(np.float32),
        "a": a,
        "b": b,
        "a_plus_b": a + b,
    }


@pytest.fixture(scope="session")
def vectors() -> dict[str, np.ndarray]:
    return make_vectors()


@pytest.fixture(scope="session")
def vectors_dir(tmp_path_factory, vectors) -> Path:
    """Good vectors as safetensors (one as .pt), plus files the engine must skip, by name."""
    import torch

    from hotwire.shared.wire import encode_safetensors

    d = tmp_path_factory.mktemp("vectors")
    for name, vec in vectors.items():
        if name == "b":
            torch.save(torch.from_numpy(vec), d / "b.pt")
        else:
            (d / f"{name}.safetensors").write_bytes(encode_safetensors(vec))
    (d / "wrongshape.safetensors").write_bytes(encode_safetensors(np.ones(HIDDEN + 1, np.float32)))
    nan = np.ones(HIDDEN, np.float32)
    nan[3] = np.nan
    (d / "hasnan.safetensors").write_bytes(encode_safetensors(nan))
    (d / "garbage.safetensors").write_bytes(b"not a safetensors file")
    (d / "zero.safetensors").write_bytes(encode_safetensors(np.zeros(HIDDEN, np.float32)))  # no direction
    return d


def engine_env(tmp: Path, **extra: str) -> dict[str, str]:
    """A private environment for one engine process: caches, temp files, mailbox."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOTWIRE_") and k not in ("VLLM_PLUGINS", "VLLM_USE_V2_MODEL_RUNNER")}
    for sub in ("vllm-cache", "inductor", "tmp"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    env.update(
        VLLM_CACHE_ROOT=str(tmp / "vllm-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
        TMPDIR=str(tmp / "tmp"),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HOTWIRE_MAILBOX=str(tmp / "engine.mbx"),
    )
    env.update(extra)
    return env


CPU_ENGINE = dict(enforce_eager=True, dtype="float32", kv_cache_memory_bytes=128 * 2**20,
                  max_model_len=512, max_num_seqs=16, max_num_batched_tokens=64,
                  enable_prefix_caching=True, seed=0)


def run_engine(tmp: Path, job: dict, env: dict[str, str], timeout: int = 900) -> dict:
    """Run :mod:`hotwire.tools.jobs` in a fresh process; return its JSON plus its log."""
    tmp.mkdir(parents=True, exist_ok=True)
    job_path, out_path = tmp / "job.json", tmp / "out.json"
    job_path.write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, "-m", "hotwire.tools.jobs", str(job_path), str(out_path)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"engine job failed ({proc.returncode}):\n{log[-6000:]}")
    out = json.loads(out_path.read_text())
    out["log"] = log
    return out
