"""GPU kernel time per decode step: plugin-free vs idle vs all-steered (vs eager), one engine per process.

Why: ``benchmarks/decode.py`` times ``llm.generate`` on the wall clock, across engine instances in
one process; on the H200 its samples scatter by 20-30 %, far above the targets (idle/plugin-free
<= 1.005, all-steered/idle <= 1.01). Here the number compared is what the GPU itself spends:
the sum of the durations of the device kernels recorded by ``torch.profiler`` (CUPTI) per decode
step, which host noise does not reach. Wall time per step is recorded beside it, for reference.

How:
* Each engine runs in its own process (this file re-run with ``--child``), so the plugin-free
  engine never shares a process with a patched one: ``plugin_free`` (``VLLM_PLUGINS=none``),
  ``hotwire`` (armed on every layer, 256 startup vectors), measuring ``idle`` (no request
  steered: the engine replays its graphs captured without the op) and ``steered`` (every request
  its own two vectors and scales, on layers n/3 and 2n/3) side by side in the same engine;
  ``hotwire_op_graphs``, the same with ``HOTWIRE_IDLE_GRAPHS=0`` (one graph per shape, the op in
  it: what the graphs without the op gain; its capture time and memory are beside the
  ``hotwire`` process's in ``idle_graphs``); ``hotwire_switched``, the same with
  ``HOTWIRE_GRAPH_SWITCH=1`` (the op's kernels in the graphs of steered steps switched to the
  layers the requests steer, :mod:`hotwire.engine_plugin.graph_switch`: what that gains);
  ``hotwire_switched_one_graph``, the switch with ``HOTWIRE_IDLE_GRAPHS=0`` (an idle step replays
  the steered graph with every op node off: whether the graphs without the op are still needed);
  ``hotwire_2``, the same armed on those two layers only (``HOTWIRE_LAYERS``: the op costs one
  launch per armed layer); ``hotwire_modes``, armed on those
  two layers with ``HOTWIRE_PROJECTION_LAYERS`` (the op reads the residual there), measuring idle,
  the same two entries as adds, and as each projecting mode (each mode / add is the interventions
  target, <= 1.01); and, if asked for, ``eager`` (steered with
  ``enforce_eager=True``: what hook-style steering pays). ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  keeps the engine core and worker in the child, where the profiler sees them. Processes are
  started A B A B ... (``--repeats``), ``--parallel`` at a time: start-ups (compile, capture)
  overlap, measurements take a file lock and run alone on the GPU. Reported: medians, and the
  median of per-repeat ratios.
* Decode, per batch size B (32-token random prompts, ``ignore_eos``, greedy): one profiled
  warm-up call; two unprofiled calls of N1 = 8 and N1 + S tokens (wall time); the same two
  calls profiled. Per-step figures are (long - short) / S: the prefill step, the first decode
  steps and the per-call overhead are identical in both calls and cancel exactly (prefix
  caching is off and ``max_num_batched_tokens`` >= 32 B, so all prompts prefill in one step and
  the batch then decodes in lockstep). The same difference is taken per kernel name, and the
  names whose time differs most from plugin-free are listed: the op's own kernel, any kernel
  the plugin changed, and whether the launch count per step changed.
* Prefill, per prompt length P (default 4096 and 8192): one request of P tokens and one output
  token, a single step; its kernel time and wall-clock tokens/s, steered vs idle vs plugin-free.
* Shapes: Qwen3 0.6B/4B/8B configs (``write_config``) with ``load_format="dummy"``, bf16,
  ``TRITON_ATTN``, torch.compile and vLLM's default CUDA-graph mode (FULL graphs for uniform
  decode batches); graphs are captured for exactly the measured batch sizes. ``--smoke`` runs
  the tiny random model on CPU (fp32, eager) with CPU activity, where "kernel time" is the
  ops' self CPU time: it checks the script end to end, its numbers mean nothing.

CUDA graphs and CUPTI: recent CUDA reports the kernels inside graph replays as ordinary kernel
activity. The profiler is attached only after capture (no CUPTI warm-up before capture: on some
stacks that leaves kernel collection off for the life of the process). A device run must
confirm this: the child refuses to report when a profile holds no device kernels, and flags a
decode row whose step shows fewer kernels than the model has layers (replays not seen). The
sum of kernel durations counts neither launch gaps nor overlap between streams; clocks are not
locked, so compare conditions, not runs on different days. Host-side cost of the plugin is
measured by ``benchmarks/host_overhead.py``.

    python benchmarks/kernel_time.py --shape qwen3-0.6b --processes plugin_free hotwire eager \\
        --out benchmarks/results/h200-DATE-kernel-time-qwen3-0.6b.json
    python benchmarks/kernel_time.py --smoke --out /tmp/kt-smoke.json     # CPU, end to end only
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
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from hotwire.tools.tiny_model import benchmark_model, steered_layers

PROMPT_LEN, N1, N_VECTORS = 32, 8, 256
PROCESSES = {  # process kind: (plugin loaded, enforce_eager, conditions measured in it)
    "plugin_free": (False, False, ("plugin_free",)),
    "hotwire": (True, False, ("idle", "steered")),
    "hotwire_op_graphs": (True, False, ("idle_g", "steered_g")),  # HOTWIRE_IDLE_GRAPHS=0
    "hotwire_switched": (True, False, ("idle_s", "steered_s")),  # HOTWIRE_GRAPH_SWITCH=1
    # the switch and one graph set: an idle step replays the steered graph with every op node off
    "hotwire_switched_one_graph": (True, False, ("idle_so", "steered_so")),
    "hotwire_2": (True, False, ("idle_2", "steered_2")),  # armed on the two steered layers only
    # the same two layers, reading the stream (HOTWIRE_PROJECTION_LAYERS): each mode steered
    "hotwire_modes": (True, False, ("idle_m", "add_m", "norm_m", "ablate_m", "clamp_m")),
    "eager": (True, True, ("eager",)),
}
# (base, compared) conditions of one engine: idle vs steered, and each mode vs add
PAIRS = (("idle", "steered"), ("idle_g", "steered_g"), ("idle_s", "steered_s"), ("idle_so", "steered_so"),
         ("idle_2", "steered_2"),
         ("idle_m", "add_m"), ("add_m", "norm_m"), ("add_m", "ablate_m"), ("add_m", "clamp_m"))
MODES = {"norm_m": {"mode": "norm", "scale": 0.05}, "ablate_m": {"mode": "ablate", "scale": 1.0},
         "clamp_m": {"mode": "clamp", "lo": -0.5, "hi": 0.5}}  # each entry's mode, by condition
STEERED = {steered for _, steered in PAIRS} | {"eager"}  # conditions whose requests are steered


def device_kernels(run, cpu: bool = False) -> dict[str, list[float]]:
    """{name: [total us, count]} of the device kernels one call of ``run`` launches, from
    ``torch.profiler`` (CUPTI); ``cpu``: the ops' self CPU time instead. Empty when the profile holds
    none."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    device, activity = (DeviceType.CPU, ProfilerActivity.CPU) if cpu else (DeviceType.CUDA, ProfilerActivity.CUDA)
    with profile(activities=[activity]) as prof:
        run()
    return summed(prof.events(), device, cpu)


