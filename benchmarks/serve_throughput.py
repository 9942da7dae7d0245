"""Served throughput: ``vllm serve`` with hotwire (half the requests steered) vs a plugin-free server.

Why: the served target is output tokens/s with hotwire loaded and 50 % of the requests steered
>= 0.99 x the plugin-free server, at 64 and 256 concurrent requests, resolved: the 95 % interval of
the ratio narrower than 1 % and on one side of 0.99. A server armed only on the two layers the
requests steer splits the cost of arming every layer (one kernel per armed layer per step) from the
rest, and an eager-mode hotwire server gives the contrast (``--enforce-eager``: no torch.compile, no
CUDA graphs, what hook-based steering pays), as does the plugin this one grew out of (hotwire-vllm
0.1.2 from PyPI, ``original``). Separate server processes on the lent H200 differ by
up to 30 % from one start to the next, so the servers run side by side in one run and every ratio
pairs two windows measured back to back. Rounds that timed a fixed set of requests from first send
to last answer scattered by 5-12 % (ramp-up and tail), so the intervals straddled 0.99; this
measures the steady state instead (``serving.py``: windows).

How:
* Servers: ``python -m vllm.entrypoints.openai.api_server`` subprocesses, each in its own session
  (its process group is killed on exit), started together and awaited on ``/health`` (a server that
  dies fails the run at once, with its log tail): ``plugin_free`` (``VLLM_PLUGINS=none``; checked to
  create no mailbox), ``hotwire`` (the plugin loaded through its entry point, 256 random startup
  vectors from ``HOTWIRE_VECTORS``, its own ``HOTWIRE_MAILBOX``, every layer armed), ``hotwire_2``
  (the same, ``HOTWIRE_LAYERS`` = the two steered layers), ``eager`` (hotwire with
  ``--enforce-eager``) and ``original`` (hotwire-vllm 0.1.2 installed in ``--original-site``, run
  alone: ``original_plugin.py`` says why that takes more than ``PYTHONPATH``, and checks with vLLM's
  own plugin loader that it loads exactly that plugin; the startup vectors as ``.pt`` files,
  ``HOTWIRE_SLOTS`` = the distinct entries of the spec pool, 256), as ``--servers`` lists them.
  GPU: a Qwen3 shape (``write_config``), ``--load-format dummy``, bf16, ``TRITON_ATTN``,
  ``--skip-tokenizer-init`` (prompts are token ids; vLLM returns token ids without detokenizing,
  which suits a dummy model's arbitrary ids), vLLM's default torch.compile and CUDA graphs. Each
  server is pinned to its own ``SERVER_CORES`` physical cores and the load generator to the rest
  (``cpu_plan``; skipped when the CPUs are too few, and within ``taskset`` when run under it). The
  servers share one GPU: each gets ``--gpu-memory-utilization 0.25`` and an explicit
  ``--kv-cache-memory-bytes`` (room for every request at the largest concurrency, so nothing is
  preempted).
* Load: ``/v1/completions`` with random token-id prompts (128 tokens), ``max_tokens`` uniform in
  64-192 (each slot's first request the rest of one under way: the load starts in its steady
  state, ``serving.bodies``), ``ignore_eos``, greedy; every other request carries ``"vllm_xargs": {"hotwire": spec}``
  (``--steered-fraction``) with two entries, on layers n/3 and 2n/3, each its own vector and scale;
  with ``original`` among the servers, the specs of the first ``ORIGINAL_POOL`` (128) requests of
  the stream, in turn (``serving.bodies``: ``pool``; the JSON's ``spec_pool``), since the original
  keeps a slot for every distinct (id, layer, scale) for good and leaves an entry it cannot hold
  unsteered.
  A closed loop keeps exactly C requests in flight, spread over ``--client-processes`` processes
  (asyncio + httpx each). Every server of a round is sent the same request sequence (a plugin-free
  server ignores the spec).
* A window, one server at a time (the others idle): start the load, let it settle ``--settle-s``,
  read ``/metrics``, wait ``--window-s``, read again, then stop the load (its requests in flight are
  cancelled, and counted) and wait until the server runs nothing. Tokens/s = the difference of the
  server's ``vllm:generation_tokens_total`` over the time between the two reads.
* Order: per concurrency, a warm-up window per server (not in the ratios), then rounds of two
  windows per server, A B B A (the next round B A A B), until ``--rounds`` or until the next round
  would overrun ``--budget-s`` (the remaining budget is split evenly over the concurrencies still
  to run). Why: on the H200 the server measured right after the other one's window was the slower
  one in 7 of 8 rounds of one window each (10-25 %), whichever it was; in A B B A each server has
  one window after the other's and one after its own, and linear drift cancels. Per round the
  ratio of each server's mean tokens/s to plugin-free's; reported: the median
  ratio, its range, a bootstrap 95 % interval of the median and that interval's width, and a verdict:
  "met" or "not met" only when the interval lies on one side of 0.99 (and at least
  ``MIN_ROUNDS`` rounds ran), "unresolved" otherwise; ``resolved``: the interval is narrower than 1 %.
* Where the time goes, per window: engine steps (``vllm:iteration_tokens_total``) and wall ms per
  step, CPU seconds per server process (API server, engine core; CUDA's spin-wait counts as busy)
  and of the load generator, and for hotwire servers hotwire's own host time from its mailbox
  counters (``host_stats``): µs per step overall, on steady steps and on steps where requests came
  or went, per hook (engine core, rank's schedule hook, rank's batch routing), its share of the
  window, and its heartbeat thread's CPU share. These counters are published by the engine's
  heartbeat, so their deltas run between the two heartbeats last published before the window's
  edges (a window of 5 s spans 5-20 of them); counters an engine does not publish are left out.
* Checks (a benchmark that silently stops steering must fail): every completed response is 200 with
  ``usage.completion_tokens == max_tokens`` (a dropped connection is re-sent up to twice and
  counted, ``resent``; a failed run prints every server's log tail); per window, after the server
  went idle, each hotwire server's mailbox counters count at least the steered requests that
  completed and at most those sent, and no ``unsteered_*`` refusal; no preemption. At start and at
  the end, every server that steers answers one greedy request steered otherwise than unsteered, and
  unsteered as plugin-free does (but ``eager``, whose kernels differ): ``serving.probe_steering``,
  the answers in the JSON's ``steering_probe``. The original has no counters: it warns on stderr of
  every entry it leaves unsteered (bank full, unknown id, malformed spec, a failed fill), and such a
  line in its log fails the run (``original_plugin.LogWatch``, read after every window).

The JSON (``--out``) is rewritten after every round, so a time-out keeps what was measured.
Run time: start-up (~2 min at 0.6B on the H200, the servers in parallel) plus, per server window,
``--settle-s`` + ``--window-s`` + ~1 s (stop, drain); with the defaults and two servers a round (four
windows) takes ~32 s, so the default budget (450 s) fits a warm-up and ~4 rounds at each of 64 and
256 in flight; give one concurrency the whole budget for more.
An ``eager`` server steps ~50 ms on the H200 (``decode.py``): give it a longer settle.
A third server makes a round six windows (~48 s).
``--smoke`` runs the tiny random model on CPU (fp32, eager, small lengths and concurrency): it
checks the script end to end; its numbers mean nothing. It refuses ``original``: the original
cannot steer on CPU (``original_plugin.py``).

The original, on a machine without network (``h200.sh serve`` installs it from there when present):

    pip download hotwire-vllm==0.1.2 --no-deps -d .device/extra      # here; the folder travels
    pip install --no-deps --no-index --target /tmp/hotwire-vllm-0.1.2 .device/extra/hotwire_vllm-0.1.2-py3-none-any.whl

    python benchmarks/serve_throughput.py --shape qwen3-0.6b --out benchmarks/results/h200-DATE-serve-qwen3-0.6b.json
    python benchmarks/serve_throughput.py --servers hotwire original --original-site /tmp/hotwire-vllm-0.1.2 --out OUT.json
    python benchmarks/serve_throughput.py --smoke --out /tmp/serve-smoke.json   # CPU, end to end only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import numpy as np

import original_plugin
from hotwire.shared.mailbox import clock_ns
from hotwire.tools.tiny_model import benchmark_model, steered_layers
from serving import (SERVER_CORES, Load, Server, add_common_args, check_steering, cpu_plan, engine_args, median,
                     median_ci, pool_entries, probe_steering, running, snapshot, start_run, startup_vectors,
                     steer_spec, verdict, wait_ready, window_row, write_vectors)

TARGET = 0.99
MIN_ROUNDS = 5  # fewer rounds' bootstrap interval is too narrow to trust: "unresolved"
RESOLVED_WIDTH = 0.01  # the target asks for a 95 % interval narrower than this
GPU_MEMORY_UTILIZATION = 0.25  # per server: what vLLM checks is free at its start (the KV cache is sized)
SERVERS = {  # name: (hotwire loaded, --enforce-eager, armed only on the steered layers, the original instead)
    "plugin_free": (False, False, False, False),
    "hotwire": (True, False, False, False),
    "hotwire_2": (True, False, True, False),
    "eager": (True, True, False, False),
    "original": (False, False, False, True),
}
CONTRASTS = ("eager", "original")  # reported beside plugin-free; the target is on the others
ORIGINAL_POOL = 128  # specs the steered requests draw from when the original runs: 256 slots
PROBE_TOKENS = 16
HOST_FIELDS = ("host_us_per_step", "steady_us_per_step", "changed_us_per_step", "core_us_per_step",
               "schedule_us_per_step", "batch_us_per_step", "hotwire_host_share", "heartbeat_cpu_share")


def _server(name: str, work: Path, model: Path, engine: dict, steered: str, cpus: list[int] | None,
            original: dict[str, str] | None) -> Server:
    plugin, eager, two, orig = SERVERS[name]
    if orig:
        return Server(name, work, model, engine, plugin=False, vectors=work / "vectors-pt", cpus=cpus, env=original)
    return Server(name, work, model, {**engine, "enforce_eager": True} if eager else engine, plugin=plugin,
                  vectors=work / "vectors", cpus=cpus, env={"HOTWIRE_LAYERS": steered} if two else None)


def _check_original_args(args: argparse.Namespace, names: list[str]) -> None:
    """``--servers original`` comes with ``--original-site`` and without ``--smoke``, and the other way round."""
    if "original" not in names:
        if args.original_site is not None:
            raise SystemExit("--original-site given, but original is not among --servers")
    elif args.smoke:
        raise SystemExit("--servers original needs a CUDA GPU: hotwire-vllm 0.1.2 steers with a Triton kernel, "
                         "and on vLLM's CPU runner its model patch never runs (original_plugin.py)")
    elif args.original_site is None:
        raise SystemExit(f"--servers original needs --original-site DIR: pip install --no-deps --target DIR "
                         f"{original_plugin.WHEEL}")


def _original(args: argparse.Namespace, names: list[str], work: Path, layers: tuple[int, int],
              hidden: int) -> tuple[dict[str, str] | None, dict | None]:
    """The original's server environment and what the JSON records of it (None, None without it):
    checked to load exactly that plugin, its vectors written as ``.pt``."""
    if "original" not in names:
        return None, None
    site = args.original_site
    installed = original_plugin.installed_version(site)
    env = original_plugin.server_env(site, work)
    original_plugin.check_plugins(env, site)
    original_plugin.write_pt_vectors(work / "vectors-pt", startup_vectors(hidden))
    slots = len(pool_entries(ORIGINAL_POOL, layers))
    return {**env, "HOTWIRE_SLOTS": str(slots)}, {
        "site": str(site), "version": installed, "entry_point": original_plugin.ENTRY, "slots": slots}


def _probe(servers: list[Server], client: httpx.Client, layers: tuple[int, int], vocab: int,
           prompt_len: int) -> dict:
    """``serving.probe_steering`` on every server that steers (unsteered answers compared with
    plugin-free's where the engine flags are the same: not the eager one)."""
    steering = [s for s in servers if SERVERS[s.name][0] or SERVERS[s.name][3]]
    exact = {s.name for s in steering if not SERVERS[s.name][1]}
    prompt = np.random.default_rng(7).integers(10, vocab - 10, prompt_len).tolist()
    return probe_steering(servers[0], steering, exact, client, prompt, steer_spec(0, layers), PROBE_TOKENS)


def _check_log(server: Server, watches: dict) -> None:
    """The original's log holds none of its warnings that an entry ran unsteered."""
    if server.name in watches and (failed := watches[server.name].failures()):
        raise SystemExit(f"{server.name}: the original left entries unsteered:\n" + "\n".join(failed[:20]))


def _window(load: Load, server: Server, client: httpx.Client, concurrency: int, make: dict,
            args: argparse.Namespace, pending: dict, watches: dict) -> dict:
    """One window on one server (see the module's docstring). Its steering check waits for a
    heartbeat published after the server went idle: it runs at the server's next window (by then
    another server's window has usually passed), or at the end (``_check_pending``); the original's
    log is read once the server is idle."""
    before = _check_pending(server, pending) if server.plugin else None
    deadline = time.time() + args.settle_s + args.window_s + 120  # the processes' own stop, should this one hang
    load.start(server.url, concurrency, make, deadline)
    load.wait(time.monotonic() + args.settle_s)
    a = snapshot(server, client)
    load.wait(a["metrics"]["t"] + args.window_s)
    b = snapshot(server, client)
    sent = load.stop()
    row = window_row(a, b)
    row["drain_s"] = round(server.wait_idle(client), 3)
    row.update({k: sent.get(k, 0) for k in ("completed", "cancelled", "resent")},
               ms_per_token_p50=sent["ms_per_token_p50"], client_cpu_s=sent["client_cpu_s"])
    if row["preemptions"]:
        raise SystemExit(f"{server.name}: {row['preemptions']} preemptions: the KV cache is too small")
    if server.plugin:
        pending[server.name] = (row, before, sent, clock_ns())
    _check_log(server, watches)
    return row


def _check_pending(server: Server, pending: dict) -> dict[str, int]:
    """Check the server's last window's steering (if one is pending); its counters now."""
    if server.name not in pending:
        return server.counters_after(clock_ns())
    row, before, sent, idle_ns = pending.pop(server.name)
    after = server.counters_after(idle_ns)
    row["steered_counted"] = check_steering(server.name, before, after, sent)
    return after


# ---------------------------------------------------------------- report
def _summary(samples: list[dict], concurrency: list[int], names: list[str]) -> list[dict]:
    rounds_by_c = {}
    for s in samples:
        if s["round"] >= 0:
            rounds_by_c.setdefault(s["concurrency"], {}).setdefault(s["round"], {}).setdefault(s["server"], []).append(s)
    rows = []
    for c in concurrency:
        rounds = rounds_by_c.get(c, {})
        full = [r for _, r in sorted(rounds.items()) if len(r) == len(names) and
                len({len(w) for w in r.values()}) == 1]
        if not full:
            continue
        row = {"concurrency": c, "rounds": len(full)}
        for n in names:
            mine = [x for r in full for x in r[n]]  # every window of the server
            row[f"{n}_tokens_per_s"] = round(median([x["tokens_per_s"] for x in mine]), 1)
            row[f"{n}_step_ms"] = round(median([x["step_ms"] for x in mine]), 3)
            row[f"{n}_steps"] = round(median([x["steps"] for x in mine]))
            row[f"{n}_window_s"] = round(median([x["window_s"] for x in mine]), 2)
            procs = sorted({p for x in mine for p in x["cpu_s"]})
            row[f"{n}_cpu_s"] = {p: round(median([x["cpu_s"].get(p, 0.0) for x in mine]), 2) for p in procs}
            row[f"{n}_client_cpu_s"] = round(median([sum(x["client_cpu_s"]) for x in mine]), 2)
            for field in HOST_FIELDS:
                value = median([x.get(field) for x in mine])
                if value is not None:
                    row[f"{n}_{field}"] = round(value, 5)
        for n in names[1:]:
            ratios = [_mean_tokens(r[n]) / _mean_tokens(r["plugin_free"]) for r in full]
            ci = median_ci(ratios)
            row[f"{n}_over_plugin_free"] = round(median(ratios), 4)
            row[f"{n}_over_plugin_free_range"] = [round(min(ratios), 4), round(max(ratios), 4)]
            row[f"{n}_over_plugin_free_ci95"] = ci
            row[f"{n}_over_plugin_free_ci_width"] = round(ci[1] - ci[0], 4)
            row[f"{n}_resolved"] = ci[1] - ci[0] < RESOLVED_WIDTH
        # the target is on compiled hotwire servers; eager and the original are the contrasts
        row["target"] = {n: verdict(row[f"{n}_over_plugin_free_ci95"], TARGET, at_least=True)
                         if len(full) >= MIN_ROUNDS else "unresolved" for n in names[1:] if n not in CONTRASTS}
        rows.append(row)
    return rows


def _mean_tokens(windows: list[dict]) -> float:
    return sum(w["tokens_per_s"] for w in windows) / len(windows)


def _markdown(rows: list[dict], names: list[str]) -> str:
    head = ["concurrency", "rounds"] + [f"{n} tok/s" for n in names] + \
           [f"{n}/plugin_free (min-max) [95 % CI] width" for n in names[1:]]
    out = [("generated tokens/s over steady-state windows, median over rounds; ratios: median of per-round "
            "ratios, with their range, a bootstrap 95 % interval of the median and its width"), "",
           "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [str(r["concurrency"]), str(r["rounds"])] + [f"{r[f'{n}_tokens_per_s']:g}" for n in names] + \
                [f"{r[f'{n}_over_plugin_free']:.4f} ({r[f'{n}_over_plugin_free_range'][0]:.4f}-"
                 f"{r[f'{n}_over_plugin_free_range'][1]:.4f}) [{r[f'{n}_over_plugin_free_ci95'][0]:.4f}-"
                 f"{r[f'{n}_over_plugin_free_ci95'][1]:.4f}] {r[f'{n}_over_plugin_free_ci_width']:.4f}"
                 for n in names[1:]]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", ("where a window's time goes, medians: engine steps, wall ms per step, CPU s per server process, "
                 "CPU s of all load-generator processes"), "",
            "| concurrency | server | window s | steps | ms/step | server CPU s | client CPU s |", "|" + " --- |" * 7]
    for r in rows:
        for n in names:
            cpu = ", ".join(f"{p} {v:g}" for p, v in r[f"{n}_cpu_s"].items())
            out.append(f"| {r['concurrency']} | {n} | {r[f'{n}_window_s']:g} | {r[f'{n}_steps']} | "
                       f"{r[f'{n}_step_ms']:.3f} | {cpu} | {r[f'{n}_client_cpu_s']:g} |")
    hot = [n for n in names if SERVERS[n][0]]
    if hot:
        out += ["", ("hotwire's host time per engine step (µs, medians over windows): all steps, steady steps, "
                     "steps where requests came or went, per hook (engine core, rank's schedule, rank's batch "
                     "routing); its share of the window and its heartbeat thread's CPU share (%); - : not "
                     "published by this engine"), "",
                "| concurrency | server | all | steady | changed | core | schedule | batch | host % | heartbeat % |",
                "|" + " --- |" * 10]
        for r in rows:
            for n in hot:
                cells = []
                for field in HOST_FIELDS:
                    v = r.get(f"{n}_{field}")
                    cells.append("-" if v is None else f"{100 * v:.2f}" if field.endswith("share") else f"{v:.2f}")
                out.append(f"| {r['concurrency']} | {n} | " + " | ".join(cells) + " |")
    out.append("")
    for r in rows:
        verdicts = [f"{n}/plugin-free {r[f'{n}_over_plugin_free']:.4f} [{r[f'{n}_over_plugin_free_ci95'][0]:.4f}-"
                    f"{r[f'{n}_over_plugin_free_ci95'][1]:.4f}] (width {r[f'{n}_over_plugin_free_ci_width']:.4f}"
                    f"{'' if r[f'{n}_resolved'] else ', not below 0.01'}): {v}" for n, v in r["target"].items()]
        contrasts = [f"{n}/plugin-free {r[f'{n}_over_plugin_free']:.4f} [{r[f'{n}_over_plugin_free_ci95'][0]:.4f}-"
                     f"{r[f'{n}_over_plugin_free_ci95'][1]:.4f}]" for n in CONTRASTS if n in names]
        out.append(f"C={r['concurrency']} (target >= {TARGET}, {r['rounds']} rounds): " +
                   "; ".join(verdicts + contrasts))
    return "\n".join(out)


