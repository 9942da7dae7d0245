"""Run one real vLLM engine over a JSON job, in its own process; write the results as JSON.

Each engine runs in a fresh process because the plugin patches vLLM's classes process-wide:
a plugin-free reference run must never share a process with a steered one. Used by the tests,
``hotwire verify`` and the benchmarks.

    python -m hotwire.tools.jobs JOB.json OUT.json

Job::

    {"model": PATH, "engine": {LLM kwargs}, "plugin": true,
     "rounds": [[{"prompt": "..." | "prompt_token_ids": [...], "max_tokens": 8,
                  "spec": <hotwire spec or null>, "logprobs": 0, "cache_salt": "...",
                  "after": [round, index]}, ...], ...],
     "graph_counts": false, "op_calls": false, "progress": false,
     "timing": {"batch": 8, "steps": 64, "rounds": 3, "warmup": true, "vocab": 1000,
                "spec": <spec for every request>}}

Each round is one ``llm.generate`` call (one batch). A request with ``after`` is a follow-up turn:
its prompt is that earlier request's prompt and answer, then its own ``prompt_token_ids``.
``cache_salt`` keeps a request's KV blocks apart from every other request's. Output::

    {"rounds": [[{"tokens": [...], "logprobs": [...]}, ...]], "hotwire": bool, "armed": [layer, ...],
     "counters": {...},
     "graph_counts": [{"compiles": n, "captures": n, "idle_captures": n} after warm-up, after each round,
                      after timing],
     "timing": {"idle_ms": [...], "steered_ms": [...]},
     "op_calls": {"calls": n, "direct": n}}

``op_calls`` counts the op's calls from Python during the rounds (steps run without a CUDA graph
call it once per armed layer) and how many of them went past torch's dispatcher straight to the
op's kernel (``steer_op._call_past_the_dispatcher``: the dispatcher lets the GIL go, so in a served
engine every call should go past it); null without the plugin.

``armed`` lists the decoder layers the plugin armed, as its mailbox publishes them (empty when
the plugin is absent, armed nothing, or runs without a mailbox).

``progress`` prints each phase (start, compile, capture, run, timing) on stderr as it starts, as
:func:`hotwire.tools.progress.mark` lines.

``timing`` measures decode step time in this one engine, idle and steered rounds alternating:
(t(8 + steps tokens) - t(8 tokens)) / steps for one batch, after one unrecorded idle and steered
measurement unless ``warmup`` is false.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _graph_counters():
    """Count dynamo compilations and CUDA-graph captures in this process (engine in-process);
    ``idle_captures`` are hotwire's second captures, without the op (``engine_plugin.idle_graphs``),
    so ``captures`` compares with a plugin-free engine's."""
    import torch

    counts = {"captures": 0, "idle_captures": 0}
    if torch.cuda.is_available():
        orig = torch.cuda.CUDAGraph.capture_begin

        def capture_begin(self, *a, **k):
            idle = sys.modules.get("hotwire.engine_plugin.idle_graphs")
            counts["idle_captures" if idle is not None and idle.skipping() else "captures"] += 1
            return orig(self, *a, **k)

        torch.cuda.CUDAGraph.capture_begin = capture_begin

    def snapshot():
        from torch._dynamo.utils import counters

        return {"compiles": int(counters["stats"]["unique_graphs"]), **counts}

    return snapshot


