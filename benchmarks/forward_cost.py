"""What one engine's forward costs, by CUDA-graph mode, alone on its device, with or without hotwire.

Why: served side by side under MPS at 256 in flight, each armed layer adds about 0.2 ms to every
step run without a full CUDA graph, steered or not, on the host and in the forward's GPU span
alike, while the op's own calls take a few µs (``docs/performance.md``, "Session 24"). Run alone,
with nothing else on the device, an engine says which of three it is:

* the forward's host time longer (host work, or launches made slower in this process),
* its GPU span longer with the same launches (the kernels differ or run slower),
* or neither (the cost comes from sharing the device, as the served comparison does).

How: one engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), with or without hotwire
(every layer armed; no request steered, or with ``--steered 0.5`` half of them, each its own spec,
as served), the served benchmark's engine arguments and load shape
(``serving.engine_args``: 128-token prompts, 64-192 new tokens, ``--max-seqs`` in flight, so the
batch mixes arrivals and decodes as a served one does). Measured:

1. ``phases``: the engine's step phases over ``--requests`` requests after a warm-up batch
   (``bench_site/step_phases.py``: the forward's host time and GPU span per mode, per step);
2. ``profile``: one step of ``--profile-tokens`` prompt tokens (PIECEWISE on an H100 at 2048), then
   a short served-shape load, under torch's profiler: each CUDA runtime call, kernel and host op,
   with its count and total µs;
3. ``python``: a served-shape load of ``--cprofile`` requests under cProfile: the Python functions
   that take the most time of their own (calls, own ms, cumulative ms), and what the first of
   them call;
4. ``triton_launches`` and ``pointer_check_us``: on CUDA, Triton's launches during a load after
   the timed one, kernel by kernel, the launcher apart (``triton_launches.py``), and the driver's
   pointer check on the tensors the most launched kernels were last given;
5. ``host_state``: what the interpreter runs with after the load and inside a forward (trace and
   profile functions, Dynamo's frame callback, torch modes, threads, the heap: ``host_state.py``);
6. ``us_per_call``: a small torch launch, a small Triton launch, an allocation,
   ``torch.cuda.current_device`` and a few lines of plain Python, timed in a loop in this process:
   a process that launches (or interprets) more slowly shows here.

``BENCH_OP_OFF`` (``bench_site/op_off.py``) applies here as in a served run.

Run it alternating, ``--plugin`` and not, and compare the JSON files (``--compare A.json B.json``
prints the differences: phases per mode, and the runtime calls and kernels whose counts differ).

    python3 benchmarks/forward_cost.py --model DIR --dummy [--plugin] --out OUT.json
    python3 benchmarks/forward_cost.py --compare FREE.json ARMED.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT_LEN, MAX_TOKENS = 128, 128  # as serve_throughput.py's load


def _triton_add(x):
    """A call that launches a one-block Triton kernel adding 1 to ``x`` (its first 1024 elements)."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(ptr + offs, tl.load(ptr + offs, mask=mask) + 1.0, mask=mask)

    return lambda: add_one[(1,)](x, x.numel(), BLOCK=1024)


def _python_lines() -> int:
    """A few lines of plain Python: attribute and dict lookups, a small loop."""
    d, total = {"a": 1, "b": 2}, 0
    for i in range(20):
        total += d.get("a", i) + len(d)
    return total


def _python_calls() -> int:
    """Three nested calls of plain Python functions: what a frame costs to enter."""
    return _call_a(1)


def _call_a(x: int) -> int:
    return _call_b(x) + 1


def _call_b(x: int) -> int:
    return x * 2


def _prompts(n: int, vocab: int, length: int, seed: int) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(10, vocab - 10, length).tolist()} for _ in range(n)]


def _load(llm, n: int, vocab: int, seed: int, steered: float = 0.0, layers: tuple[int, int] = (0, 0)) -> None:
    """``n`` served-shape requests through the engine at once (it admits ``max_num_seqs`` at a time);
    every ``1/steered``-th one steered by a two-entry spec of its own on ``layers``, as the served
    load steers (``serving.steer_spec``)."""
    import numpy as np
    from serving import SPEC_KEY, steer_spec, steered_at
    from vllm import SamplingParams

    lengths = np.random.default_rng(seed).integers(MAX_TOKENS // 2, MAX_TOKENS + MAX_TOKENS // 2 + 1, n)
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True, temperature=0,
                             extra_args={SPEC_KEY: json.dumps(steer_spec(k, layers))}
                             if steered_at(k, steered) else None)
              for k, m in enumerate(lengths)]
    llm.generate(_prompts(n, vocab, PROMPT_LEN, seed), params, use_tqdm=False)


