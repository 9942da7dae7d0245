"""``hotwire verify --model PATH``: does steering work on this box, with this model?

Runs two real engines, each in its own process: a plugin-free one and one with hotwire armed,
over the same batch, where only request 0 is steered with a throwaway vector (a unit vector
toward one output token, at the last layer). Checks that steering fires, that every batchmate
is bit-identical to the plugin-free run, and times idle vs all-steered decode in the armed
engine. Prints a report block to paste into an issue; exit status 0 only if both checks pass.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local model directory (weights or config.json + --dummy)")
    parser.add_argument("--dummy", action="store_true", help="random weights (load_format=dummy): config only")
    parser.add_argument("--scale", type=float, default=64.0, help="steering scale of the throwaway vector")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--eager", action="store_true", help="enforce_eager (default: graphs + compile on GPU)")
    parser.set_defaults(run=run)


def _direction(model_dir: Path, hidden: int, token: int) -> np.ndarray:
    """Unit unembedding row of ``token`` when the weights are readable, else a seeded random unit."""
    from .demo import token_direction

    row = token_direction(model_dir, token)
    if row is not None:
        return row
    v = np.random.default_rng(0).standard_normal(hidden)
    return v / np.linalg.norm(v)


def _run_job(work: Path, name: str, job: dict, env: dict[str, str]) -> dict:
    (work / f"{name}.json").write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, "-m", "hotwire.engine_plugin.jobs", str(work / f"{name}.json"),
                           str(work / f"{name}.out.json")], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"hotwire verify: the {name} engine failed (exit {proc.returncode})")
    return json.loads((work / f"{name}.out.json").read_text())


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoConfig

    from hotwire.shared.wire import encode_safetensors

    model_dir = Path(args.model)
    cfg = AutoConfig.from_pretrained(str(model_dir))
    text = cfg.get_text_config()
    n_layers, hidden, vocab = text.num_hidden_layers, text.hidden_size, text.vocab_size
    work = Path(tempfile.mkdtemp(prefix="hotwire-verify-"))
    (work / "vectors").mkdir()
    token = 1000 % vocab
    (work / "vectors" / "verify.safetensors").write_bytes(
        encode_safetensors(_direction(model_dir, hidden, token).astype(np.float32)))
    gpu = torch.cuda.is_available()
    engine = dict(max_model_len=512, max_num_seqs=max(8, args.batch), seed=0, skip_tokenizer_init=True,
                  enforce_eager=args.eager or not gpu)
    if args.dummy:
        engine["load_format"] = "dummy"
    if not gpu:
        engine.update(dtype="float32", kv_cache_memory_bytes=256 * 2**20)
    spec = {"id": "verify", "layer": n_layers - 1, "scale": args.scale}
    rng = np.random.default_rng(1)
    batch = [{"prompt_token_ids": rng.integers(0, vocab, 24).tolist(), "max_tokens": 16, "logprobs": 0,
              "spec": spec if i == 0 else None} for i in range(args.batch)]
    env = {**os.environ, "HOTWIRE_VECTORS": str(work / "vectors"), "HOTWIRE_MAILBOX": str(work / "engine.mbx"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    free = _run_job(work, "plugin-free", {"model": str(model_dir), "engine": engine, "plugin": False,
                                         "rounds": [batch]}, env)
    armed = _run_job(work, "hotwire", {"model": str(model_dir), "engine": engine, "plugin": True,
                                       "rounds": [batch], "timing": {"batch": args.batch, "steps": 64, "rounds": 3,
                                                                     "vocab": vocab, "spec": spec}}, env)
    got, want = armed["rounds"][0], free["rounds"][0]
    fires = got[0]["tokens"] != want[0]["tokens"]
    exact = all(g == w for g, w in zip(got[1:], want[1:]))
    idle, steered = (statistics.median(armed["timing"][k]) for k in ("idle_ms", "steered_ms"))
    import vllm

    print(f"""
hotwire verify ------------------------------------------------------------
model        {model_dir} ({cfg.architectures[0] if cfg.architectures else cfg.model_type}, {n_layers} layers, hidden {hidden})
device       {torch.cuda.get_device_name(0) if gpu else platform.processor() or 'cpu'}
versions     vllm {vllm.__version__}, torch {torch.__version__}, python {platform.python_version()}
mode         {'eager' if engine['enforce_eager'] else 'torch.compile + CUDA graphs'}
plugin       {'loaded' if armed['hotwire'] and not free['hotwire'] else 'NOT loaded as expected'}
steering     {'fires' if fires else 'did NOT change tokens (try a larger --scale)'}  ({json.dumps(spec)})
batchmates   {f'{args.batch - 1} unsteered requests bit-identical to a plugin-free run' if exact else 'DIFFER from the plugin-free run'}
decode step  idle {idle:.3f} ms, all {args.batch} steered {steered:.3f} ms, ratio {steered / idle:.3f} (wall clock, median of 3)
---------------------------------------------------------------------------""")
    return 0 if fires and exact and armed["hotwire"] and not free["hotwire"] else 1
