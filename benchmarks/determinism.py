"""Control for the bit-exactness checks: are two plugin-free engines bit-identical to each other?

Invariant 1 compares a hotwire engine with a plugin-free one, each in its own process. That
comparison only means something where vLLM is itself deterministic from process to process:
inductor autotunes some kernels by timing (a persistent norm reduction over fewer than 256
elements tries several block shapes), and two processes may pick different reduction orders.
This runs the batch of ``hotwire verify`` through two plugin-free engines, each compiling cold
in its own cache, and reports how they differ. Inductor settings from the environment
(``TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS=1``: one reduction config chosen by rule) reach both
engines and are recorded.

    python3 benchmarks/determinism.py --model DIR --dummy [--engine-args JSON] [--out FILE]

Exit status 0 when the two runs are identical, 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hotwire.tools.verify import differences, probe_batch, probe_engine, run_job


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dummy", action="store_true", help="random weights (load_format=dummy)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--engine-args", type=json.loads, default={})
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import torch
    from transformers import AutoConfig

    batch = probe_batch(AutoConfig.from_pretrained(args.model).get_text_config().vocab_size, args.batch)
    engine = {**probe_engine(args.batch, dummy=args.dummy, eager=not torch.cuda.is_available()), **args.engine_args}
    runs = []
    for name in ("first", "second"):
        work = Path(tempfile.mkdtemp(prefix=f"hotwire-determinism-{name}-"))
        env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
               "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        out, _ = run_job(work, name, {"model": args.model, "engine": engine, "plugin": False, "rounds": [batch]}, env)
        runs.append(out["rounds"][0])
    diff = differences(runs[1], runs[0])
    same = runs[0] == runs[1]
    knobs = {k: v for k, v in os.environ.items() if k.startswith(("TORCHINDUCTOR_", "VLLM_"))}
    report = {"model": args.model, "engine": engine, "env": knobs, "identical": same, "diff": diff}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