def _profile(llm, tokens: int, vocab: int) -> dict:
    """One step of ``tokens`` prompt tokens, then a short served-shape load, under torch's
    profiler: per CUDA runtime call, per kernel and per torch op on the host, ``[count, total µs]``
    (kernels: device time; ops: their own host time)."""
    import torch
    from vllm import SamplingParams

    prompts = _prompts(max(1, tokens // PROMPT_LEN), vocab, PROMPT_LEN, seed=11)
    params = SamplingParams(max_tokens=1, temperature=0)
    llm.generate(prompts, params, use_tqdm=False)  # the same shapes once before, outside the profile
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        llm.generate(prompts, params, use_tqdm=False)
        _load(llm, 64, vocab, seed=3)
    runtime, kernels, ops = {}, {}, {}
    for e in prof.key_averages():
        device = getattr(e, "device_type", None)
        if device is not None and device.name == "CUDA":
            kernels[e.key] = [e.count, round(getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)), 1)]
        elif e.key.startswith(("cuda", "cu")) and not e.key.startswith("cudnn"):
            runtime[e.key] = [e.count, round(e.cpu_time_total, 1)]
        else:
            ops[e.key] = [e.count, round(e.self_cpu_time_total, 1)]
    return {"tokens": len(prompts) * PROMPT_LEN, "runtime": runtime, "kernels": kernels, "ops": ops}


def _name(func: tuple) -> str:
    f, line, name = func
    return f"{Path(f).name}:{line}({name})"


def _cprofile(llm, requests: int, vocab: int, top: int = 80, callees_of: int = 12) -> dict:
    """A served-shape load of ``requests`` requests under cProfile: the ``top`` functions by own
    time, ``{"file:line(name)": [calls, own ms, cumulative ms]}``, and for the ``callees_of`` first
    of them what they call, with the same three figures for the calls from there."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    _load(llm, requests, vocab, seed=4)
    prof.disable()
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    callees: dict[str, dict[str, list]] = {}
    heads = {func: _name(func) for func, _ in rows[:callees_of]}
    for func, (*_, callers) in stats.items():
        for caller, (_, nc, tt, ct) in callers.items():
            if caller in heads:
                callees.setdefault(heads[caller], {})[_name(func)] = [nc, round(tt * 1e3, 2), round(ct * 1e3, 2)]
    return {"requests": requests,
            "functions": {_name(func): [nc, round(tt * 1e3, 2), round(ct * 1e3, 2)] for func, (_, nc, tt, ct, _) in rows},
            "callees": callees}


def _launch_timers():
    """Triton's launches timed, kernel by kernel, from now on (None where they cannot be)."""
    import triton_launches

    try:
        timers = triton_launches.install()
    except (ImportError, AttributeError) as e:
        print(f"Triton's launches are not timed: {e!r}", file=sys.stderr)
        return None
    timers.on = True
    return timers


def _pointer_checks(timers) -> dict[str, float]:
    """The driver's pointer check on the last tensors the most launched kernels were given, and on
    a fresh allocation for comparison."""
    import torch
    import triton_launches

    tensors = {"fresh_allocation": torch.empty(4096, device="cuda"), **timers.pointers()}
    try:
        return triton_launches.pointer_check_us(tensors)
    except (OSError, AttributeError) as e:
        return {"error": repr(e)}