def summed(events, device, cpu: bool) -> dict[str, list[float]]:
    """{name: [total us, count]} of the profile's ``events`` on ``device``. An op's self CPU time is
    its time less its children's, and the profiler may file a child that ran on another thread
    under it, longer than the op itself: such a self time, negative, counts as 0 (a CPU engine's
    profile had an idle step sum to -1,864 µs)."""
    out: dict[str, list[float]] = {}
    for e in events:
        if e.device_type != device:
            continue
        acc = out.setdefault(e.name, [0.0, 0])
        acc[0] += max(e.self_cpu_time_total, 0.0) if cpu else e.time_range.elapsed_us()
        acc[1] += 1
    return out


# ---------------------------------------------------------------- child: one engine, its conditions
def _child(job_path: str, out: Path) -> None:
    job = json.loads(Path(job_path).read_text())
    plugin, eager, conditions = PROCESSES[job["process"]]
    import fcntl

    import torch
    import vllm
    from vllm import LLM, SamplingParams

    smoke, batches, steps, prefills = job["smoke"], job["batches"], job["steps"], job["prefill"]
    cfg = json.loads((Path(job["model"]) / "config.json").read_text())
    n_layers, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    engine = dict(skip_tokenizer_init=True, enable_prefix_caching=False, seed=0, max_num_seqs=max(batches),
                  max_num_batched_tokens=max([2048, max(batches) * PROMPT_LEN, *prefills]),
                  max_model_len=max([1024, *prefills]) + 64, enforce_eager=eager or smoke,
                  kv_cache_memory_bytes=(128 if smoke else 8192) * 2**20)
    if smoke:
        engine.update(dtype="float32")
    else:  # several processes share the GPU at start-up: a fixed KV budget skips vLLM's memory profiling
        engine.update(load_format="dummy", dtype="bfloat16", attention_backend="TRITON_ATTN",
                      gpu_memory_utilization=0.3, compilation_config={"cudagraph_capture_sizes": sorted(batches)})
    t0 = time.perf_counter()
    llm = LLM(model=job["model"], **engine)
    startup_s = time.perf_counter() - t0
    mailbox = Path(os.environ["HOTWIRE_MAILBOX"])
    if mailbox.exists() != plugin:  # only an armed engine creates its mailbox
        raise SystemExit(f"{job['process']}: hotwire armed={mailbox.exists()}, expected {plugin}")
    gpu = open(job["lock"], "w")
    t0 = time.perf_counter()
    fcntl.flock(gpu, fcntl.LOCK_EX)  # measure alone on the GPU; only start-ups overlap (released at exit)
    waited_s = time.perf_counter() - t0

    l1, l2 = steered_layers(n_layers)
    sent = {"steered": 0}

    def call(b: int, n: int, cond: str, prompt_len: int = PROMPT_LEN):
        rng = np.random.default_rng(b * 100_003 + prompt_len)  # the same prompts in every process
        prompts = [{"prompt_token_ids": rng.integers(10, vocab - 10, prompt_len).tolist()} for _ in range(b)]
        params = []
        for j in range(b):  # every request its own two vectors and scales
            spec = [{"id": f"v{j % N_VECTORS}", "layer": l1, "scale": 1.0 + j / b},
                    {"id": f"v{(j + 1) % N_VECTORS}", "layer": l2, "scale": -0.5 - j / b}]
            spec = [{**e, **MODES[cond]} for e in spec] if cond in MODES else spec
            extra = {"hotwire": json.dumps(spec)} if cond in STEERED else None
            params.append(SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, extra_args=extra))
        sent["steered"] += b if cond in STEERED else 0
        return lambda: llm.generate(prompts, params, use_tqdm=False)

    def wall(run) -> float:
        t = time.perf_counter()
        run()
        return time.perf_counter() - t

    def kernels(run) -> dict[str, list[float]]:
        out = device_kernels(run, smoke)
        if not out:
            raise SystemExit(f"{job['process']}: the profile holds no {'CPU' if smoke else 'CUDA'} kernels (CUPTI off?)")
        return out

    def per_step(short: dict, long: dict) -> dict:
        """Kernel time and launches per decode step, by name: (long - short) / steps."""
        by_name = {}
        for name in short.keys() | long.keys():
            (us1, c1), (us2, c2) = short.get(name, (0.0, 0)), long.get(name, (0.0, 0))
            if c1 != c2 or abs(us2 - us1) > 1e-3 * steps:
                by_name[name] = [round((us2 - us1) / steps, 3), round((c2 - c1) / steps, 2)]
        return by_name

    rows: dict[str, dict] = {c: {} for c in conditions}
    for b in batches:
        for c in conditions:
            kernels(call(b, N1, c))  # warm-up: allocator, profiler start-up; discarded
        for c in conditions:
            wall_s = wall(call(b, N1 + steps, c)) - wall(call(b, N1, c))
            by_name = per_step(kernels(call(b, N1, c)), kernels(call(b, N1 + steps, c)))
            copy = {k: v for k, v in by_name.items() if k.startswith(("Memcpy", "Memset"))}
            kern = {k: v for k, v in by_name.items() if k not in copy}
            launches = sum(v[1] for v in kern.values())
            seen = launches >= n_layers  # else CUPTI missed the kernels inside CUDA-graph replays
            rows[c][b] = {"kernel_us": round(sum(v[0] for v in kern.values()), 2), "kernels": round(launches, 2),
                          "copy_us": round(sum(v[0] for v in copy.values()), 2),
                          "wall_ms": round(wall_s / steps * 1e3, 4), "graph_kernels_seen": seen, "by_name": by_name}
            print(f"hotwire-kt {c} B={b}: {rows[c][b]['kernel_us']} us kernels, {launches:.0f} launches, "
                  f"{rows[c][b]['wall_ms']} ms wall per step" + ("" if seen else "  (FEWER KERNELS THAN LAYERS)"),
                  flush=True)

    prefill: dict[str, dict] = {c: {} for c in conditions}
    for p in prefills:  # one prompt of p tokens, one step: prefill + first sample
        for c in conditions:
            kernels(call(1, 1, c, p))  # warm-up
        for c in conditions:
            t, k = wall(call(1, 1, c, p)), kernels(call(1, 1, c, p))
            us = sum(v[0] for n, v in k.items() if not n.startswith(("Memcpy", "Memset")))
            prefill[c][p] = {"kernel_us": round(us, 1), "wall_ms": round(t * 1e3, 3),
                             "tokens_per_s": round(p / t, 1), "kernel_tokens_per_s": round(p / us * 1e6, 1),
                             "by_name": {n: [round(v[0], 3), v[1]] for n, v in k.items()}}
            print(f"hotwire-kt {c} prefill {p}: {prefill[c][p]['kernel_us']} us kernels, "
                  f"{prefill[c][p]['wall_ms']} ms wall", flush=True)

    counters = {}
    if plugin:
        from hotwire.shared.mailbox import HEARTBEAT_S, MailboxView

        time.sleep(2 * HEARTBEAT_S)  # counters reach the mailbox with the engine's heartbeat
        counters = MailboxView.open(str(mailbox)).counters()
        bad = {k: v for k, v in counters.items() if k.startswith("unsteered_") and v}
        if bad or counters["steered_requests"] != sent["steered"]:
            raise SystemExit(f"{job['process']}: steering not as expected ({sent['steered']} steered requests "
                             f"sent): {counters}")
    try:
        graphs = str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode)
    except AttributeError:
        graphs = "unknown"
    info = {"device": "cpu" if smoke else torch.cuda.get_device_name(0), "vllm": vllm.__version__,
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudagraph_mode": graphs,
            "runner": "v1" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "0" else "default"}
    idle = sys.modules.get("hotwire.engine_plugin.idle_graphs")
    idle_stats = None if idle is None else {**vars(idle.STATS), "wanted": idle.wanted}
    out.write_text(json.dumps({"info": info, "startup_s": round(startup_s, 1), "waited_s": round(waited_s, 1),
                               "counters": counters, "idle_graphs": idle_stats, "rows": rows, "prefill": prefill}))


