"""Decode step time: plugin-free vs idle vs all-steered (and eager), side by side in one run.

Three engines live in one process (each with its own engine-core process): a plugin-free one
(``VLLM_PLUGINS=none`` when its engine core starts), one with hotwire armed on every layer, and
the armed one again with ``enforce_eager=True`` (what hook-based steering pays). Conditions are
measured in alternating rounds, so machine drift hits all of them alike; medians are reported.

Step time = (t(N2 tokens) - t(N1 tokens)) / (N2 - N1) for one batch of B requests, which
cancels the prefill and the per-call overhead. Ratios are the median of per-round ratios of
neighbouring measurements (drift cancels within a round), next to the medians of the times. "All-steered" gives every request its own pair of
vectors and scales (two entries, two layers).

    python benchmarks/decode.py --shape qwen3-0.6b --batches 1 8 64 256 --out benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from hotwire.tools.tiny_model import QWEN3_SHAPES, steered_layers, write_config

N_VECTORS = 256


def _vectors(path: Path, hidden: int) -> None:
    from hotwire.shared.wire import encode_safetensors

    rng = np.random.default_rng(0)
    for i in range(N_VECTORS):
        (path / f"v{i}.safetensors").write_bytes(encode_safetensors(rng.standard_normal(hidden).astype(np.float32)))


def _engine(model: Path, *, plugin: bool, eager: bool, mailbox: str, max_seqs: int, mem: float):
    from vllm import LLM

    os.environ["HOTWIRE_MAILBOX"] = mailbox
    if plugin:
        os.environ.pop("VLLM_PLUGINS", None)
    else:
        os.environ["VLLM_PLUGINS"] = "none"
    try:
        return LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                   attention_backend="TRITON_ATTN", enforce_eager=eager, enable_prefix_caching=False,
                   max_model_len=1024, max_num_seqs=max_seqs, max_num_batched_tokens=max(2048, max_seqs * 8),
                   gpu_memory_utilization=mem, seed=0)
    finally:
        os.environ.pop("VLLM_PLUGINS", None)


def _step_time(llm, batch: int, steered: bool, n1: int, n2: int, n_layers: int) -> float:
    from vllm import SamplingParams

    rng = np.random.default_rng(batch)
    prompts = [{"prompt_token_ids": rng.integers(100, 150000, 32).tolist()} for _ in range(batch)]
    l1, l2 = steered_layers(n_layers)

    def params(n):
        out = []
        for j in range(batch):
            extra = None
            if steered:
                spec = [{"id": f"v{j % N_VECTORS}", "layer": l1, "scale": 1.0 + j / batch},
                        {"id": f"v{(j + 1) % N_VECTORS}", "layer": l2, "scale": -0.5 - j / batch}]
                extra = {"hotwire": json.dumps(spec)}
            out.append(SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, extra_args=extra))
        return out

    times = []
    for n in (n1, n2):
        p = params(n)
        t = time.perf_counter()
        llm.generate(prompts, p, use_tqdm=False)
        times.append(time.perf_counter() - t)
    return (times[1] - times[0]) / (n2 - n1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--eager-rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=256, help="decode steps measured per call pair")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch
    import vllm


    # Each engine core must start as a fresh process: a forked one would inherit the parent's
    # "plugins already loaded" state (and with it, whichever VLLM_PLUGINS was set first).
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    work = Path(tempfile.mkdtemp(prefix="hotwire-bench-"))
    shape = QWEN3_SHAPES[args.shape]
    model = write_config(work / args.shape, args.shape)
    (work / "vectors").mkdir()
    _vectors(work / "vectors", shape["hidden_size"])
    os.environ["HOTWIRE_VECTORS"] = str(work / "vectors")
    max_seqs = max(args.batches)

    t0 = time.time()
    engines = {
        "plugin_free": _engine(model, plugin=False, eager=False, mailbox=str(work / "a.mbx"), max_seqs=max_seqs, mem=0.25),
        "hotwire": _engine(model, plugin=True, eager=False, mailbox=str(work / "b.mbx"), max_seqs=max_seqs, mem=0.25),
    }
    if not args.no_eager:
        engines["eager"] = _engine(model, plugin=True, eager=True, mailbox=str(work / "c.mbx"), max_seqs=max_seqs, mem=0.25)
    startup_s = time.time() - t0
    # Only an armed engine creates its mailbox: proof of which engines carry the plugin.
    armed = {name: (work / f"{m}.mbx").exists() for name, m in (("plugin_free", "a"), ("hotwire", "b"), ("eager", "c"))
             if name in engines}
    if armed != {name: name != "plugin_free" for name in armed}:
        raise SystemExit(f"plugin not where expected: {armed}")

    n_layers = shape["num_hidden_layers"]
    conds = [("plugin_free", "plugin_free", False), ("idle", "hotwire", False), ("steered", "hotwire", True)]
    if "eager" in engines:
        conds += [("eager_idle", "eager", False), ("eager_steered", "eager", True)]
    samples: dict[int, dict[str, list[float]]] = {b: {c[0]: [] for c in conds} for b in args.batches}
    for b in args.batches:  # warm-up: first calls pay allocator and cache effects
        for _, eng, steered in conds:
            _step_time(engines[eng], b, steered, 2, 6, n_layers)
    for r in range(args.rounds):
        for b in args.batches:
            order = conds if r % 2 == 0 else conds[::-1]
            for name, eng, steered in order:
                eager = name.startswith("eager")
                if eager and r >= args.eager_rounds:
                    continue
                steps = max(8, args.steps // 4) if eager else args.steps
                samples[b][name].append(_step_time(engines[eng], b, steered, 8, 8 + steps, n_layers))

    rows = []
    for b in args.batches:
        s = samples[b]
        med = {k: statistics.median(v) for k, v in s.items()}
        ratio = lambda num, den: round(statistics.median(x / y for x, y in zip(s[num], s[den])), 4)  # noqa: E731
        row = {"batch": b, **{f"{k}_ms": round(v * 1e3, 4) for k, v in med.items()},
               "idle_over_plugin_free": ratio("idle", "plugin_free"),
               "steered_over_idle": ratio("steered", "idle")}
        if "eager_idle" in med:
            row["eager_steered_over_plugin_free"] = round(med["eager_steered"] / med["plugin_free"], 2)
        rows.append(row)
    result = {
        "shape": args.shape, "config": shape, "dtype": "bfloat16", "vllm": vllm.__version__,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "runner": "V1" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "0" else "default",
        "date": time.strftime("%Y-%m-%d"), "host": platform.node(), "rounds": args.rounds,
        "decode_steps": args.steps, "startup_s": round(startup_s, 1), "rows": rows,
        "samples_ms": {b: {k: [round(x * 1e3, 4) for x in v] for k, v in s.items()} for b, s in samples.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