# ---------------------------------------------------------------- main
def main() -> None:
    t0 = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", help="requests in flight (default 64 256; smoke: 4 8)")
    ap.add_argument("--rounds", type=int,
                    help="most rounds per concurrency (default 30: the budget ends them; smoke: 2)")
    ap.add_argument("--window-s", type=float, help="measured window per server and round (default 5; smoke 3)")
    ap.add_argument("--settle-s", type=float, default=2.0, help="load before a window starts (default 2)")
    ap.add_argument("--servers", nargs="+", choices=list(SERVERS), default=["plugin_free", "hotwire"],
                    help="servers side by side (plugin_free is always one: the ratios are on it)")
    ap.add_argument("--original-site", type=Path,
                    help=f"folder holding {original_plugin.DIST} {original_plugin.VERSION} (pip install --no-deps "
                         "--target), for --servers original")
    add_common_args(ap)
    args = ap.parse_args()
    names = ["plugin_free"] + [n for n in dict.fromkeys(args.servers) if n != "plugin_free"]
    _check_original_args(args, names)
    gpu = start_run(args.smoke)
    concurrency = args.concurrency or ([4, 8] if args.smoke else [64, 256])
    rounds = args.rounds or (2 if args.smoke else 30)
    args.window_s = args.window_s or (3.0 if args.smoke else 5.0)
    prompt_len, max_tokens = (16, 8) if args.smoke else (128, 128)
    lengths = (max_tokens // 2, max_tokens + max_tokens // 2)
    work = Path(tempfile.mkdtemp(prefix="hotwire-serve-"))

    model, shape_name = benchmark_model(work, args.shape, args.smoke)
    shape = json.loads((model / "config.json").read_text())
    layers = steered_layers(shape["num_hidden_layers"])
    original_env, original = _original(args, names, work, layers, shape["hidden_size"])
    pool = ORIGINAL_POOL if original else None
    write_vectors(work / "vectors", shape["hidden_size"])
    engine = engine_args(shape, args.smoke, max(concurrency), prompt_len, max_tokens, GPU_MEMORY_UTILIZATION)
    plan = None if args.smoke else cpu_plan([SERVER_CORES] * len(names), args.client_processes)
    if plan is not None:
        os.sched_setaffinity(0, plan[1])  # this process and the load generator's, which inherit it
    servers = [_server(n, work, model, engine, ",".join(map(str, layers)), plan and plan[0][i], original_env)
               for i, n in enumerate(names)]

    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "host": platform.node(), "gpu": gpu or "cpu", "torch": version("torch"), "shape": shape_name,
              "config": {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
              "engine": engine, "servers": names, "concurrency": concurrency, "max_rounds": rounds,
              "window_s": args.window_s, "settle_s": args.settle_s, "budget_s": args.budget_s,
              "prompt_len": prompt_len, "max_tokens_range": lengths, "steered_fraction": args.steered_fraction,
              "spec_pool": pool, "original": original, "client_processes": args.client_processes,
              "cpus": None if plan is None else {**{n: plan[0][i] for i, n in enumerate(names)}, "clients": plan[1]},
              "env": {k: os.environ[k] for k in ("VLLM_USE_V2_MODEL_RUNNER",) if k in os.environ},
              "phases_s": {}, "stopped_by": {}, "samples": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"work dir (server logs): {work}", flush=True)
    load = Load(args.client_processes)
    pending: dict = {}
    watches = {s.name: original_plugin.LogWatch(s.log) for s in servers if SERVERS[s.name][3]}
    client = httpx.Client(timeout=30)
    with running(servers, load, client):
        for s in servers:
            s.start()
        result["startup_s"] = wait_ready(servers, t0)
        result["vllm"] = client.get(servers[0].url + "/version").json().get("version")
        result["steering_probe"] = {"start": _probe(servers, client, layers, shape["vocab_size"], prompt_len)}
        for s in servers:
            _check_log(s, watches)
        result["phases_s"]["startup"] = round(time.monotonic() - t0, 1)
        print(f"startup: {result['phases_s']['startup']:.0f} s (vLLM {result['vllm']})", flush=True)
        deadline = t0 + args.budget_s
        for i, c in enumerate(concurrency):
            c_end = time.monotonic() + (deadline - time.monotonic()) / (len(concurrency) - i)
            make = dict(vocab=shape["vocab_size"], layers=layers, fraction=args.steered_fraction,
                        prompt_len=prompt_len, max_tokens=lengths, pool=pool)
            t = time.monotonic()
            for s in servers:
                row = _window(load, s, client, c, {**make, "seed": 10_000 + c}, args, pending, watches)
                result["samples"].append({"concurrency": c, "round": -1, "server": s.name, **row})
                print(f"C={c} warm-up {s.name}: {row['tokens_per_s']:.0f} tok/s", flush=True)
            result["phases_s"][f"c{c}_warmup"] = round(time.monotonic() - t, 1)
            t_rounds, last = time.monotonic(), time.monotonic() - t
            result["stopped_by"][str(c)] = "rounds"
            for r in range(rounds):
                if time.monotonic() + last > c_end:
                    result["stopped_by"][str(c)] = "budget"
                    break
                t = time.monotonic()
                order = servers if r % 2 == 0 else servers[::-1]
                order = order + order[::-1]  # A B B A: each server once after the other, once after itself
                rows: dict[str, list[dict]] = {}
                for s in order:
                    w = _window(load, s, client, c, {**make, "seed": 1000 * c + r}, args, pending, watches)
                    rows.setdefault(s.name, []).append(w)
                    result["samples"].append({"concurrency": c, "round": r, "server": s.name, **w})
                result["rows"] = _summary(result["samples"], concurrency, names)
                args.out.write_text(json.dumps(result, indent=1))  # partial results survive a time-out
                last = time.monotonic() - t
                pf = _mean_tokens(rows["plugin_free"])
                cells = [f"{n} {_mean_tokens(rows[n]):.0f}" for n in names] + \
                        [f"{n}/plugin_free {_mean_tokens(rows[n]) / pf:.4f}" for n in names[1:]]
                host = [f"{n} {rows[n][-1]['steady_us_per_step']:.1f}" for n in names
                        if rows[n][-1].get("steady_us_per_step") is not None]
                print(f"C={c} round {r} ({' '.join(s.name for s in order)}): tok/s {', '.join(cells)}"
                      + (f"; steady host µs/step {', '.join(host)}" if host else "") + f" ({last:.0f} s)", flush=True)
            result["phases_s"][f"c{c}_rounds"] = round(time.monotonic() - t_rounds, 1)
        for s in servers:
            if s.name in pending:
                _check_pending(s, pending)
        result["steering_probe"]["end"] = _probe(servers, client, layers, shape["vocab_size"], prompt_len)
        for s in servers:
            _check_log(s, watches)
    result["phases_s"]["total"] = round(time.monotonic() - t0, 1)
    result["rows"] = _summary(result["samples"], concurrency, names)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{shape_name} on {result['gpu']}, vLLM {result['vllm']}, {args.steered_fraction:.0%} steered, "
          f"prompt {prompt_len} + {lengths[0]}-{lengths[1]} tokens, windows {args.window_s:g} s after "
          f"{args.settle_s:g} s, phases {result['phases_s']}"
          + (" (smoke: the numbers mean nothing)" if args.smoke else "") + "\n")
    print(_markdown(result["rows"], names))


if __name__ == "__main__":
    main()