# ---------------------------------------------------------------- parent: alternate, summarise
def _vectors(path: Path, hidden: int) -> None:
    from hotwire.shared.wire import encode_safetensors

    path.mkdir()
    rng = np.random.default_rng(0)
    for i in range(N_VECTORS):
        (path / f"v{i}.safetensors").write_bytes(encode_safetensors(rng.standard_normal(hidden).astype(np.float32)))


def _run_child(work: Path, tag: str, process: str, common: dict) -> dict:
    job, out, log = work / f"{tag}.job.json", work / f"{tag}.out.json", work / f"{tag}.log"
    job.write_text(json.dumps({**common, "process": process}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTWIRE_") and k != "VLLM_PLUGINS"}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HOTWIRE_MAILBOX=str(work / f"{tag}.mbx"),
               HOTWIRE_VECTORS=str(work / "vectors"))
    # Inductor picks a reduction kernel's config by timing it at compile time, so the same norm
    # kernel could get another config in each process (seen: +10-18 us per step in one process).
    # Its heuristic pick is the same in every process: the processes then differ by the op alone.
    env.setdefault("TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS", "1")
    if not PROCESSES[process][0]:
        env["VLLM_PLUGINS"] = "none"  # vLLM loads no general plugin: a plugin-free engine
    if process in ("hotwire_2", "hotwire_modes"):
        env["HOTWIRE_LAYERS"] = ",".join(map(str, steered_layers(common["layers"])))
    if process == "hotwire_modes":
        env["HOTWIRE_PROJECTION_LAYERS"] = "all"
    if process in ("hotwire_op_graphs", "hotwire_switched_one_graph"):
        env["HOTWIRE_IDLE_GRAPHS"] = "0"
    if process in ("hotwire_switched", "hotwire_switched_one_graph"):
        env["HOTWIRE_GRAPH_SWITCH"] = "1"
    t = time.time()
    with open(log, "w") as f:
        cmd = [sys.executable, __file__, "--child", str(job), "--out", str(out)]
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"{tag} failed (rc {rc}); log {log}:\n" + log.read_text()[-5000:])
    res = json.loads(out.read_text())
    ig = res.get("idle_graphs") or {}
    extra = (f"; {ig['graphs']} graphs without the op: {ig['seconds']:.1f} s, {ig['bytes'] / 2**20:.0f} MiB "
             f"(vLLM's own: {ig['first_seconds']:.1f} s, {ig['first_bytes'] / 2**20:.0f} MiB)") if ig.get("graphs") else ""
    print(f"{tag}: {time.time() - t:.0f} s (start-up {res['startup_s']} s, waited for the GPU {res['waited_s']} s"
          f"{extra})", flush=True)
    return res


