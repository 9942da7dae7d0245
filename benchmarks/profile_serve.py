"""Where a served engine's host time goes: py-spy on each server's engine core under the same load.

Why: at high concurrency a served engine is host-bound (its engine-core process is 100 % busy),
and hotwire's own counters see only its hooks. A sampling profile of the engine core's step thread,
hotwire's server beside a plugin-free one under the same closed-loop load, shows every frame the
step pays for: the hooks, the op's dispatch and launch in steps run without a CUDA graph, and
what vLLM itself does more or less often.

How: servers and load as in ``serve_throughput.py`` (``serving.py``; ``--servers``: kinds
``server_kinds.py`` names, the first the base the others are compared with, default plugin-free
then hotwire; ``hotwire_unsteered hotwire`` says what steering adds), one server under load at a
time (``--simultaneous``: all at once, each under its own load, profiled over the same seconds, as
``serve_throughput.py --simultaneous`` measures them): C requests in flight, ``--settle-s``, then
``py-spy record --nonblocking --threads --format raw --idle`` on the server's ``VLLM::EngineCore``
process (``--idle``: a thread waiting for the GIL or a lock is sampled where it waits, so the step
thread's samples cover its whole time) for ``--seconds`` at ``--rate`` Hz, with the server's step
count read from ``/metrics`` around it; with ``--gil-seconds``, then that long more under the same
load with ``--gil`` instead of ``--idle`` (only the thread holding the GIL is sampled), summarised
as the GIL's samples per engine step by thread: who the engine core's one interpreter lock goes to.
Over the wall window each server's CPU time is read too (``cpu``): its API server's and engine
core's CPU seconds per second, and the engine core's busiest threads (by their Python names where
py-spy saw them, else the OS's), in CPU µs per
engine step (an API server near 1.0 is saturated; a thread's extra µs per step is where a longer
step's work went, whether or not it is Python).
With ``--step-phases`` every engine core also times its step phase by phase over the same seconds
(``bench_site/step_phases.py``; ``--sync-debug``: torch warns in each server's log wherever it
synchronises with the GPU), and ``--mps`` runs the servers under NVIDIA's Multi-Process Service.
Summary per server, for the step thread (the engine core's main thread): its samples, engine steps, samples
per step, and its samples by owner: a sample is hotwire's when the innermost frame of hotwire's or
vLLM's code in it is hotwire's (then filed by hotwire's module: the op, routing, admission, the
hooks, the core's sync, the salt), and vLLM's samples by group (the compiled model, the scheduler,
output processing, ...). The raw stacks are written beside the JSON (``<out>.<server>.txt``, one
stack and its count per line) for a flame graph (``flamegraph.pl``, speedscope), and the report
ends with the innermost frames whose samples per step differ most between each server and the
base (``leaves_differing``): where a longer step spends its extra time.

    python benchmarks/profile_serve.py --shape qwen3-0.6b --concurrency 256 --out /tmp/profile.json

Needs ``py-spy`` (a PyPI wheel; on the GPU machine carry it, see ``benchmarks/h200.sh``) and a GPU;
``--smoke`` checks the script end to end on CPU (tiny model, eager).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

from hotwire.tools.tiny_model import benchmark_model, steered_layers
from bench_site import step_phases
from mps import Mps
from serving import (SERVER_CORES, Load, Server, add_common_args, cpu_plan, engine_args, engine_core, phase_readings,
                     running, start_run, wait_ready, write_vectors)
from server_kinds import KINDS, load_of, make_server
from simultaneous import CLIENTS_PER_CORE, LoadSet, default_processes

# A sample is hotwire's when the innermost frame of hotwire's or vLLM's own code in its stack is
# hotwire's (hotwire's hooks wrap vLLM's methods, so a wrapper frame alone says nothing); it is
# then filed by that frame's module, and ``op_launch`` holds the op's samples inside Triton.
HOTWIRE_FILES = re.compile(r"(engine_plugin|hotwire/shared|/shared)/(\w+)\.py")
HOTWIRE_PARTS = {"steer_op": "op", "steer_triton": "op", "routing": "routing", "state_rows": "routing", "staging": "routing",
                 "upload_triton": "routing", "steering": "routing", "gate_report": "rank_hooks",
                 "registry": "admission", "admission": "admission", "stream_bound": "admission",
                 "interventions": "admission", "spec": "admission", "engine": "rank_hooks", "hooks": "rank_hooks",
                 "core_sync": "core_sync", "delta": "core_sync", "salts": "salts", "mailbox": "salts"}
WRAPPERS = ("_wrap.<locals>.wrapper ", "_doubled.<locals>.wrapper ", "_before_core_step.<locals>.scheduled ")
# vLLM's own samples, by a frame anywhere in the stack (a sample may count in several)
VLLM_GROUPS = {
    "compiled_model": ("torchinductor", "Runner.call"),
    "scheduler": ("vllm/v1/core/sched/",),
    "update_from_output": ("update_from_output",),
    "prepare_inputs": ("prepare_inputs",),
    "sampler": ("/sample/",),
}
GPU_MEMORY_UTILIZATION = 0.25
LEAVES = 400  # innermost frames kept per server, by samples: the report compares them across servers


def record(pyspy: str, pid: int, seconds: float, rate: int, out: Path, gil: bool = False) -> None:
    """Every thread at every sample (``--idle``: wall time), or with ``gil`` only the thread holding
    the GIL (``--gil``: who the engine core's one interpreter lock is spent on)."""
    cmd = [pyspy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate),
           "--nonblocking", "--threads", "--gil" if gil else "--idle", "--format", "raw", "--output", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"py-spy failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _owner(frames: list[str]) -> tuple[str, str | None]:
    """("hotwire", its part) or ("vllm", None) or ("other", None), by the innermost frame of either;
    the wrappers hotwire puts around vLLM's methods are not hotwire's time (the method they call
    is vLLM's, and a sample taken in the call between the two shows the wrapper alone)."""
    for frame in reversed(frames):
        if frame.startswith(WRAPPERS):
            continue
        m = HOTWIRE_FILES.search(frame)
        if m:
            return "hotwire", HOTWIRE_PARTS.get(m.group(2), "other")
        if "vllm/" in frame:
            return "vllm", None
    return "other", None


def _stacks(raw: Path) -> list[tuple[str, list[str], int]]:
    """py-spy's raw output: ``(thread label, frames outermost first, samples)`` per line."""
    out = []
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            out.append((frames[0], frames[1:], int(count)))
    return out


def summarize(raw: Path, steps: int) -> dict:
    """The step thread's samples: hotwire's by part, vLLM's by group."""
    stacks = _stacks(raw)
    threads: Counter[str] = Counter()
    for thread, _, count in stacks:
        threads[thread] += count
    if not threads:
        raise SystemExit(f"{raw}: no samples")
    # the step thread: vLLM's engine core steps on its main thread (with --idle every thread is sampled
    # at every tick, so the busiest by samples is a tie broken at random)
    main_thread = next((t for t in threads if t.endswith(": MainThread")), threads.most_common(1)[0][0])
    total = threads[main_thread]
    groups, leaves = Counter(), Counter()
    for thread, frames, count in stacks:
        if thread != main_thread:
            continue
        leaves[frames[-1] if frames else "(no frame)"] += count
        owner, part = _owner(frames)
        groups[owner] += count
        if owner == "hotwire":
            groups[f"hotwire_{part}"] += count
            if part == "op" and any("triton/" in f for f in frames):
                groups["hotwire_op_launch"] += count
        elif owner == "vllm":
            for name, needles in VLLM_GROUPS.items():
                if any(n in f for f in frames for n in needles):
                    groups[name] += count
    per_step = max(steps, 1)
    return {"thread": main_thread, "samples": total, "steps": steps, "samples_per_step": round(total / per_step, 4),
            "groups": {name: {"samples": n, "share": round(n / total, 4), "per_step": round(n / per_step, 4)}
                       for name, n in sorted(groups.items())},
            "other_threads": dict(threads.most_common()[1:6]),
            "leaves_per_step": {f: round(n / per_step, 4) for f, n in leaves.most_common(LEAVES)}}


def _cpu_seconds(server: Server) -> dict:
    """CPU seconds so far of the server's API server and engine core, and of each engine-core
    thread by OS id: ``{"api_server": s, "engine_core": s, "threads": {tid: (name, s)}}``."""
    api, core = psutil.Process(server.proc.pid), engine_core(server)
    threads = {}
    for t in core.threads():
        try:
            name = Path(f"/proc/{core.pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        threads[t.id] = (name, t.user_time + t.system_time)
    return {"api_server": sum(api.cpu_times()[:2]), "engine_core": sum(core.cpu_times()[:2]), "threads": threads}


def python_threads(raw: Path) -> dict[int, str]:
    """``{OS thread id: Python thread name}`` from py-spy's labels (``thread (1220): MainThread``):
    the OS names of a vLLM process's threads are all its own."""
    names = {}
    for thread, _, _ in _stacks(raw):
        m = re.match(r"thread \((\d+)\): (.*)", thread)
        if m:
            names[int(m.group(1))] = m.group(2)
    return names


def cpu_use(a: dict, b: dict, wall: float, steps: int, names: dict[int, str]) -> dict:
    """Between two :func:`_cpu_seconds`: CPU seconds per second of each process, and the engine
    core's threads (the six busiest) in CPU µs per engine step, named by ``names`` where the
    thread runs Python (:func:`python_threads`), else by the OS."""
    per_step = max(steps, 1)
    threads = sorted(((b_s - a["threads"][tid][1], names.get(tid, name), tid)
                      for tid, (name, b_s) in b["threads"].items() if tid in a["threads"]), reverse=True)[:6]
    return {"api_server_cpu_per_s": round((b["api_server"] - a["api_server"]) / wall, 3),
            "engine_core_cpu_per_s": round((b["engine_core"] - a["engine_core"]) / wall, 3),
            "engine_core_threads_us_per_step": [{"name": name, "tid": tid, "us": round(1e6 * d / per_step, 1)}
                                                for d, name, tid in threads]}


def _profile(servers: list[Server], client: httpx.Client, pyspy: str, args: argparse.Namespace) -> dict[str, dict]:
    """py-spy on the engine cores of ``servers`` over the same seconds (their loads running), then
    with ``--gil-seconds`` once more sampling the GIL's holder; each server's summary."""
    def all_at_once(seconds: float, suffix: str, gil: bool) -> None:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: record(pyspy, engine_core(s).pid, seconds, args.rate,
                                           args.out.with_suffix(f".{s.name}{suffix}"), gil=gil), servers))

    before = {s.name: (s.metrics(client), _cpu_seconds(s)) for s in servers}
    phases = args.step_phases and phase_readings(servers, args.step_phases)
    all_at_once(args.seconds, ".txt", False)
    after = {s.name: (s.metrics(client), _cpu_seconds(s)) for s in servers}
    if args.step_phases:
        phases = step_phases.report(phases, phase_readings(servers, args.step_phases))
    if args.gil_seconds > 0:
        all_at_once(args.gil_seconds, ".gil.txt", True)
        end = {s.name: s.metrics(client) for s in servers}
    out = {}
    for s in servers:
        (a, cpu_a), (b, cpu_b) = before[s.name], after[s.name]
        wall = b["t"] - a["t"]
        summary = summarize(args.out.with_suffix(f".{s.name}.txt"), int(b["steps"] - a["steps"]))
        summary["tokens_per_s"] = round((b["generation_tokens"] - a["generation_tokens"]) / wall, 1)
        summary["step_ms"] = round(1000 * wall / max(summary["steps"], 1), 3)
        summary["cpu"] = cpu_use(cpu_a, cpu_b, wall, summary["steps"],
                                 python_threads(args.out.with_suffix(f".{s.name}.txt")))
        if args.gil_seconds > 0:
            summary["gil"] = summarize_gil(args.out.with_suffix(f".{s.name}.gil.txt"),
                                           int(end[s.name]["steps"] - b["steps"]), args.gil_seconds, args.rate)
        if args.step_phases and s.name in phases:
            summary["step_phases"] = phases[s.name]
        hot = summary["groups"].get("hotwire", {"share": 0.0})
        cpu = summary["cpu"]
        print(f"{s.name}: {summary['tokens_per_s']:.0f} tok/s, {summary['step_ms']:.2f} ms/step, "
              f"{summary['samples_per_step']:.2f} samples/step; hotwire {hot['share']:.1%}; CPU/s: API server "
              f"{cpu['api_server_cpu_per_s']:.2f}, engine core {cpu['engine_core_cpu_per_s']:.2f}", flush=True)
        out[s.name] = summary
    return out


