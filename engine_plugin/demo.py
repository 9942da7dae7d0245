"""``hotwire demo``: a steered and an unsteered completion side by side, end to end.

With no ``--model`` it builds a tiny random Qwen3 offline (seconds, on CPU when there is no
GPU). The steering vector is made from the model itself: the unembedding row of a target
token, added at the last decoder layer, so the steered completion visibly drifts to that token
while its unsteered batchmate is left exactly as a plugin-free run would produce it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory (default: build a tiny random Qwen3)")
    parser.add_argument("--prompt", default="Once upon a time, a small")
    parser.add_argument("--target", default=" capital", help="text whose first token the vector pushes toward")
    parser.add_argument("--scale", type=float, default=12.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.set_defaults(run=run)


def token_direction(model_dir: Path, token_id: int):
    """Unit-norm unembedding row of ``token_id`` (the direction that raises that token's logit),
    or None when the directory holds no readable weights."""
    import numpy as np
    from safetensors import safe_open

    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in ("lm_head.weight", "model.embed_tokens.weight"):
                if key in f.keys():
                    row = f.get_slice(key)[token_id].float().numpy()
                    return (row / np.linalg.norm(row)).astype(np.float32)
    return None


def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="hotwire-demo-"))
    import torch

    from hotwire.shared.wire import encode_safetensors

    from .tiny_model import build_tiny

    model_dir = Path(args.model) if args.model else build_tiny(work / "tiny-qwen3")
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    n_layers = AutoConfig.from_pretrained(str(model_dir)).num_hidden_layers
    target_id = tok(args.target, add_special_tokens=False).input_ids[0]
    direction = token_direction(model_dir, target_id)
    if direction is None:
        raise SystemExit(f"no lm_head/embedding weights in {model_dir}")
    (work / "vectors").mkdir()
    (work / "vectors" / "toward_target.safetensors").write_bytes(encode_safetensors(direction))
    os.environ["HOTWIRE_VECTORS"] = str(work / "vectors")
    os.environ.setdefault("HOTWIRE_MAILBOX", str(work / "engine.mbx"))

    from vllm import LLM, SamplingParams

    gpu = torch.cuda.is_available()
    engine = dict(max_model_len=512, max_num_seqs=8, seed=0)
    if not gpu:  # CPU: eager keeps start-up to seconds; size the KV cache explicitly
        engine.update(enforce_eager=True, dtype="float32", kv_cache_memory_bytes=128 * 2**20)
    llm = LLM(model=str(model_dir), **engine)
    spec = {"id": "toward_target", "layer": n_layers - 1, "scale": args.scale}

    def params(steer: bool) -> SamplingParams:
        return SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                              extra_args={"hotwire": json.dumps(spec)} if steer else None)

    plain, steered = llm.generate([args.prompt, args.prompt], [params(False), params(True)], use_tqdm=False)
    hits = [o.outputs[0].token_ids.count(target_id) for o in (plain, steered)]
    print("\n" + "=" * 72)
    print(f"model     {model_dir} ({'GPU' if gpu else 'CPU'})")
    print(f"prompt    {args.prompt!r}")
    print(f"steering  {json.dumps(spec)}  (toward token {tok.decode([target_id])!r} = id {target_id})")
    print(f"unsteered {plain.outputs[0].text!r}   [{hits[0]} x target]")
    print(f"steered   {steered.outputs[0].text!r}   [{hits[1]} x target]")
    print("=" * 72)
    return 0 if hits[1] > hits[0] else 1