def _ratio(s: dict[str, list[dict]], num: str, den: str, key: str) -> float | None:
    """Median over repeats of ``num[key] / den[key]`` (repeats paired in order); None if one is missing."""
    if num not in s or den not in s:
        return None
    return round(statistics.median(x[key] / y[key] for x, y in zip(s[num], s[den])), 4)


def _kernels(row: dict) -> dict[str, float]:
    return {n: v[0] for n, v in row["by_name"].items() if not n.startswith(("Memcpy", "Memset"))}


def _attributed(free: list[dict], idle: list[dict], steered: list[dict]) -> dict:
    """The op's own cost: time of the kernels whose names differ from plugin-free (the op's
    kernel, and any kernel the plugin changed) minus that of the kernels they replace.

    Unchanged kernels (GEMMs, attention) are left out, so a neighbour on the GPU or clock drift
    that slows them in one process does not read as steering cost. Ratios are then taken on the
    plugin-free step: (free + op) / free and (free + op_steered) / (free + op_idle).
    """
    med = statistics.median
    op_idle, op_steered, base = [], [], []
    for f, i, st in zip(free, idle, steered):
        f, i, st = _kernels(f), _kernels(i), _kernels(st)
        gone = sum(v for n, v in f.items() if n not in i)
        op_idle.append(sum(v for n, v in i.items() if n not in f) - gone)
        op_steered.append(sum(v for n, v in st.items() if n not in f) - gone)
        base.append(sum(f.values()))
    return {"op_idle_us": round(med(op_idle), 2), "op_steered_us": round(med(op_steered), 2),
            "attributed_idle_over_plugin_free": round(med((b + o) / b for b, o in zip(base, op_idle)), 4),
            "attributed_steered_over_idle": round(med((b + s) / (b + o) for b, o, s in
                                                      zip(base, op_idle, op_steered)), 4)}


