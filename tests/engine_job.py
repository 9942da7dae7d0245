"""Run one real vLLM engine over a JSON job, in its own process; write the results as JSON.

Each engine runs in a fresh process because the plugin patches vLLM's classes process-wide:
a plugin-free reference run must never share a process with a steered one.

    python tests/engine_job.py JOB.json OUT.json

Job::

    {"model": PATH, "engine": {LLM kwargs}, "plugin": true,
     "rounds": [[{"prompt": "..." | "prompt_token_ids": [...], "max_tokens": 8,
                  "spec": <hotwire spec or null>, "logprobs": 0}, ...], ...],
     "graph_counts": false}

Each round is one ``llm.generate`` call (one batch). Output::

    {"rounds": [[{"tokens": [...], "logprobs": [...]}, ...]], "hotwire": bool,
     "counters": {...}, "graph_counts": [{"compiles": n, "captures": n} after warm-up, after each round]}
"""

from __future__ import annotations

import json
import os
import sys


def _graph_counters():
    """Count dynamo compilations and CUDA-graph captures in this process (engine in-process)."""
    import torch

    counts = {"captures": 0}
    if torch.cuda.is_available():
        orig = torch.cuda.CUDAGraph.capture_begin

        def capture_begin(self, *a, **k):
            counts["captures"] += 1
            return orig(self, *a, **k)

        torch.cuda.CUDAGraph.capture_begin = capture_begin

    def snapshot():
        from torch._dynamo.utils import counters

        return {"compiles": int(counters["stats"]["unique_graphs"]), "captures": counts["captures"]}

    return snapshot


def main(job_path: str, out_path: str) -> None:
    job = json.load(open(job_path))
    if not job.get("plugin", True):
        os.environ["VLLM_PLUGINS"] = "none"  # vLLM loads no general plugin: a plugin-free engine
    snapshot = _graph_counters() if job.get("graph_counts") else None

    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], **job.get("engine", {}))

    def params(req):
        spec = req.get("spec")
        extra = None if spec is None else {"hotwire": spec if isinstance(spec, str) else json.dumps(spec)}
        return SamplingParams(max_tokens=req.get("max_tokens", 8), temperature=0.0, ignore_eos=True,
                              logprobs=req.get("logprobs"), extra_args=extra)

    def prompt(req):
        if "prompt_token_ids" in req:
            return {"prompt_token_ids": req["prompt_token_ids"]}
        return req["prompt"]

    graphs = [snapshot()] if snapshot else []
    rounds = []
    for batch in job["rounds"]:
        outs = llm.generate([prompt(r) for r in batch], [params(r) for r in batch], use_tqdm=False)
        rows = []
        for o in outs:
            c = o.outputs[0]
            lps = [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if c.logprobs else None
            rows.append({"tokens": list(c.token_ids), "logprobs": lps})
        rounds.append(rows)
        if snapshot:
            graphs.append(snapshot())

    counters = {}
    box = os.environ.get("HOTWIRE_MAILBOX")
    if job.get("plugin", True) and box and os.path.exists(box):
        from hotwire.shared.mailbox import MailboxView

        counters = MailboxView.open(box).counters()
    json.dump({"rounds": rounds, "hotwire": _hotwire_active(), "counters": counters, "graph_counts": graphs},
              open(out_path, "w"))


def _hotwire_active() -> bool:
    from vllm.v1.worker import gpu_model_runner

    return getattr(gpu_model_runner.GPUModelRunner.execute_model, "__hotwire__", False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