def measure(args) -> dict:
    phases_dir = Path(tempfile.mkdtemp(prefix="forward-cost-"))
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_PLUGINS="hotwire" if args.plugin else "none",
                      BENCH_PHASES_DIR=str(phases_dir))
    os.environ.setdefault("HOTWIRE_LAYERS", "all")
    sys.path[:0] = [str(HERE / "bench_site"), str(HERE)]
    import host_state
    import step_phases
    from serving import write_vectors

    from hotwire.tools.tiny_model import steered_layers

    shape = json.loads((Path(args.model) / "config.json").read_text())
    layers = steered_layers(shape["num_hidden_layers"])
    if args.steered:
        os.environ["HOTWIRE_VECTORS"] = str(write_vectors(phases_dir / "vectors", shape["hidden_size"]))

    step_phases.install()  # before vLLM's engine core is imported
    if args.plugin and os.environ.get("BENCH_OP_OFF"):
        import op_off  # noqa: F401
    import torch
    from serving import engine_args
    from vllm import LLM

    cuda = torch.cuda.is_available()
    engine = engine_args(shape, not cuda, args.max_seqs, PROMPT_LEN, MAX_TOKENS, 0.3)
    engine.update(model=args.model, seed=0, skip_tokenizer_init=True, max_num_batched_tokens=args.max_batched_tokens)
    if not args.dummy:
        engine.pop("load_format", None)
    if args.compile:
        engine.pop("enforce_eager", None)
    llm = LLM(**engine)
    vocab = shape["vocab_size"]
    _load(llm, args.max_seqs, vocab, seed=1, steered=args.steered, layers=layers)  # warm-up: every graph size
    if cuda:
        torch.cuda.synchronize()
    step_phases.read_events()
    first = step_phases.snapshot()
    _load(llm, args.requests, vocab, seed=2, steered=args.steered, layers=layers)
    if cuda:
        torch.cuda.synchronize()
    step_phases.read_events()
    last = step_phases.snapshot()
    timers = _launch_timers() if cuda else None
    if timers is not None:  # on a load of its own: the timed one above stays as deployed
        # torch.cuda.current_device (Triton asks for it at every launch) is its Python (a lazy-init
        # check: two C calls and a thread-local lookup) and a C call: timed together and apart
        in_forward, undo = host_state.in_forward("kernel_unified_attention", {
            "python_lines": _python_lines, "current_device": torch.cuda.current_device,
            "lazy_init": torch.cuda._lazy_init, "cuda_get_device": torch._C._cuda_getDevice,
            "is_initialized": torch.cuda.is_initialized, "in_bad_fork": torch._C._cuda_isInBadFork,
            "tls_hasattr": lambda: hasattr(torch.cuda._tls, "is_initializing"),
            "python_calls": _python_calls,
            "current_raw_stream": lambda: torch._C._cuda_getCurrentRawStream(0),
            "alloc_free": lambda: torch.empty(4096, device="cuda")})
        _load(llm, args.max_seqs, vocab, seed=5)
        timers.on = False
        undo()
    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "plugin": args.plugin,
              "steered": args.steered,
              "device": torch.cuda.get_device_name() if cuda else "cpu", "engine": engine,
              "phases": step_phases.per_step(first, last),
              "host_state": {"after_load": host_state.snapshot()}}
    if args.plugin:  # in this process: what the engine admitted and refused (steered_requests, unsteered_*)
        from hotwire.engine_plugin.counters import process_counters

        result["hotwire_counts"] = dict(process_counters().counts)
    if timers is not None:
        result["triton_launches"] = timers.report()
        result["host_state"]["in_forward"] = in_forward
        result["pointer_check_us"] = _pointer_checks(timers)
    if cuda:
        result["profile"] = _profile(llm, args.profile_tokens, vocab)
    if args.cprofile:
        result["python"] = _cprofile(llm, args.cprofile, vocab)
    device = torch.device("cuda" if cuda else "cpu")
    x = torch.ones(1024, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timings = {}
    with torch.inference_mode():
        for name, fn in (("elementwise_launch", lambda: x.add_(1.0)),
                         ("alloc_free", lambda: torch.empty(4096, device=device))):
            sync()
            timings[name] = host_state.per_call_us(fn, args.repeat)
            sync()
        if cuda:
            timings["current_device"] = host_state.per_call_us(torch.cuda.current_device, args.repeat)
            timings["triton_launch"] = host_state.per_call_us(_triton_add(x), args.repeat)
        timings["python_lines"] = host_state.per_call_us(_python_lines, args.repeat)
    result["us_per_call"] = timings
    return result


def compare(a: dict, b: dict) -> dict:
    """What differs between two runs (``b`` beside ``a``): every phase's µs and calls per step,
    the small timings, Triton's launches and pointer checks where both runs have them, and from
    the profiles the runtime calls, kernels and host ops whose counts differ, the 25 whose time
    differs most, and the cProfile functions whose own time differs most."""
    pa, pb = a["phases"]["phases"], b["phases"]["phases"]
    phases = {name: {"a_us": pa.get(name, {}).get("wall_us"), "b_us": pb.get(name, {}).get("wall_us"),
                     "a_calls": pa.get(name, {}).get("calls"), "b_calls": pb.get(name, {}).get("calls")}
              for name in sorted(set(pa) | set(pb))}
    out = {"step_ms": [a["phases"]["step_ms"], b["phases"]["step_ms"]], "phases": phases,
           "us_per_call": [a.get("us_per_call"), b.get("us_per_call")]}
    for part in ("triton_launches", "pointer_check_us", "host_state"):
        if part in a or part in b:
            ka, kb = a.get(part, {}), b.get(part, {})
            out[part] = {k: [ka.get(k), kb.get(k)] for k in sorted(set(ka) | set(kb))}
    if "profile" in a and "profile" in b:
        for part in ("runtime", "kernels", "ops"):
            ra, rb = a["profile"].get(part, {}), b["profile"].get(part, {})
            out[f"{part}_differing"] = {k: [ra.get(k), rb.get(k)] for k in sorted(set(ra) | set(rb))
                                        if (ra.get(k) or [0])[0] != (rb.get(k) or [0])[0]}
            us = lambda r, k: (r.get(k) or [0, 0])[1]  # noqa: E731
            out[f"{part}_by_time"] = {k: [ra.get(k), rb.get(k)] for k in sorted(
                set(ra) | set(rb), key=lambda k: -abs(us(rb, k) - us(ra, k)))[:25]}
            out[f"{part}_us"] = [round(sum(v[1] for v in ra.values()), 1), round(sum(v[1] for v in rb.values()), 1)]
    if "python" in a and "python" in b:
        fa, fb = a["python"]["functions"], b["python"]["functions"]
        own = {k: [fa.get(k), fb.get(k)] for k in set(fa) | set(fb)}
        gain = lambda k: (own[k][1] or [0, 0])[1] - (own[k][0] or [0, 0])[1]  # noqa: E731
        out["python_own_ms_differing"] = {k: own[k] for k in sorted(own, key=lambda k: -abs(gain(k)))[:25]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a model folder (config.json)")
    ap.add_argument("--dummy", action="store_true", help="random weights (load_format=dummy)")
    ap.add_argument("--plugin", action="store_true", help="load hotwire, every layer armed")
    ap.add_argument("--steered", type=float, default=0.0, metavar="FRACTION",
                    help="this fraction of the requests (warm-up and timed) sent a spec of its own, as the served "
                         "load (0.5); a plugin-free engine is sent the same requests and ignores the specs")
    ap.add_argument("--max-seqs", type=int, default=256, help="requests in flight (served: 256)")
    ap.add_argument("--requests", type=int, default=1024, help="requests in the timed load")
    ap.add_argument("--max-batched-tokens", type=int, default=8192, help="as vllm serve's default on a GPU")
    ap.add_argument("--profile-tokens", type=int, default=2048, help="prompt tokens of the profiled step")
    ap.add_argument("--compile", action="store_true", help="on a CPU: torch.compile the model (default there: eager)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="REQUESTS",
                    help="also run a load of that many requests under cProfile")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="print what differs between two outputs")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        print(json.dumps(compare(a, b), indent=1))
        return
    if not (args.model and args.out):
        ap.error("--model and --out are needed to measure")
    if not 0 <= args.steered <= 1:
        ap.error("--steered is a fraction of the requests, 0 to 1")
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("plugin", "device", "us_per_call")}, indent=1))
    phases = result["phases"]
    print(f"{phases['steps']} steps, {phases['step_ms']} ms a step, tokens per step {phases['per_step']}")
    for name, p in phases["phases"].items():
        per_call = p["wall_us"] / p["calls"] if p["calls"] else 0.0
        print(f"  {name:26s} {p['wall_us']:10.1f} µs a step [CPU {p['cpu_us']:9.1f}], {p['calls']:6.3f} calls a step,"
              f" {per_call:10.1f} µs a call")


if __name__ == "__main__":
    main()