def _summary(samples: dict[str, list[dict]], batches: list[int], top: int) -> tuple[list[dict], list[dict]]:
    med = statistics.median
    rows, diffs = [], []
    for b in batches:
        s = {c: [r["rows"][str(b)] for r in runs] for c, runs in samples.items() if runs}
        row = {"batch": b}
        for c, xs in s.items():
            k = [x["kernel_us"] for x in xs]
            row.update({f"{c}_kernel_us": round(med(k), 2), f"{c}_kernels": med(x["kernels"] for x in xs),
                        f"{c}_spread": round((max(k) - min(k)) / med(k), 4),
                        f"{c}_wall_ms": round(med(x["wall_ms"] for x in xs), 4)})

        for idle, steered in PAIRS:
            row.update({f"{idle}_over_plugin_free": _ratio(s, idle, "plugin_free", "kernel_us"),
                        f"{steered}_over_{idle}": _ratio(s, steered, idle, "kernel_us"),
                        f"wall_{idle}_over_plugin_free": _ratio(s, idle, "plugin_free", "wall_ms"),
                        f"wall_{steered}_over_{idle}": _ratio(s, steered, idle, "wall_ms")})
            if {"plugin_free", idle, steered} <= s.keys():
                row[f"op_{idle}"] = _attributed(s["plugin_free"], s[idle], s[steered])
        if "eager" in s:
            row["eager_over_plugin_free"] = _ratio(s, "eager", "plugin_free", "kernel_us")
        rows.append(row)
        diffs += _kernel_diffs(b, s, top)
    return rows, diffs


