"""Does a process with hotwire armed launch the same work slower than a plugin-free one?

Why: at 256 in flight each armed layer adds about 0.2 ms to every step run without a full CUDA
graph, steered or not, while the op's own calls take a few µs; a sampling profile spreads the rest
over every launch site of the forward (``docs/performance.md``, "Session 24"). If the whole
process launches more slowly (a state the plugin leaves behind: allocator, driver, interpreter),
the same loop of small launches, timed in an engine's own process after it has started, is slower
with the plugin than without it.

How: one engine per process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the model runs in this
process), started with or without hotwire (every layer armed), serving a short batch first; then,
``--repeat`` times each, on the engine's device: a small elementwise op (one kernel launch), an
allocation and its release, and ``torch.cuda.current_device`` (not on the CPU). Prints and writes
the median µs per call of each; run it twice, ``--plugin`` and not, and compare.

    python3 benchmarks/launch_cost.py --model DIR --dummy [--plugin] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def _per_call_us(fn, repeat: int, inner: int = 100) -> float:
    """Median over ``repeat`` timings of ``inner`` calls of ``fn``, in µs per call."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter_ns() - t) / inner / 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dummy", action="store_true", help="random weights (load_format=dummy)")
    ap.add_argument("--plugin", action="store_true", help="load hotwire, every layer armed")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_PLUGINS"] = "hotwire" if args.plugin else "none"
    os.environ.setdefault("HOTWIRE_LAYERS", "all")
    import torch
    from vllm import LLM, SamplingParams

    cuda = torch.cuda.is_available()
    engine = dict(model=args.model, load_format="dummy" if args.dummy else "auto", max_model_len=1024,
                  max_num_seqs=16, dtype="bfloat16" if cuda else "float32", seed=0)
    if cuda:
        engine.update(attention_backend="TRITON_ATTN", gpu_memory_utilization=0.3)
    else:
        engine.update(kv_cache_memory_bytes=128 * 2**20)
    llm = LLM(**engine)
    llm.generate([{"prompt_token_ids": list(range(10, 74))}] * 8, SamplingParams(max_tokens=16))
    device = torch.device("cuda" if cuda else "cpu")
    x = torch.ones(1024, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def launch():
        x.add_(1.0)

    def alloc():
        torch.empty(4096, device=device)

    timings = {}
    with torch.inference_mode():
        for name, fn in (("elementwise_launch", launch), ("alloc_free", alloc)):
            sync()
            timings[name] = _per_call_us(fn, args.repeat)
            sync()
        if cuda:
            timings["current_device"] = _per_call_us(torch.cuda.current_device, args.repeat)
    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "plugin": args.plugin,
              "device": torch.cuda.get_device_name() if cuda else "cpu", "us_per_call": timings}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