def compare(base: str, name: str, result: dict, rate: int) -> None:
    """Server ``name`` against ``base`` in ``result``: samples per step by group, the innermost
    frames that differ most, CPU per step by thread, and the GIL's holders; printed and kept."""
    free, hot = result["servers"][base], result["servers"][name]

    def per_step(side: dict, group: str) -> float:
        return side["groups"].get(group, {}).get("per_step", 0.0)

    groups = {g: [per_step(free, g), per_step(hot, g)] for g in sorted(set(free["groups"]) | set(hot["groups"]))}
    leaves = set(free["leaves_per_step"]) | set(hot["leaves_per_step"])
    differ = sorted(((hot["leaves_per_step"].get(f, 0.0) - free["leaves_per_step"].get(f, 0.0), f) for f in leaves),
                    key=lambda d: -abs(d[0]))[:20]
    result["compared"][name] = {"per_step": groups,
                                "leaves_differing": [{"frame": f, "per_step_difference": round(d, 4)} for d, f in differ]}
    print(f"\nsamples per engine step at {rate} Hz, {base} / {name} / difference "
          f"(all: {free['samples_per_step']:.3f} / {hot['samples_per_step']:.3f}):")
    for group, (a, b) in groups.items():
        print(f"  {group:22s} {a:8.3f} {b:8.3f} {b - a:+8.3f}")
    print(f"\ninnermost frames whose samples per step differ most ({name} - {base}):")
    for d, f in differ:
        print(f"  {d:+8.3f}  {f[:150]}")
    print(f"\nengine-core threads, CPU µs per step ({base} | {name}):")
    for side in (free, hot):
        print("  " + ", ".join(f"{t['name']} {t['us']:.0f}" for t in side["cpu"]["engine_core_threads_us_per_step"]))
    if "gil" in free and "gil" in hot:
        print(f"\nGIL held, samples per engine step by thread, {base} / {name} "
              f"(held at all: {free['gil']['held_share']:.1%} / {hot['gil']['held_share']:.1%} of samples):")
        for thread in sorted(set(free["gil"]["threads"]) | set(hot["gil"]["threads"])):
            a, b = (side["gil"]["threads"].get(thread, {}).get("per_step", 0.0) for side in (free, hot))
            print(f"  {thread:40s} {a:8.3f} {b:8.3f} {b - a:+8.3f}")