def _kernel_diffs(label: int | str, s: dict[str, list[dict]], top: int) -> list[dict]:
    """The ``top`` kernel names whose time differs most from plugin-free's, per condition: the
    median over repeats of each name's time (absent: 0) in samples ``s`` (condition -> samples,
    each with ``by_name``: name -> [us, calls])."""
    med = statistics.median
    if "plugin_free" not in s:
        return []
    names = {c: {} for c in s}
    for c, xs in s.items():
        for name in {n for x in xs for n in x.get("by_name", {})}:
            vals = [x["by_name"].get(name, [0.0, 0.0]) for x in xs]
            names[c][name] = [round(med(v[0] for v in vals), 3), med(v[1] for v in vals)]
    diffs = []
    for c in [c for pair in PAIRS for c in pair if c in s]:
        base, cur = names["plugin_free"], names[c]
        delta = {n: cur.get(n, [0, 0])[0] - base.get(n, [0, 0])[0] for n in base.keys() | cur.keys()}
        for n in sorted(delta, key=lambda n: -abs(delta[n]))[:top]:
            diffs.append({"batch": label, "condition": c, "kernel": n, "plugin_free_us": base.get(n, [0, 0])[0],
                          "us": cur.get(n, [0, 0])[0], "delta_us": round(delta[n], 3),
                          "calls": f"{base.get(n, [0, 0])[1]:g} -> {cur.get(n, [0, 0])[1]:g}"})
    return diffs


