"""``hotwire verify --model PATH``: does steering work on this box, with this model?

Runs two real engines, each in its own process, over the same work: a plugin-free one and one
with hotwire loaded. One batch where only request 0 is steered with a throwaway vector (a unit
vector toward one output token, at the last layer), then idle vs all-steered decode timing.
Checks that hotwire armed the model, that steering fires, that every batchmate is bit-identical
to the plugin-free run, and that the armed engine captured its CUDA graphs once and compiled
exactly what the plugin-free engine compiled. Prints a report block to paste into an issue
(``--json`` writes the same fields) on stdout; each phase (each engine's start, compile, capture,
run and timing, then the comparison) is printed on stderr as it starts (:mod:`.progress`). The
engines' files, their private vLLM compile cache included, live in a temporary directory removed
at the end.

The plan, with its decode steps and a time estimate, is printed first; ``--quick`` checks the
same with a smaller batch and one short timing round. Stopped
by SIGTERM, SIGHUP or Ctrl-C, it stops its engine and removes its directory
(:mod:`.signals`).

Exit status: 0 all checks pass; 3 hotwire armed nothing (an architecture it cannot steer) and
the engine served every request exactly like the plugin-free one; 1 anything else; 128 + the
signal's number when stopped by one. (Not 2: argparse exits 2 on a usage error.)
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .progress import MARK, Progress
from .signals import exit_on_signals

NOT_ARMED = 3
BATCH_TOKENS = 16  # greedy tokens per request of the checked batch (probe_batch)
TIMED_PREFIX = 8  # tokens of the shorter call of each timed pair (jobs._timing)


@dataclass(frozen=True)
class Plan:
    """How much verify runs per engine: the checked batch's size, then the timing rounds (each an
    idle and an all-steered measurement of ``steps`` decode steps), after a warm-up pair or not."""

    batch: int
    steps: int
    rounds: int
    warmup: bool

    def timed_calls(self) -> int:
        """Measurements of decode step time per engine (each is two ``generate`` calls)."""
        return 2 * self.rounds + (2 if self.warmup else 0)

    def decode_steps(self) -> int:
        """Decode steps per engine: the checked batch's, then every timed pair's."""
        return BATCH_TOKENS + self.timed_calls() * (2 * TIMED_PREFIX + self.steps)


FULL = Plan(batch=8, steps=64, rounds=3, warmup=True)
QUICK = Plan(batch=4, steps=16, rounds=1, warmup=True)  # the warm-up takes one-time costs out
# Reduction configs chosen by rule, not by timing at first use: two plugin-free engines that time
# them may already differ by a rounding step (benchmarks/determinism.py), which a comparison of a
# hotwire engine with a plugin-free one would read as the plugin's doing.
STABLE_INDUCTOR = {"TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS": "1"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local model directory (weights or config.json + --dummy)")
    parser.add_argument("--dummy", action="store_true", help="random weights (load_format=dummy): config only")
    parser.add_argument("--scale", type=float, default=64.0, help="steering scale of the throwaway vector")
    parser.add_argument("--quick", action="store_true",
                        help=f"the same checks, shorter timing: batch {QUICK.batch}, one timing round of "
                             f"{QUICK.steps} decode steps after a warm-up (default: batch {FULL.batch}, "
                             f"{FULL.rounds} rounds of {FULL.steps})")
    parser.add_argument("--batch", type=int,
                        help=f"requests in the checked batch, request 0 steered (default {FULL.batch}; "
                             f"--quick {QUICK.batch})")
    parser.add_argument("--eager", action="store_true",
                        help="enforce_eager on a GPU: no torch.compile, no CUDA graphs (faster to start; "
                             "checks less). On CPU the engines always run eager")
    parser.add_argument("--timing-steps", type=int,
                        help=f"decode steps per timed call (default {FULL.steps}; --quick {QUICK.steps})")
    parser.add_argument("--quantization", help="vLLM quantization method, e.g. fp8 (online FP8 of a bf16 model)")
    parser.add_argument("--attention-backend", help="vLLM attention backend, e.g. TRITON_ATTN (default: vLLM's)")
    parser.add_argument("--engine-args", type=json.loads, default={},
                        help="more LLM(...) keyword arguments as a JSON object, applied last "
                             '(e.g. \'{"gpu_memory_utilization": 0.08}\' when engines share a GPU)')
    parser.add_argument("--json", type=Path, help="also write the report's fields to this JSON file")
    parser.set_defaults(run=run)


def _direction(model_dir: Path, hidden: int, token: int) -> np.ndarray:
    """Unit unembedding row of ``token`` when the weights are readable, else a seeded random unit."""
    from .demo import token_direction

    row = token_direction(model_dir, token)
    if row is not None:
        return row
    v = np.random.default_rng(0).standard_normal(hidden)
    return v / np.linalg.norm(v)


def run_job(work: Path, name: str, job: dict, env: dict[str, str],
            progress: Progress | None = None) -> tuple[dict, list[str]]:
    """One engine process: its JSON output and the plugin's own log lines (``hotwire: ...``).
    With ``progress``, the engine's phases are printed as they start."""
    (work / f"{name}.json").write_text(json.dumps({**job, "progress": progress is not None}))
    proc = subprocess.Popen([sys.executable, "-m", "hotwire.tools.jobs", str(work / f"{name}.json"),
                             str(work / f"{name}.out.json")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    kept = []
    try:
        for line in proc.stdout:
            if line.startswith(MARK):
                if progress is not None:
                    progress.phase(f"{name} engine: {line[len(MARK):].strip()}")
            else:
                kept.append(line)
        returncode = proc.wait()
    finally:
        _stop(proc)
    log = "".join(kept)
    if returncode != 0:
        sys.stderr.write(log[-9000:])
        last = next((line for line in reversed(log.splitlines()) if line.strip()), "")
        raise SystemExit(f"hotwire verify: the {name} engine failed (exit {returncode}): {last.strip()}")
    lines = [line[line.index("hotwire:"):] for line in log.splitlines() if "hotwire:" in line]
    return json.loads((work / f"{name}.out.json").read_text()), lines


def _stop(proc: subprocess.Popen) -> None:
    """End an engine process verify is leaving (stopped, or failed): SIGTERM, SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.stdout.close()


def probe_engine(batch: int, *, dummy: bool, eager: bool) -> dict:
    """The ``LLM(...)`` arguments verify runs its engines with (more are applied on top)."""
    return dict(max_model_len=512, max_num_seqs=max(8, batch), seed=0, skip_tokenizer_init=True,
                enforce_eager=eager, **({"load_format": "dummy"} if dummy else {}))


def probe_batch(vocab: int, n: int, spec: dict | None = None) -> list[dict]:
    """Verify's batch: ``n`` seeded random 24-token prompts, :data:`BATCH_TOKENS` greedy tokens
    with logprobs; ``spec`` (if any) steers request 0 only."""
    rng = np.random.default_rng(1)
    return [{"prompt_token_ids": rng.integers(0, vocab, 24).tolist(), "max_tokens": BATCH_TOKENS, "logprobs": 0,
             "spec": spec if i == 0 else None} for i in range(n)]


def differences(got: list[dict], want: list[dict]) -> dict:
    """How requests differ from the plugin-free run: in tokens, or only in logprobs (and by how much)."""
    tokens = sum(g["tokens"] != w["tokens"] for g, w in zip(got, want))
    same = [(g, w) for g, w in zip(got, want) if g["tokens"] == w["tokens"]]
    lp = [(g["logprobs"] or [], w["logprobs"] or []) for g, w in same if g["logprobs"] != w["logprobs"]]
    gap = max((abs(a - b) for x, y in lp for a, b in zip(x, y)), default=0.0)
    return {"requests": len(got), "tokens_differ": tokens, "logprobs_only_differ": len(lp),
            "max_logprob_diff": gap}


def _diff_text(d: dict) -> str:
    return (f"DIFFER from the plugin-free run: tokens in {d['tokens_differ']} of {d['requests']} requests, "
            f"logprobs only in {d['logprobs_only_differ']} (max |diff| {d['max_logprob_diff']:.2g})")


def _graphs(armed: list[dict], free: list[dict], no_graphs: bool) -> dict:
    """CUDA-graph captures and dynamo compiles, after warm-up, the round and the timing rounds.

    Passes when the armed engine counts exactly what the plugin-free engine counts at every
    point (vLLM may compile a shape range lazily, with or without the plugin), not counting its
    graphs without the op (one per graph or none: ``HOTWIRE_IDLE_GRAPHS``), and never captures
    again after start; with graphs on (not ``no_graphs``: eager, or CPU), it must have captured some.
    """
    captures = armed[0]["captures"]
    unchanged = all(c["captures"] == captures and c["idle_captures"] == armed[0]["idle_captures"] for c in armed)
    idle_ok = all(c["idle_captures"] in (0, c["captures"]) for c in armed)
    same = [{**c, "idle_captures": 0} for c in armed] == free and idle_ok
    return {"captures": captures, "unchanged": unchanged, "compiles": [c["compiles"] for c in armed],
            "equal_plugin_free": same, "ok": same and unchanged and (no_graphs or captures > 0)}


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan ``--quick`` picks, with ``--batch`` and ``--timing-steps`` over it."""
    base = QUICK if args.quick else FULL
    return Plan(batch=base.batch if args.batch is None else args.batch,
                steps=base.steps if args.timing_steps is None else args.timing_steps,
                rounds=base.rounds, warmup=base.warmup)


def estimate(plan: Plan, gpu: bool) -> str:
    """The plan and roughly how long it takes, printed before anything starts."""
    where = ("on a GPU an engine's start includes its torch.compile and CUDA-graph capture, "
             "about 1-2 min" if gpu else
             "on CPU an engine starts in 10-40 s and a decode step of a small model takes 0.05-1 s "
             "(SmolLM2-135M on 2 cores shared with other jobs: 6-7 min with --quick, over 10 min "
             "without)")
    return (f"plan: 2 engines in turn (plugin-free, then hotwire), each: start, a batch of "
            f"{plan.batch} requests, {plan.timed_calls()} timed calls; {plan.decode_steps()} decode "
            f"steps per engine; {where}")


def run(args: argparse.Namespace) -> int:
    progress = Progress("hotwire verify")
    progress.phase(f"read {args.model}, make the test vector")
    # The engines' files (job files, vectors, mailbox, a private vLLM compile cache) go with it,
    # also when a signal stops verify.
    with exit_on_signals(), tempfile.TemporaryDirectory(prefix="hotwire-verify-",
                                                        ignore_cleanup_errors=True) as work:
        return _verify(args, Path(work), progress)


def _verify(args: argparse.Namespace, work: Path, progress: Progress) -> int:
    import torch
    from transformers import AutoConfig

    from hotwire.shared.wire import encode_safetensors

    model_dir = Path(args.model)
    cfg = AutoConfig.from_pretrained(str(model_dir))
    text = cfg.get_text_config()
    n_layers, hidden, vocab = text.num_hidden_layers, text.hidden_size, text.vocab_size
    (work / "vectors").mkdir()
    token = 1000 % vocab
    (work / "vectors" / "verify.safetensors").write_bytes(
        encode_safetensors(_direction(model_dir, hidden, token).astype(np.float32)))
    gpu = torch.cuda.is_available()
    plan = plan_of(args)
    progress.phase(estimate(plan, gpu))
    engine = probe_engine(plan.batch, dummy=args.dummy, eager=args.eager or not gpu)
    if not gpu:
        engine.update(dtype="float32", kv_cache_memory_bytes=256 * 2**20)
    if args.quantization:
        engine["quantization"] = args.quantization
    if args.attention_backend:
        engine["attention_backend"] = args.attention_backend
    engine.update(args.engine_args)
    spec = {"id": "verify", "layer": n_layers - 1, "scale": args.scale}
    batch = probe_batch(vocab, plan.batch, spec)
    # A private vLLM cache: both engines compile cold, so their compile counts compare (an engine
    # loading an earlier run's compiled artifact would count none). The environment may override
    # STABLE_INDUCTOR.
    env = {**STABLE_INDUCTOR, **os.environ,
           "HOTWIRE_VECTORS": str(work / "vectors"), "HOTWIRE_MAILBOX": str(work / "engine.mbx"),
           "VLLM_CACHE_ROOT": str(work / "vllm-cache"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    job = {"model": str(model_dir), "engine": engine, "rounds": [batch], "graph_counts": True,
           "timing": {"batch": plan.batch, "steps": plan.steps, "rounds": plan.rounds,
                      "warmup": plan.warmup, "vocab": vocab, "spec": spec}}
    started = progress.elapsed()
    free, _ = run_job(work, "plugin-free", {**job, "plugin": False}, env, progress)
    progress.phase(f"the plugin-free engine took {progress.elapsed() - started:.0f} s; the hotwire "
                   "engine runs the same")
    armed, log = run_job(work, "hotwire", {**job, "plugin": True}, env, progress)
    progress.phase("compare the hotwire engine with the plugin-free one")
    got, want = armed["rounds"][0], free["rounds"][0]
    loaded = armed["hotwire"] and not free["hotwire"]
    is_armed = bool(armed["armed"])
    fires = got[0]["tokens"] != want[0]["tokens"]
    exact = all(g == w for g, w in zip(got[1:], want[1:]))
    diff = differences(got[1:] if is_armed else got, want[1:] if is_armed else want)
    graphs = _graphs(armed["graph_counts"], free["graph_counts"], engine["enforce_eager"] or not gpu)
    ms = {"plugin_free": statistics.median(free["timing"]["idle_ms"]),
          **{k.removesuffix("_ms"): statistics.median(v) for k, v in armed["timing"].items()}}
    if is_armed:
        ok = loaded and fires and exact and graphs["ok"]
        status = 0 if ok else 1
    else:
        ok = loaded and got == want and graphs["ok"]
        status = NOT_ARMED if ok else 1
    import vllm

    report = {
        "model": str(model_dir), "architecture": cfg.architectures[0] if cfg.architectures else cfg.model_type,
        "layers": n_layers, "hidden": hidden,
        "device": torch.cuda.get_device_name(0) if gpu else platform.processor() or "cpu",
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "mode": "eager" if engine["enforce_eager"] else "torch.compile + CUDA graphs" if gpu else "torch.compile",
        "quantization": args.quantization, "attention_backend": args.attention_backend,
        "plugin_loaded": loaded, "armed": is_armed, "armed_layers": len(armed["armed"]),
        "fires": fires if is_armed else None, "batchmates_exact": exact, "all_exact": got == want, "diff": diff,
        "graphs": graphs, "ms": ms, "timing_rounds": plan.rounds, "spec": spec, "log": log,
        "status": {0: "pass", NOT_ARMED: "not armed", 1: "fail"}[status], "pass": status == 0,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(_text(report, plan.batch, cpu=not gpu), flush=True)
    progress.phase(f"done: {report['status']}")
    return status


def _text(r: dict, batch: int, cpu: bool) -> str:
    g = r["graphs"]
    if r["armed"]:
        armed = f"{r['armed_layers']}/{r['layers']} decoder layers"
        steering = "fires" if r["fires"] else "did NOT change tokens (try a larger --scale)"
        steering += f"  ({json.dumps(r['spec'])})"
        mates = (f"{batch - 1} unsteered requests bit-identical to a plugin-free run" if r["batchmates_exact"]
                 else _diff_text(r["diff"]))
    else:
        armed = "not armed (engine serves unsteered): " + next(iter(r["log"]), "no hotwire log line")
        steering = "n/a (not armed)"
        mates = (f"all {batch} requests bit-identical to a plugin-free run" if r["all_exact"]
                 else _diff_text(r["diff"]))
    if r["mode"] != "torch.compile + CUDA graphs":
        graphs = f"none ({'CPU' if cpu else '--eager'}: no CUDA graphs)"
    else:
        graphs = (f"{g['captures']} CUDA graphs captured at start, "
                  f"{'unchanged' if g['unchanged'] else 'CHANGED'} through the steered rounds")
    graphs += f"; dynamo compiles {g['compiles']}; "
    graphs += "all counts = plugin-free" if g["equal_plugin_free"] else "counts DIFFER from plugin-free"
    ms = r["ms"]
    rounds = f"medians of {r['timing_rounds']}" if r["timing_rounds"] > 1 else "one round"
    mode = ", ".join([r["mode"]] + [f"{label} {r[k]}" for k, label in (("quantization", "quantization"),
                                                                       ("attention_backend", "attention")) if r[k]])
    return f"""
hotwire verify ------------------------------------------------------------
model        {r['model']} ({r['architecture']}, {r['layers']} layers, hidden {r['hidden']})
device       {r['device']}
versions     vllm {r['versions']['vllm']}, torch {r['versions']['torch']}, python {r['versions']['python']}
mode         {mode}
plugin       {'loaded' if r['plugin_loaded'] else 'NOT loaded as expected'}
armed        {armed}
steering     {steering}
batchmates   {mates}
graphs       {graphs}
decode step  plugin-free {ms['plugin_free']:.3f} ms, idle {ms['idle']:.3f} ms, all {batch} steered \
{ms['steered']:.3f} ms (wall clock, {rounds})
result       {r['status'].upper()}
---------------------------------------------------------------------------"""