def _thread_name(label: str) -> str:
    """py-spy's ``thread (1220): hotwire-mailbox`` without the id, so servers compare."""
    return label.split(": ", 1)[-1]


def summarize_gil(raw: Path, steps: int, seconds: float, rate: int) -> dict:
    """Who holds the GIL: samples per thread, per engine step and as a share of all samples taken
    (the rest: no thread held it)."""
    threads: Counter[str] = Counter()
    for thread, _, count in _stacks(raw):
        threads[_thread_name(thread)] += count
    taken = max(1, int(seconds * rate))
    per_step = max(steps, 1)
    return {"steps": steps, "held_share": round(sum(threads.values()) / taken, 4),
            "threads": {name: {"per_step": round(n / per_step, 4), "share": round(n / taken, 4)}
                        for name, n in threads.most_common()}}


def main() -> None:
    t0 = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--settle-s", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=15.0, help="profile length per server (default 15)")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    ap.add_argument("--simultaneous", action="store_true",
                    help="both servers under their own load at once, profiled over the same seconds (default: "
                         "one server at a time)")
    ap.add_argument("--gil-seconds", type=float, default=0.0,
                    help="then, under the same load, this long sampling only the thread that holds the GIL "
                         "(default 0: not)")
    ap.add_argument("--mps", action="store_true",
                    help="--simultaneous: the servers under NVIDIA's Multi-Process Service (mps.py)")
    ap.add_argument("--step-phases", action="store_true",
                    help="time every engine core's step phase by phase over the profile (bench_site/step_phases.py)")
    ap.add_argument("--sync-debug", action="store_true",
                    help="with --step-phases: torch warns in each server's log wherever it synchronizes with the GPU")
    profiled = [k for k, kind in KINDS.items() if not kind.original and not kind.eager]
    ap.add_argument("--servers", nargs="+", choices=profiled, default=["plugin_free", "hotwire"],
                    help="the servers profiled, the first the base each other is compared with (default: "
                         "plugin_free hotwire; e.g. hotwire_unsteered hotwire: what steering adds)")
    add_common_args(ap)
    args = ap.parse_args()
    gpu = start_run(args.smoke, args.timed_configs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise SystemExit("no py-spy on PATH (pip install py-spy)")
    if len(args.servers) < 2 or len(set(args.servers)) != len(args.servers):
        raise SystemExit(f"--servers: two or more kinds, each once (got {' '.join(args.servers)})")
    prompt_len, max_tokens = (16, 8) if args.smoke else (128, 128)
    work = Path(tempfile.mkdtemp(prefix="hotwire-profile-"))
    if args.step_phases:
        args.step_phases = step_phases.enable(work, args.sync_debug)
    model, shape_name = benchmark_model(work, args.shape, args.smoke)
    shape = json.loads((model / "config.json").read_text())
    write_vectors(work / "vectors", shape["hidden_size"])
    engine = engine_args(shape, args.smoke, args.concurrency, prompt_len, max_tokens, GPU_MEMORY_UTILIZATION)
    processes = default_processes(args.concurrency) if args.simultaneous else args.client_processes
    clients, per_core = (len(args.servers) * processes, CLIENTS_PER_CORE) if args.simultaneous else (processes, 1)
    plan = None if args.smoke else cpu_plan([SERVER_CORES] * len(args.servers), clients, per_core)
    if plan is not None:
        os.sched_setaffinity(0, plan[1])
    layers = steered_layers(shape["num_hidden_layers"])
    servers = [make_server(name, work, model, engine, ",".join(map(str, layers)), plan and plan[0][i])
               for i, name in enumerate(args.servers)]
    make = dict(vocab=shape["vocab_size"], layers=layers, fraction=args.steered_fraction, prompt_len=prompt_len,
                max_tokens=(max_tokens // 2, max_tokens + max_tokens // 2), seed=7)
    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "gpu": gpu or "cpu", "shape": shape_name, "engine": engine, "concurrency": args.concurrency,
              "steered_fraction": args.steered_fraction, "seconds": args.seconds, "rate": args.rate,
              "simultaneous": args.simultaneous, "servers": {}}
    load = LoadSet(servers, processes) if args.simultaneous else Load(processes)
    client = httpx.Client(timeout=30)
    busy_s = args.settle_s + args.seconds + args.gil_seconds
    with Mps(work, servers) if args.mps else contextlib.nullcontext() as mps, running(servers, load, client):
        for s in servers:
            s.start()
        result["startup_s"] = wait_ready(servers, t0)
        if mps is not None:
            mps.check()
        if args.simultaneous:
            load.start(args.concurrency, make, time.time() + busy_s + 120, processes)
            load.wait(time.monotonic() + args.settle_s)
            result["servers"] = _profile(servers, client, pyspy, args)
            load.stop()
        else:
            for s in servers:
                load.start(s.url, args.concurrency, load_of(s.name, make), time.time() + busy_s + 120)
                load.wait(time.monotonic() + args.settle_s)
                result["servers"].update(_profile([s], client, pyspy, args))
                load.stop()
                s.wait_idle(client)
    result["base"], result["compared"] = args.servers[0], {}
    for name in args.servers[1:]:
        compare(args.servers[0], name, result, args.rate)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