def _prefill_summary(samples: dict[str, list[dict]], lengths: list[int], top: int) -> tuple[list[dict], list[dict]]:
    """Per prompt length: medians, and throughput ratios (higher = faster) from kernel and wall time;
    and the kernels whose time differs most from plugin-free's (a step run without a CUDA graph)."""
    med = statistics.median
    rows, diffs = [], []
    for p in lengths:
        s = {c: [r["prefill"][str(p)] for r in runs] for c, runs in samples.items() if runs}
        row = {"prompt_len": p}
        for c, xs in s.items():
            row.update({f"{c}_kernel_us": round(med(x["kernel_us"] for x in xs), 1),
                        f"{c}_tokens_per_s": round(med(x["tokens_per_s"] for x in xs), 1)})
        # throughput ratios: the time of the denominator's condition over the numerator's
        for idle, steered in PAIRS:
            row.update({f"{steered}_over_{idle}": _ratio(s, idle, steered, "kernel_us"),
                        f"{idle}_over_plugin_free": _ratio(s, "plugin_free", idle, "kernel_us"),
                        f"wall_{steered}_over_{idle}": _ratio(s, idle, steered, "wall_ms"),
                        f"wall_{idle}_over_plugin_free": _ratio(s, "plugin_free", idle, "wall_ms")})
        if "eager" in s:
            row["eager_over_plugin_free"] = _ratio(s, "plugin_free", "eager", "kernel_us")
        rows.append(row)
        diffs += _kernel_diffs(f"prefill {p}", s, top)
    return rows, diffs


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _markdown(rows: list[dict], diffs: list[dict], prefill: list[dict], conds: list[str]) -> str:
    f = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    pairs = [(i, st) for i, st in PAIRS if i in conds]
    ratios = [f"{n}_over_{d}" for i, st in pairs for n, d in ((i, "plugin_free"), (st, i))]
    eager = ["eager_over_plugin_free"] if "eager" in conds else []
    name = lambda k: k.replace("_over_", "/").replace("plugin_free", "pf")  # noqa: E731
    head = ["batch"] + [f"{c} us" for c in conds] + [name(k) for k in ratios + eager] + \
           ["launches " + "/".join(conds), "max (max-min)/median"] + [f"wall {c} ms" for c in conds] + \
           [f"wall {name(k)}" for k in ratios]
    out = ["kernel time per decode step (sum of device kernel durations), median over repeats", ""]
    out += _table(head, [[str(r["batch"])] + [f(r.get(f"{c}_kernel_us")) for c in conds] +
                         [f(r.get(k)) for k in ratios + eager] +
                         ["/".join(f(r.get(f"{c}_kernels")) for c in conds),
                          f"{100 * max(r.get(f'{c}_spread', 0) for c in conds):.2f} %"] +
                         [f(r.get(f"{c}_wall_ms")) for c in conds] + [f(r.get(f"wall_{k}")) for k in ratios]
                         for r in rows])
    for idle, steered in pairs:
        ops = [(r["batch"], r[f"op_{idle}"]) for r in rows if f"op_{idle}" in r]
        if ops:
            out += ["", f"the op's own cost ({idle}, {steered}): kernels that differ from plugin-free (the op's, "
                    "and any it changed), minus the ones they replace; ratios on the plugin-free step", ""]
            out += _table(["batch", "op us idle", "op us steered", "idle/pf", "steered/idle"],
                          [[str(b), f(o["op_idle_us"]), f(o["op_steered_us"]),
                            f(o["attributed_idle_over_plugin_free"]), f(o["attributed_steered_over_idle"])]
                           for b, o in ops])
    ratios = [f"{n}_over_{d}" for i, st in pairs for n, d in ((st, i), (i, "plugin_free"))]
    head = ["prompt tokens"] + [f"{c} us" for c in conds] + [f"{c} tok/s" for c in conds] + \
           [name(k) for k in ratios + eager] + [f"wall {name(k)}" for k in ratios]
    out += ["", "prefill, one prompt in one step: kernel time and wall-clock tokens/s; ratios are throughput "
            "(>= 0.99 is the target)", ""]
    out += _table(head, [[str(r["prompt_len"])] + [f(r.get(f"{c}_kernel_us")) for c in conds] +
                         [f(r.get(f"{c}_tokens_per_s")) for c in conds] + [f(r.get(k)) for k in ratios + eager] +
                         [f(r.get(f"wall_{k}")) for k in ratios] for r in prefill])
    out += ["", "kernels whose time per step differs most from plugin-free (us per step; batch: a decode step "
            "of that many requests, or one prompt's prefill, a step run without a CUDA graph)", ""]
    out += _table(["batch", "condition", "kernel", "plugin-free", "condition", "delta", "calls/step"],
                  [[str(d["batch"]), d["condition"],
                    "`" + (d["kernel"] if len(d["kernel"]) <= 90 else d["kernel"][:87] + "...") + "`",
                    f(d["plugin_free_us"]), f(d["us"]), f"{d['delta_us']:+g}", d["calls"]] for d in diffs])
    return "\n".join(out)