def main(job_path: str, out_path: str) -> None:
    job = json.load(open(job_path))
    if not job.get("plugin", True):
        os.environ["VLLM_PLUGINS"] = "none"  # vLLM loads no general plugin: a plugin-free engine
    snapshot = _graph_counters() if job.get("graph_counts") else None
    phase = _phases(job)

    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], **job.get("engine", {}))

    def params(req):
        spec = req.get("spec")
        extra = None if spec is None else {"hotwire": spec if isinstance(spec, str) else json.dumps(spec)}
        return SamplingParams(max_tokens=req.get("max_tokens", 8), temperature=0.0, ignore_eos=True,
                              logprobs=req.get("logprobs"), extra_args=extra)

    def prompt(req):
        if "after" in req:
            r, i = req["after"]
            ids = [*prompt(job["rounds"][r][i])["prompt_token_ids"], *rounds[r][i]["tokens"],
                   *req.get("prompt_token_ids", [])]
        elif "prompt_token_ids" in req:
            ids = req["prompt_token_ids"]
        else:
            return req["prompt"]
        return {"prompt_token_ids": ids, **({"cache_salt": req["cache_salt"]} if "cache_salt" in req else {})}

    def generate(batch):
        return llm.generate([prompt(r) for r in batch], [params(r) for r in batch], use_tqdm=False)

    graphs = [snapshot()] if snapshot else []
    op_calls = _count_op_calls() if job.get("op_calls") and job.get("plugin", True) else None
    rounds = []
    if job.get("rounds"):
        n = len(job["rounds"])
        phase(f"run {n} batch{'es' if n > 1 else ''} of {len(job['rounds'][0])} requests")
    for batch in job.get("rounds", []):
        rows = []
        for o in generate(batch):
            c = o.outputs[0]
            lps = [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if c.logprobs else None
            rows.append({"tokens": list(c.token_ids), "logprobs": lps})
        rounds.append(rows)
        if snapshot:
            graphs.append(snapshot())
    if job.get("timing"):
        timed = job["timing"]["rounds"]
        phase(f"time decode steps: idle vs steered, batch {job['timing']['batch']}, {timed} "
              f"round{'s' if timed > 1 else ''}")
    timing = _timing(generate, job["timing"]) if job.get("timing") else None
    if snapshot and timing:
        graphs.append(snapshot())

    counters, armed = {}, []
    box = os.environ.get("HOTWIRE_MAILBOX")
    if job.get("plugin", True) and box and os.path.exists(box):
        from hotwire.shared.mailbox import HEARTBEAT_S, MailboxView

        time.sleep(2 * HEARTBEAT_S)  # the heartbeat publishes steps and host time
        view = MailboxView.open(box)
        counters, armed = view.counters(), view.armed_layers()
    json.dump({"rounds": rounds, "hotwire": _hotwire_active(), "armed": armed, "counters": counters,
               "graph_counts": graphs, "timing": timing, "op_calls": op_calls}, open(out_path, "w"))


def _count_op_calls() -> dict[str, int]:
    """Count the op's calls from here on, and those that reach its kernel past the dispatcher: the
    plain-call path looks the kernels up by their module names on every call, the dispatcher calls
    the functions it was given at registration, so only direct calls meet the counting wrappers."""
    import torch

    from hotwire.engine_plugin import steer_op

    counts = {"calls": 0, "direct": 0}
    op = torch.ops.hotwire.steer_.default
    call = op._op

    def counted(*args, **kwargs):
        counts["calls"] += 1
        return call(*args, **kwargs)

    def direct(kernel):
        def run(*args, **kwargs):
            counts["direct"] += 1
            return kernel(*args, **kwargs)
        return run

    op._op = counted
    steer_op._steer_torch, steer_op._steer_cuda = direct(steer_op._steer_torch), direct(steer_op._steer_cuda)
    return counts


def _phases(job: dict):
    """The phase reporter (a no-op unless the job asks for ``progress``); announces the start."""
    if not job.get("progress"):
        return lambda text: None
    import torch

    from .progress import engine_mode, mark, watch_engine

    gpu = torch.cuda.is_available()
    mark(f"start ({engine_mode(gpu, job.get('engine', {}).get('enforce_eager', False))})")
    watch_engine(mark)
    return mark


def _timing(generate, t: dict) -> dict[str, list[float]]:
    """Decode ms per step, idle and steered alternating, prefill and call overhead cancelled."""
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(t["vocab"]) for _ in range(16)] for _ in range(t["batch"])]

    def step_ms(spec) -> float:
        times = []
        for n in (8, 8 + t["steps"]):
            batch = [{"prompt_token_ids": p, "max_tokens": n, "spec": spec} for p in prompts]
            start = time.perf_counter()
            generate(batch)
            times.append(time.perf_counter() - start)
        return (times[1] - times[0]) / t["steps"] * 1e3

    if t.get("warmup", True):
        step_ms(None), step_ms(t["spec"])
    out: dict[str, list[float]] = {"idle_ms": [], "steered_ms": []}
    for _ in range(t["rounds"]):
        out["idle_ms"].append(step_ms(None))
        out["steered_ms"].append(step_ms(t["spec"]))
    return out


def _hotwire_active() -> bool:
    from vllm.v1.worker import gpu_model_runner

    return getattr(gpu_model_runner.GPUModelRunner.execute_model, "__hotwire__", False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