def _report(path: Path, top: int) -> None:
    """Summaries and tables from a results file's samples (also one cut short by a time-out,
    whose file then gets the summaries a finished run writes)."""
    result = json.loads(path.read_text())
    samples = {c: runs for c, runs in result["samples"].items() if runs}
    rows, diffs = _summary(samples, result["batches"], top)
    prefill, prefill_diffs = _prefill_summary(samples, result.get("prefill_lens", []), top)
    diffs += prefill_diffs
    if "rows" not in result:
        result.update(rows=rows, prefill=prefill, top_kernels=diffs)
        path.write_text(json.dumps(result, indent=1))
    print(f"{result['shape']}, {result.get('info')}, S={result['decode_steps']} steps\n")
    print(_markdown(rows, diffs, prefill, list(samples)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b", help="qwen3-0.6b | qwen3-4b | qwen3-8b (ignored with --smoke)")
    ap.add_argument("--processes", nargs="+", default=["plugin_free", "hotwire"], choices=list(PROCESSES),
                    help="engine processes per repeat: plugin_free, hotwire (idle + steered), eager (steered)")
    ap.add_argument("--batches", type=int, nargs="+", help="default 1 8 64 256 (smoke: 1 4)")
    ap.add_argument("--steps", type=int, help="decode steps S in the difference (default 64; smoke: 8)")
    ap.add_argument("--prefill", type=int, nargs="*", help="prompt lengths (default 4096 8192; smoke: 256)")
    ap.add_argument("--repeats", type=int, default=2, help="processes per kind, started A B A B ...")
    ap.add_argument("--once", nargs="*", default=["eager"], help="kinds run in the first repeat only")
    ap.add_argument("--parallel", type=int, default=1,
                    help="processes at once; measurements take a lock, but others' start-ups still disturb them")
    ap.add_argument("--lock", type=Path, help="GPU lock file; share one between runs started side by side")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per batch size and condition")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the script, numbers mean nothing")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--report", action="store_true", help="re-summarise the samples in --out and print the tables")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.out)
    if args.report:
        return _report(args.out, args.top)

    import torch

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --smoke to check the script on CPU")
    batches = args.batches or ([1, 4] if args.smoke else [1, 8, 64, 256])
    steps = args.steps or (8 if args.smoke else 64)
    prefills = args.prefill if args.prefill is not None else ([256] if args.smoke else [4096, 8192])
    work = Path(tempfile.mkdtemp(prefix="hotwire-kt-"))

    model, shape = benchmark_model(work, args.shape, args.smoke)
    config = json.loads((model / "config.json").read_text())
    _vectors(work / "vectors", config["hidden_size"])
    common = {"model": str(model), "layers": config["num_hidden_layers"], "smoke": args.smoke, "batches": batches, "steps": steps, "prefill": prefills,
              "lock": str(args.lock or work / "gpu.lock")}
    conds = [c for p in args.processes for c in PROCESSES[p][2]]
    print(f"work dir (child logs): {work}", flush=True)

    result = {"shape": shape, "config": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
              "dtype": "float32" if args.smoke else "bfloat16", "date": time.strftime("%Y-%m-%d %H:%M"),
              "host": platform.node(), "command": " ".join([Path(sys.executable).name] + sys.argv),
              "batches": batches, "decode_steps": steps, "prompt_len": PROMPT_LEN, "prefill_lens": prefills,
              "repeats": args.repeats, "samples": {c: [] for c in conds}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    order = [(r, p) for r in range(args.repeats) for p in args.processes if r == 0 or p not in args.once]
    done: dict[tuple[int, str], dict] = {}
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        futures = {pool.submit(_run_child, work, f"r{r}-{p}", p, common): (r, p) for r, p in order}
        for fut in as_completed(futures):
            try:
                done[futures[fut]] = fut.result()
            except SystemExit as e:  # one failed process is reported, the others still count
                print(e, flush=True)
                continue
            for c in conds:  # samples in repeat order, so per-repeat ratios pair processes of one repeat
                result["samples"][c] = [{"rows": d["rows"][c], "prefill": d["prefill"][c], "info": d["info"],
                                         "startup_s": d["startup_s"], "counters": d["counters"],
                                         "idle_graphs": d.get("idle_graphs")}
                                        for (r, p), d in sorted(done.items()) if c in d["rows"]]
            result.setdefault("info", done[futures[fut]]["info"])
            args.out.write_text(json.dumps(result, indent=1))  # partial results survive a time-out
    if not done:
        raise SystemExit("no engine process finished")
    rows, diffs = _summary(result["samples"], batches, args.top)
    prefill, prefill_diffs = _prefill_summary(result["samples"], prefills, args.top)
    diffs += prefill_diffs
    result.update(rows=rows, prefill=prefill, top_kernels=diffs)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{shape}, {result['info']}, {args.repeats} processes per kind, S={steps} steps\n")
    print(_markdown(rows, diffs, prefill, conds))


if __name__ == "__main__":
    main()
