"""Served throughput: ``vllm serve`` with hotwire (half the requests steered) vs a plugin-free server.

Why: the served target is output tokens/s with hotwire loaded and 50 % of the requests steered
>= 0.99 x the plugin-free server, at 64 and 256 concurrent requests, resolved: the 95 % interval of
the ratio narrower than 2 % and on one side of 0.99. A server armed only on the two layers the
requests steer splits the cost of arming every layer (one kernel per armed layer per step) from the
rest, and an eager-mode hotwire server gives the contrast (``--enforce-eager``: no torch.compile, no
CUDA graphs, what hook-based steering pays), as does the plugin this one grew out of (hotwire-vllm
0.1.2 from PyPI, ``original``), and a second plugin-free server (``plugin_free_2``) gives the
method's own null: its ratio to plugin-free should be 1 within the interval. Separate server
processes on the lent H200 differ by up to 30 % from one start to the next, so the servers run side
by side in one run and every ratio pairs windows measured close together. Rounds that timed a fixed
set of requests from first send to last answer scattered by 5-12 % (ramp-up and tail), so the
intervals straddled 0.99; this measures the steady state instead (``serving.py``: windows).

Two designs. Sequential (the default): one server under load at a time, A B B A. Simultaneous
(``--simultaneous``): every server under its own load at once, each ratio of two windows over the
same seconds. On the H200 one server's sequential windows scattered by 8-14 % and consecutive
windows' residuals were correlated whichever server ran: much of the noise is common to whatever
runs at that moment (the host, a shared machine), which only windows over the same seconds cancel
(``simultaneous.py``). But servers under load at once on one GPU also share it, and sharing is not
neutral: at the Qwen3 8B shape, 64 in flight, hotwire made 0.917 of plugin-free's tokens/s sharing
the GPU by time slices (session 36), while one engine alone on the GPU ran its steps as fast with
hotwire as without (session 37). ``--gpu-each`` keeps the design and drops the sharing: each server
on a GPU of its own, as served in production (two GPUs for two servers).

How:
* Servers: ``python -m vllm.entrypoints.openai.api_server`` subprocesses, each in its own session
  (its process group is killed on exit), started together and awaited on ``/health`` (a server that
  dies fails the run at once, with its log tail), of the kinds ``server_kinds.py`` names:
  ``plugin_free`` (``VLLM_PLUGINS=none``; checked to create no mailbox), ``plugin_free_2`` (the same
  flags: the A/A control, reported as a contrast), ``plugin_free_own_compile`` (the same, compiled in vLLM,
  inductor and Triton caches of its own: a contrast), ``hotwire`` (the plugin loaded through its entry point, 256 random
  startup vectors from ``HOTWIRE_VECTORS``, its own ``HOTWIRE_MAILBOX``, every layer armed),
  ``hotwire_2`` (the same, ``HOTWIRE_LAYERS`` = the two steered layers), ``hotwire_one_graph`` (the same
  as ``hotwire`` with ``HOTWIRE_IDLE_GRAPHS=0``: one set of graphs, the op in each), ``hotwire_again``
  (``hotwire`` once more: with ``--cores-order`` it tells a cost that follows hotwire from one that
  follows the cores), ``hotwire_unarmed`` (hotwire loaded with ``HOTWIRE_LAYERS`` empty: what it costs
  with nothing to steer; a contrast), ``hotwire_unsteered`` (``hotwire``, sent the same requests
  without their specs: what the plugin costs while nobody steers; a contrast; ``hotwire_unsteered_2``
  and ``hotwire_unsteered_14`` the same armed on the two steered layers and on the first 14: what
  each armed layer costs), ``hotwire_refused``
  (``hotwire``, sent the same specs naming vectors it does not hold: each parsed, salted and refused
  at admission, then run unsteered; what a spec's arrival costs without routing or the op; a
  contrast), ``hotwire_host_only`` (``hotwire``, its steps all idle on the GPU: steering's host work
  alone; a contrast), ``hotwire_graphs_only`` (``hotwire``, its steps run without a graph launching no
  op; a contrast), ``hotwire_dispatched`` (``hotwire``, every op call through torch's dispatcher; a
  contrast; these three through ``bench_site/op_off.py``), ``eager`` (hotwire with ``--enforce-eager``) and ``original``
  (hotwire-vllm 0.1.2 installed in ``--original-site``, run alone: ``original_plugin.py`` says why that
  takes more than ``PYTHONPATH``, and checks with vLLM's own plugin loader that it loads exactly that
  plugin; the startup vectors as ``.pt`` files, ``HOTWIRE_SLOTS`` = the distinct entries of the spec
  pool, 256), as ``--servers`` lists them, at
  most ``MAX_SERVERS`` (4).
  GPU: a Qwen3 shape (``write_config``), ``--load-format dummy``, bf16, ``TRITON_ATTN``,
  ``--skip-tokenizer-init`` (prompts are token ids; vLLM returns token ids without detokenizing,
  which suits a dummy model's arbitrary ids), vLLM's default torch.compile and CUDA graphs. Each
  server is pinned to its own ``SERVER_CORES`` physical cores (in ``--cores-order``, default the order of
  ``--servers`` with plugin-free first; with ``--rotate-cores N`` every N windows each server's
  processes move onto the next server's set, so that every server runs on every set: two identical
  servers differed by 2.5 % on two sets in session 15) and the load generator to the rest
  (``cpu_plan``: one core per process of the sequential load; simultaneous, all servers' load
  processes, ``CLIENTS_PER_CORE`` to a core; skipped when the CPUs are too few, and within
  ``taskset`` when run under it). The servers share one GPU (with ``--gpu-each``, one GPU each;
  with ``--mps`` under NVIDIA's Multi-Process Service, their kernels at once rather than in turns,
  and with ``--mps-split`` each on its own equal share of the SMs: ``mps.py``): each gets
  ``--gpu-memory-utilization 0.25`` and an explicit ``--kv-cache-memory-bytes`` (room for every
  request at the largest concurrency, so nothing is preempted).
* Load: ``/v1/completions`` with random token-id prompts (128 tokens), ``max_tokens`` uniform in
  64-192 (each slot's first request the rest of one under way: the load starts in its steady
  state, ``serving.bodies``), ``ignore_eos``, greedy; every other request carries ``"vllm_xargs": {"hotwire": spec}``
  (``--steered-fraction``) with two entries, on layers n/3 and 2n/3, each its own vector and scale;
  with ``original`` among the servers, the specs of the first ``ORIGINAL_POOL`` (128) requests of
  the stream, in turn (``serving.bodies``: ``pool``; the JSON's ``spec_pool``), since the original
  keeps a slot for every distinct (id, layer, scale) for good and leaves an entry it cannot hold
  unsteered.
  A closed loop keeps exactly C requests in flight, spread over load-generator processes (asyncio +
  httpx each): sequential, one load of ``--client-processes`` (default 4) that serves each server in
  turn; simultaneous, one load per server of ``--client-processes`` each (default one per 128 in
  flight: 1 at 64, 2 at 256, so four servers' loads fit beside 4 x 3 pinned cores on the H200's 16,
  ``simultaneous.default_processes``). Every server is sent the same request sequence (a
  plugin-free server ignores the spec).
* A window, sequential, one server at a time (the others idle): start the load, let it settle
  ``--settle-s``, read ``/metrics``, wait ``--window-s``, read again, then stop the load (its
  requests in flight are cancelled, and counted) and wait until the server runs nothing.
  Simultaneous: every server's load starts together and runs without a stop; window edges come
  every ``--window-s``, and at each edge every server's snapshot is read, one server after the
  other, in an order that alternates from edge to edge (``simultaneous.read_order``: a server read
  first at a window's start is read last at its end, so every server's window has the same
  midpoint); each window runs from one edge to the next. Tokens/s = the difference of the server's
  ``vllm:generation_tokens_total`` over the time between its two reads.
* Order: per concurrency, sequential: a warm-up window per server (not in the ratios), then rounds
  of two windows per server, A B B A (the next round B A A B), until ``--rounds`` or until the next
  round would overrun ``--budget-s`` (the remaining budget is split evenly over the concurrencies
  still to run). Why: on the H200 the server measured right after the other one's window was the
  slower one in 7 of 8 rounds of one window each (10-25 %), whichever it was; in A B B A each server
  has one window after the other's and one after its own, and linear drift cancels. Per round the
  ratio of each server's mean tokens/s to plugin-free's. Simultaneous: a warm-up window from the
  load's start (``--settle-s`` + ``--window-s``, its ramp included, not in the ratios), then
  back-to-back windows until ``--rounds`` windows or until the next would end past the
  concurrency's share of the budget; per window the ratio of each server's tokens/s to
  plugin-free's over the same seconds (a "round" of one window per server in the JSON).
  Reported: the median ratio, its range, a bootstrap 95 % interval of the median and that
  interval's width (sequential: rounds drawn independently; simultaneous: a moving-block bootstrap
  in blocks of ``BLOCK`` (3) consecutive windows, since windows back to back may be correlated,
  ``serving.median_ci``), and a verdict: "met" or "not met" only when the interval lies on one side
  of 0.99 (and at least ``MIN_ROUNDS`` rounds, or ``MIN_ROUNDS`` blocks of windows, ran),
  "unresolved" otherwise; ``resolved``: the interval is narrower than 2 %. Simultaneous, also
  ``hotwire`` over every other hotwire kind window by window (``pair_ratio.py``), which cancels
  what the two share.
* Where the time goes, per window: engine steps (``vllm:iteration_tokens_total``) and wall ms per
  step, CPU seconds per server process (API server, engine core; CUDA's spin-wait counts as busy)
  and of the load generator, CPU seconds the hypervisor took from the server's cores (steal time:
  on a VM, a neighbour's load slows a host-bound server's windows unevenly), and for hotwire
  servers hotwire's own host time from its mailbox counters (``host_stats``): µs per step overall,
  on steady steps and on steps where requests came or went, per hook (engine core, rank's schedule
  hook, rank's batch routing), its share of the window, and its heartbeat thread's CPU share. These counters are published by the engine's
  heartbeat, so their deltas run between the two heartbeats last published before the window's
  edges (a window of 5 s spans 5-20 of them); counters an engine does not publish are left out.
  Every window also carries how busy its server's GPU was (``gpu_busy.py``: nvidia-smi's
  ``utilization.gpu``, the mean over the window, the SM clock, the board's power draw and the share
  of samples in which each named reason held the clock down), printed as each server's median and
  ranges: a shared GPU kept busy by every server's kernels makes a step wait on the others' work
  too, and a clock that sags in some windows shows there, with its reason (power cap, thermal).
* Step phases (``--step-phases``, simultaneous): every server's processes import
  ``bench_site/sitecustomize.py``, whose ``step_phases`` times its engine core's step phase by
  phase (scheduling, the runner's host work by CUDA-graph mode, the sampler's launch, waiting for
  the GPU's output, the scheduler's update, the input queue, garbage collection); read at the start
  of the first measured window and at the end of the last, reported per step beside each other
  (``step_phases`` in the JSON): in which phase a longer step spends its time.
* Checks (a benchmark that silently stops steering must fail): every completed response is 200 with
  ``usage.completion_tokens == max_tokens`` (a dropped connection is re-sent up to twice and
  counted, ``resent``; a failed run prints every server's log tail); no preemption in any window,
  and at least one token generated (``--smoke`` lets a starved window pass, its ratios NaN);
  each hotwire server's mailbox counters, read while it is idle, count at least the steered
  requests that completed and at most those sent, and no ``unsteered_*`` refusal: sequential, per
  window, after the server went idle; simultaneous, over the whole stretch of one concurrency, from
  a read before its load starts to one after the load stopped and every server went idle, against
  that load's counts (the JSON's ``stretches``). At start and at the end, every server that steers
  answers one greedy request steered otherwise than unsteered, and unsteered as plugin-free does
  (but ``eager``, whose kernels differ): ``serving.probe_steering``, the answers in the JSON's
  ``steering_probe``. The original has no counters: it warns on stderr of every entry it leaves
  unsteered (bank full, unknown id, malformed spec, a failed fill), and such a line in its log
  fails the run (``original_plugin.LogWatch``, read after every window).

Bias of the simultaneous design: the servers share the GPU at the same moment, so the GPU time
hotwire adds delays its neighbours' kernels, plugin-free's among them, and raises hotwire's ratio.
At 256 in flight the step is host-bound (18-22 ms a step, the engine core busy throughout), and what
hotwire adds on the GPU is its op's launches: 54 µs per step with every layer armed at B = 256 (0.6B,
docs/performance.md, "Decode: what the current op costs"), 4 µs with two armed. Were every such µs
to delay plugin-free one for one (the switches between the processes' contexts not counted), its
step would lengthen by at most ~54 µs per ~20 ms hotwire step: the ratio overstates hotwire by at
most ~0.3 % (at 64 in flight, 50 µs per ~8.7 ms step: ~0.6 %). ``plugin_free_2``'s ratio shows
any asymmetry of placement (cores, read order), not this transfer, which slows both plugin-free
servers alike. Under MPS the servers' kernels also share the SMs at once, which may bias the
other way: each extra kernel boundary in hotwire's stream (one op kernel per armed layer) lets a
neighbour's kernels take the SMs first, at a cost growing with their length (8B GEMMs; a
hypothesis from session 33's 8B run, docs/performance.md). ``h200.sh steered`` runs the same
servers under MPS and then sharing the GPU by time slices.

The JSON (``--out``) is rewritten after every round (window), so a time-out keeps what was
measured. Run time: start-up (~2 min at 0.6B on the H200, the servers in parallel; ~2-2.5 min for
four) plus, sequential, per server window ``--settle-s`` + ``--window-s`` + ~1 s (stop, drain): with
the defaults and two servers a round (four windows) takes ~32 s, so the default budget (450 s)
fits a warm-up and ~4 rounds at each of 64 and 256 in flight, and a third server makes a round six
windows (~48 s); simultaneous, whatever the number of servers, ``--settle-s`` + ``--window-s`` of
warm-up, then one window every ``--window-s``, and a few seconds to stop and drain: a concurrency
given 270 s of budget gets ~50 windows. Give one concurrency the whole budget for more.
An ``eager`` server steps ~50 ms on the H200 (``decode.py``): give it a longer settle.
``--smoke`` runs the tiny random model on CPU (fp32, eager, small lengths and concurrency): it
checks the script end to end; its numbers mean nothing. It refuses ``original``: the original
cannot steer on CPU (``original_plugin.py``).

The original, on a machine without network (``h200.sh serve`` installs it from there when present):

    pip download hotwire-vllm==0.1.2 --no-deps -d .device/original   # here; the folder travels
    pip install --no-deps --no-index --target /tmp/hotwire-vllm-0.1.2 .device/original/hotwire_vllm-0.1.2-py3-none-any.whl

    python benchmarks/serve_throughput.py --shape qwen3-0.6b --out benchmarks/results/h200-DATE-serve-qwen3-0.6b.json
    python benchmarks/serve_throughput.py --simultaneous --concurrency 256 --servers hotwire plugin_free_2 --out OUT.json
    python benchmarks/serve_throughput.py --servers hotwire original --original-site /tmp/hotwire-vllm-0.1.2 --out OUT.json
    python benchmarks/serve_throughput.py --smoke --out /tmp/serve-smoke.json   # CPU, end to end only
    python benchmarks/serve_throughput.py --smoke --simultaneous --servers hotwire plugin_free_2 --out /tmp/sim.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
import pair_ratio
from hotwire.shared.mailbox import clock_ns
from hotwire.tools.tiny_model import benchmark_model, steered_layers
from serving import (RULE_CONFIGS, SERVER_CORES, Load, Server, add_common_args, check_steering, cpu_plan, engine_args,
                     host_cpu, host_speed_us, median, median_ci, phase_readings, pool_entries, probe_steering, running,
                     smi_index, snapshot, start_run, startup_vectors, steer_spec, verdict, visible_gpus, wait_ready,
                     window_row, write_vectors)
from gpu_busy import GpuBusy
from mps import Mps
from bench_site import step_phases
from server_kinds import KINDS, load_of, make_server, refusing
from simultaneous import CLIENTS_PER_CORE, LoadSet, default_processes, edge, windows

TARGET = 0.99
MIN_ROUNDS = 5  # fewer rounds' (or blocks') bootstrap interval is too narrow to trust: "unresolved"
RESOLVED_WIDTH = 0.02  # issue 24 asks for a 95 % interval narrower than this
BLOCK = 3  # --simultaneous: windows per block of the moving-block bootstrap (neighbours may correlate)
SEQUENTIAL_CLIENTS = 4  # load-generator processes of the sequential design's one load
GPU_MEMORY_UTILIZATION = 0.25  # per server: what vLLM checks is free at its start (the KV cache is sized)
MAX_SERVERS = int(1 / GPU_MEMORY_UTILIZATION)  # that many share the GPU


# reported beside plugin-free; the target is on the others
CONTRASTS = ("eager", "original", "plugin_free_2", "plugin_free_own_compile", "hotwire_unarmed", "hotwire_unsteered",
             "hotwire_unsteered_2", "hotwire_unsteered_14", "hotwire_one_graph_unsteered", "hotwire_refused", "hotwire_host_only", "hotwire_graphs_only",
             "hotwire_dispatched")
ORIGINAL_POOL = 128  # specs the steered requests draw from when the original runs: 256 slots
PROBE_TOKENS = 16
HOST_FIELDS = ("host_us_per_step", "steady_us_per_step", "changed_us_per_step", "core_us_per_step",
               "schedule_us_per_step", "batch_us_per_step", "hotwire_host_share", "heartbeat_cpu_share")


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
    steering = [s for s in servers if (KINDS[s.name].plugin and not KINDS[s.name].refused
                                       and KINDS[s.name].gpu_steers) or KINDS[s.name].original]
    exact = {s.name for s in steering if not KINDS[s.name].eager}
    prompt = np.random.default_rng(7).integers(10, vocab - 10, prompt_len).tolist()
    return probe_steering(servers[0], steering, exact, client, prompt, steer_spec(0, layers), PROBE_TOKENS)


def _check_log(server: Server, watches: dict) -> None:
    """The original's log holds none of its warnings that an entry ran unsteered."""
    if server.name in watches and (failed := watches[server.name].failures()):
        raise SystemExit(f"{server.name}: the original left entries unsteered:\n" + "\n".join(failed[:20]))


def _window(load: Load, server: Server, client: httpx.Client, concurrency: int, make: dict,
            args: argparse.Namespace, pending: dict, watches: dict, busy: GpuBusy, gpu: int | None) -> dict:
    """One window on one server (see the module's docstring), with how busy its GPU was (``gpu``:
    nvidia-smi's index, :mod:`gpu_busy`). Its steering check waits for a
    heartbeat published after the server went idle: it runs at the server's next window (by then
    another server's window has usually passed), or at the end (``_check_pending``); the original's
    log is read once the server is idle."""
    before = _check_pending(server, pending) if server.plugin else None
    deadline = time.time() + args.settle_s + args.window_s + 120  # the processes' own stop, should this one hang
    load.start(server.url, concurrency, load_of(server.name, make), deadline)
    load.wait(time.monotonic() + args.settle_s)
    a = snapshot(server, client)
    load.wait(a["metrics"]["t"] + args.window_s)
    b = snapshot(server, client)
    sent = load.stop()
    row = {**window_row(a, b), **(busy.between(a["metrics"]["t"], b["metrics"]["t"], gpu) or {})}
    row["drain_s"] = round(server.wait_idle(client), 3)
    row.update(_sent_fields(sent))
    _check_window(server.name, row, args.smoke)
    if server.plugin:
        pending[server.name] = (row, before, sent, clock_ns())
    _check_log(server, watches)
    return row


def _sent_fields(sent: dict) -> dict:
    """What a stopped load (``Load.stop``) reports into a window's or a stretch's row."""
    return {**{k: sent.get(k, 0) for k in ("completed", "cancelled", "resent")},
            "ms_per_token_p50": sent["ms_per_token_p50"], "client_cpu_s": sent["client_cpu_s"]}


def _check_window(name: str, row: dict, smoke: bool = False) -> None:
    """A window with a preemption measured a KV cache too small; one without a generated token has
    no ratio (a stalled server), but for ``--smoke``, where servers share a few CPU cores and one may
    starve the others for a window (its ratios NaN: the numbers mean nothing there)."""
    if row["preemptions"]:
        raise SystemExit(f"{name}: {row['preemptions']} preemptions: the KV cache is too small")
    if row["generated"] == 0 and not smoke:
        raise SystemExit(f"{name}: no token generated in a {row['window_s']:g} s window under load")


def _check_pending(server: Server, pending: dict) -> dict[str, int]:
    """Check the server's last window's steering (if one is pending); its counters now."""
    if server.name not in pending:
        return server.counters_after(clock_ns())
    row, before, sent, idle_ns = pending.pop(server.name)
    after = server.counters_after(idle_ns)
    row["steered_counted"] = check_steering(server.name, before, after, sent, refusing(server.name))
    return after


def _rounds(load: Load, servers: list[Server], client: httpx.Client, c: int, make: dict, args: argparse.Namespace,
            c_end: float, rounds: int, pending: dict, watches: dict, save, busy: GpuBusy,
            gpu_of: dict[str, int | None]) -> None:
    """One concurrency in the sequential design: a warm-up window per server, then A B B A rounds
    (module docstring: Order)."""
    names = [s.name for s in servers]
    result = save.result
    t = time.monotonic()
    for s in servers:
        row = _window(load, s, client, c, {**make, "seed": 10_000 + c}, args, pending, watches, busy, gpu_of[s.name])
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
            w = _window(load, s, client, c, {**make, "seed": 1000 * c + r}, args, pending, watches, busy,
                        gpu_of[s.name])
            rows.setdefault(s.name, []).append(w)
            result["samples"].append({"concurrency": c, "round": r, "server": s.name, **w})
        save()  # partial results survive a time-out
        last = time.monotonic() - t
        print(f"C={c} round {r} ({' '.join(s.name for s in order)}): {_cells(rows, names)} ({last:.0f} s)", flush=True)
    result["phases_s"][f"c{c}_rounds"] = round(time.monotonic() - t_rounds, 1)


def _stretch(loads: LoadSet, servers: list[Server], client: httpx.Client, c: int, make: dict,
             args: argparse.Namespace, c_end: float, rounds: int, watches: dict, save, busy: GpuBusy,
             gpu_of: dict[str, int | None]) -> None:
    """One concurrency in the simultaneous design: every server's load started together and run
    without a stop through a warm-up window and back-to-back windows that share their edges, then
    the steering checked over the whole stretch (module docstring: How, Order, Checks). Each
    window's row carries how busy its server's GPU (``gpu_of``: nvidia-smi's index; with ``--gpu-each``
    one per server, else the one they share) was over it (``busy``, :mod:`gpu_busy`)."""
    names = [s.name for s in servers]
    result = save.result
    processes = args.client_processes or default_processes(c)
    before = {s.name: s.counters_after(clock_ns()) for s in servers if s.plugin}  # idle: all counted
    t0 = time.monotonic()
    loads.start(c, {**make, "seed": 10_000 + c}, time.time() + (c_end - t0) + 120, processes)
    a, t_a = edge(servers, loads, client, 0), time.monotonic()
    target = time.monotonic() + args.settle_s + args.window_s
    result["stopped_by"][str(c)] = "rounds"
    for k in itertools.count(1):
        loads.wait(target)
        b, t_b = edge(servers, loads, client, k), time.monotonic()
        rows, a, w = windows(a, b), b, k - 2  # window -1: the warm-up (from the start, its ramp included)
        if w == -1 and args.step_phases:
            first = phase_readings(servers, args.step_phases)
        gpu = {n: busy.between(t_a, t_b, gpu_of[n]) or {} for n in names}
        t_a = t_b
        for s in servers:
            _check_window(s.name, rows[s.name], args.smoke)
            _check_log(s, watches)
            result["samples"].append({"concurrency": c, "round": w, "server": s.name, "cpus": s.cpus,
                                      **rows[s.name], **gpu[s.name]})
        save()  # partial results survive a time-out
        print(f"C={c} {'warm-up' if w < 0 else f'window {w}'}: {_cells({n: [rows[n]] for n in names}, names)}",
              flush=True)
        if w + 1 >= rounds:
            break
        if target + args.window_s > c_end:
            result["stopped_by"][str(c)] = "budget"
            break
        if args.rotate_cores and w >= 0 and (w + 1) % args.rotate_cores == 0:
            _rotate(servers)
        target += args.window_s
    if args.step_phases:
        result["step_phases"][str(c)] = step_phases.report(first, phase_readings(servers, args.step_phases))
    sent = loads.stop()
    stretch = {s.name: {"drain_s": round(s.wait_idle(client), 3)} for s in servers}
    idle_ns = clock_ns()
    for s in servers:
        mine = sent[s.name]
        stretch[s.name].update(_sent_fields(mine))
        if s.plugin:
            stretch[s.name]["steered_counted"] = check_steering(s.name, before[s.name], s.counters_after(idle_ns), mine,
                                                                refusing(s.name))
        _check_log(s, watches)
    result["stretches"][str(c)] = {"client_processes": processes, "seconds": round(time.monotonic() - t0, 1),
                                   "servers": stretch}
    result["phases_s"][f"c{c}_stretch"] = round(time.monotonic() - t0, 1)
    save()


def _rotate(servers: list[Server]) -> None:
    """Each server onto the next one's CPU set (the last onto the first's): over a stretch every
    server runs on every set for as many windows, so a faster or slower set weighs on none."""
    sets = [s.cpus for s in servers]
    if any(c is None for c in sets):
        return
    for s, cpus in zip(servers, sets[1:] + sets[:1]):
        s.pin(cpus)


def _cells(rows: dict[str, list[dict]], names: list[str]) -> str:
    """A progress line's figures: each server's mean tokens/s, the ratios, hotwire's steady host µs."""
    cells = [f"{n} {_mean_tokens(rows[n]):.0f}" for n in names] + \
            [f"{n}/plugin_free {_ratio(rows[n], rows['plugin_free']):.4f}" for n in names[1:]]
    host = [f"{n} {rows[n][-1]['steady_us_per_step']:.1f}" for n in names
            if rows[n][-1].get("steady_us_per_step") is not None]
    return f"tok/s {', '.join(cells)}" + (f"; steady host µs/step {', '.join(host)}" if host else "")


class _Save:
    """Rewrites the JSON (``--out``) with its summary rows: a time-out keeps what was measured."""

    def __init__(self, result: dict, out: Path, block: int):
        self.result, self.out, self.block = result, out, block

    def __call__(self) -> None:
        self.result["rows"] = _summary(self.result["samples"], self.result["concurrency"], self.result["servers"],
                                       self.block)
        self.out.write_text(json.dumps(self.result, indent=1))


# ---------------------------------------------------------------- report
def _summary(samples: list[dict], concurrency: list[int], names: list[str], block: int = 1) -> list[dict]:
    """Per concurrency: each server's medians over its windows, and each ratio to plugin-free per
    round (sequential: of the round's mean tokens/s; simultaneous, ``block`` > 1: of the two windows
    over the same seconds) with its median, range and bootstrap interval (``serving.median_ci``, in
    blocks of ``block`` rounds) and a verdict for the target servers."""
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
        row = {"concurrency": c, "rounds": len(full), "block": block}
        for n in names:
            mine = [x for r in full for x in r[n]]  # every window of the server
            busy = [(x["gpu_util"], x["sm_mhz"]) for x in mine if "gpu_util" in x]  # its GPU's, over its windows
            if busy:
                row[f"{n}_gpu_util"] = round(median([u for u, _ in busy]), 1)
                row[f"{n}_gpu_util_range"] = [min(u for u, _ in busy), max(u for u, _ in busy)]
                row[f"{n}_sm_mhz_range"] = [min(m for _, m in busy), max(m for _, m in busy)]
            power = [x["power_w"] for x in mine if "power_w" in x]
            if power:
                row[f"{n}_power_w_range"] = [min(power), max(power)]
            held = sorted({why for x in mine for why in x.get("clock_held", {})})
            if held:  # each reason: the largest share of a window's samples it held the SM clock down
                row[f"{n}_clock_held"] = {why: max(x.get("clock_held", {}).get(why, 0.0) for x in mine) for why in held}
            row[f"{n}_tokens_per_s"] = round(median([x["tokens_per_s"] for x in mine]), 1)
            row[f"{n}_step_ms"] = round(median([x["step_ms"] for x in mine]), 3)
            row[f"{n}_steps"] = round(median([x["steps"] for x in mine]))
            row[f"{n}_window_s"] = round(median([x["window_s"] for x in mine]), 2)
            procs = sorted({p for x in mine for p in x["cpu_s"]})
            row[f"{n}_cpu_s"] = {p: round(median([x["cpu_s"].get(p, 0.0) for x in mine]), 2) for p in procs}
            row[f"{n}_client_cpu_s"] = round(median([sum(x["client_cpu_s"]) for x in mine]), 2)
            steal = [x["steal_s"] for x in mine if "steal_s" in x]  # older results have none
            if steal:
                row[f"{n}_steal_s"] = [round(median(steal), 3), max(steal)]
            for field in HOST_FIELDS:
                value = median([x.get(field) for x in mine])
                if value is not None:
                    row[f"{n}_{field}"] = round(value, 5)
        for n in names[1:]:
            ratios = [_ratio(r[n], r["plugin_free"]) for r in full]
            ci = median_ci(ratios, block)
            row[f"{n}_over_plugin_free"] = round(median(ratios), 4)
            row[f"{n}_over_plugin_free_range"] = [round(min(ratios), 4), round(max(ratios), 4)]
            row[f"{n}_over_plugin_free_ci95"] = ci
            row[f"{n}_over_plugin_free_ci_width"] = round(ci[1] - ci[0], 4)
            row[f"{n}_resolved"] = ci[1] - ci[0] < RESOLVED_WIDTH
        # the target is on compiled hotwire servers; eager, the original and the A/A control are the contrasts
        row["target"] = {n: verdict(row[f"{n}_over_plugin_free_ci95"], TARGET, at_least=True)
                         if len(full) >= MIN_ROUNDS * block else "unresolved" for n in names[1:] if n not in CONTRASTS}
        rows.append(row)
    return rows


def _ratio(windows: list[dict], reference: list[dict]) -> float:
    """Mean tokens/s of ``windows`` over ``reference``'s; NaN where the reference generated nothing
    (only a ``--smoke`` run keeps such a window: ``_check_window``)."""
    return pair_ratio.over(_mean_tokens(windows), _mean_tokens(reference))


def _mean_tokens(windows: list[dict]) -> float:
    return sum(w["tokens_per_s"] for w in windows) / len(windows)


def _markdown(rows: list[dict], names: list[str], simultaneous: bool) -> str:
    unit = "windows" if simultaneous else "rounds"
    how = (f"per window (all servers over the same seconds), with their range, a moving-block bootstrap 95 % "
           f"interval of the median (blocks of {BLOCK} consecutive windows) and its width") if simultaneous else \
        "per round, with their range, a bootstrap 95 % interval of the median and its width"
    head = ["concurrency", unit] + [f"{n} tok/s" for n in names] + \
           [f"{n}/plugin_free (min-max) [95 % CI] width" for n in names[1:]]
    out = [(f"generated tokens/s over steady-state windows, median over {unit}; ratios: median of the ratios "
            f"{how}"), "",
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
    hot = [n for n in names if KINDS[n].plugin]
    if hot:
        out += ["", ("hotwire's host time per engine step (µs, medians over windows): all steps, steady steps, "
                     "steps where requests came or went (or the batch's requests changed), per hook (engine "
                     "core, rank's schedule, rank's batch routing); its share of the window and its heartbeat "
                     "thread's CPU share (%); - : not published by this engine"), "",
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
                    f"{'' if r[f'{n}_resolved'] else f', not below {RESOLVED_WIDTH:g}'}): {v}" for n, v in r["target"].items()]
        contrasts = [f"{n}/plugin-free {r[f'{n}_over_plugin_free']:.4f} [{r[f'{n}_over_plugin_free_ci95'][0]:.4f}-"
                     f"{r[f'{n}_over_plugin_free_ci95'][1]:.4f}]" for n in CONTRASTS if n in names]
        out.append(f"C={r['concurrency']} (target >= {TARGET}, {r['rounds']} {unit}): " +
                   "; ".join(verdicts + contrasts))
        busy = [f"{n} {r[f'{n}_gpu_util']:g} % ({r[f'{n}_gpu_util_range'][0]:g}-{r[f'{n}_gpu_util_range'][1]:g}; "
                f"SM {r[f'{n}_sm_mhz_range'][0]:g}-{r[f'{n}_sm_mhz_range'][1]:g} MHz"
                + (f", {r[f'{n}_power_w_range'][0]:g}-{r[f'{n}_power_w_range'][1]:g} W" if f"{n}_power_w_range" in r else "")
                + "".join(f", {why} up to {share:.0%}" for why, share in r.get(f"{n}_clock_held", {}).items()) + ")"
                for n in names if f"{n}_gpu_util" in r]
        stolen = [f"{n} {r[f'{n}_steal_s'][0]:g} s (max {r[f'{n}_steal_s'][1]:g})" for n in names
                  if r.get(f"{n}_steal_s", [0, 0])[1] > 0]
        if stolen:
            out.append(f"C={r['concurrency']}: CPU time the hypervisor took from each server's cores a window, "
                       f"median: {', '.join(stolen)}")
        if busy:
            out.append(f"C={r['concurrency']}: each server's GPU ran a kernel, median over its windows (range; SM "
                       f"clock range), of the time: {', '.join(busy)} (nvidia-smi utilization.gpu)")
    return "\n".join(out)


# ---------------------------------------------------------------- main
def gpu_each(order: list[str], devices: list[str]) -> dict[str, str]:
    """``--gpu-each``: the server that takes the N-th pinned CPU set (``--cores-order``) runs on the
    N-th visible GPU (``devices``, :func:`serving.visible_gpus`), so a run with the order reversed
    swaps GPUs as well as cores."""
    if len(devices) < len(order):
        raise SystemExit(f"--gpu-each: {len(order)} servers need as many GPUs, {len(devices)} visible")
    return dict(zip(order, devices))


def _check_servers(names: list[str]) -> None:
    """No more servers than share the GPU's memory (each sizes itself to a fixed share at start)."""
    if len(names) > MAX_SERVERS:
        raise SystemExit(f"{len(names)} servers ({' '.join(names)}): at most {MAX_SERVERS} share the GPU, each "
                         f"with --gpu-memory-utilization {GPU_MEMORY_UTILIZATION:g}; run the others in another run")


def main() -> None:
    t0 = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", help="requests in flight (default 64 256; smoke: 4 8)")
    ap.add_argument("--rounds", type=int,
                    help="most rounds (--simultaneous: windows) per concurrency (default 30, --simultaneous no "
                         "limit: the budget ends them; smoke: 2)")
    ap.add_argument("--window-s", type=float, help="measured window per server and round (default 5; smoke 3)")
    ap.add_argument("--settle-s", type=float, default=2.0, help="load before a window starts (default 2)")
    ap.add_argument("--servers", nargs="+", choices=list(KINDS), default=["plugin_free", "hotwire"],
                    help=f"servers side by side, at most {MAX_SERVERS} (plugin_free is always one: the ratios "
                         "are on it)")
    ap.add_argument("--simultaneous", action="store_true",
                    help="every server under its own load at the same time, windows over the same seconds "
                         "(default: one server at a time, A B B A)")
    ap.add_argument("--cores-order", nargs="+", choices=list(KINDS),
                    help="the servers in the order they take the pinned CPU sets (default: plugin_free, then "
                         "--servers): a run with another order tells whether a ratio follows the server or its cores")
    ap.add_argument("--rotate-cores", type=int, default=0, metavar="N",
                    help="--simultaneous: every N windows, move each server onto the next server's pinned CPU "
                         "set, so that every server runs on every set (default 0: each keeps its own)")
    ap.add_argument("--original-site", type=Path,
                    help=f"folder holding {original_plugin.DIST} {original_plugin.VERSION} (pip install --no-deps "
                         "--target), for --servers original")
    ap.add_argument("--mps", action="store_true",
                    help="run the servers under NVIDIA's Multi-Process Service, so that their kernels share the "
                         "GPU at once rather than in turns (mps.py says why)")
    ap.add_argument("--mps-split", action="store_true",
                    help="--mps: each server may use only an equal share of the GPU's SMs "
                         "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), so no server's kernels take another's; "
                         "with --simultaneous, a one-GPU stand-in for --gpu-each (mps.py says what it leaves shared)")
    ap.add_argument("--gpu-each", action="store_true",
                    help="--simultaneous: each server on a GPU of its own (the N-th of --cores-order on GPU N), "
                         "none shared, as one server per GPU runs in production; windows over the same seconds "
                         "still cancel the host's noise. Run again with --cores-order reversed and pool both "
                         "(pair_ratio.py): the ratio then follows the servers, not their GPUs or cores")
    ap.add_argument("--step-phases", action="store_true",
                    help="--simultaneous: time every engine core's step phase by phase (bench_site/step_phases.py) "
                         "and report each phase per step over the measured windows")
    add_common_args(ap, clients_help=f"load-generator processes (default {SEQUENTIAL_CLIENTS}; --simultaneous: "
                                     "per server, default one per 128 in flight)")
    args = ap.parse_args()
    names = ["plugin_free"] + [n for n in dict.fromkeys(args.servers) if n != "plugin_free"]
    _check_servers(names)
    if args.rotate_cores and not args.simultaneous:
        raise SystemExit("--rotate-cores moves servers between windows of the simultaneous design: add --simultaneous")
    if args.gpu_each and (args.mps or not args.simultaneous):
        raise SystemExit("--gpu-each gives each server a GPU of its own under the simultaneous design: add "
                         "--simultaneous, leave out --mps")
    if args.mps_split and not args.mps:
        raise SystemExit("--mps-split divides the GPU between the servers under MPS: add --mps")
    if args.step_phases and not args.simultaneous:
        raise SystemExit("--step-phases reads the engine cores over the simultaneous design's windows: add --simultaneous")
    order = args.cores_order or names
    if sorted(order) != sorted(names):
        raise SystemExit(f"--cores-order {' '.join(order)}: name each server once ({' '.join(names)})")
    _check_original_args(args, names)
    gpu = start_run(args.smoke, args.timed_configs)
    concurrency = args.concurrency or ([4, 8] if args.smoke else [64, 256])
    rounds = args.rounds or (2 if args.smoke else sys.maxsize if args.simultaneous else 30)
    args.window_s = args.window_s or (3.0 if args.smoke else 5.0)
    prompt_len, max_tokens = (16, 8) if args.smoke else (128, 128)
    lengths = (max_tokens // 2, max_tokens + max_tokens // 2)
    work = Path(tempfile.mkdtemp(prefix="hotwire-serve-"))
    if args.step_phases:  # every server's processes import bench_site/sitecustomize.py
        args.step_phases = step_phases.enable(work)

    model, shape_name = benchmark_model(work, args.shape, args.smoke)
    shape = json.loads((model / "config.json").read_text())
    layers = steered_layers(shape["num_hidden_layers"])
    original_env, original = _original(args, names, work, layers, shape["hidden_size"])
    pool = ORIGINAL_POOL if original else None
    write_vectors(work / "vectors", shape["hidden_size"])
    engine = engine_args(shape, args.smoke, max(concurrency), prompt_len, max_tokens, GPU_MEMORY_UTILIZATION)
    if args.simultaneous:  # one load per server, all at once
        clients = args.client_processes or max(map(default_processes, concurrency))
        need = (len(names) * clients, CLIENTS_PER_CORE)
    else:
        clients = args.client_processes or SEQUENTIAL_CLIENTS
        need = (clients, 1)
    plan = None if args.smoke else cpu_plan([SERVER_CORES] * len(names), *need)
    if plan is not None:
        os.sched_setaffinity(0, plan[1])  # this process and the load generator's, which inherit it
    cpus = {n: plan[0][order.index(n)] for n in names} if plan is not None else dict.fromkeys(names)
    visible = [] if args.smoke else visible_gpus()
    gpus = gpu_each(order, visible) if args.gpu_each and not args.smoke else {}
    gpu_of = {n: smi_index(gpus.get(n, visible[0] if visible else None)) for n in names}  # for GpuBusy
    servers = [make_server(n, work, model, engine, ",".join(map(str, layers)), cpus[n], original_env, gpus.get(n))
               for n in names]

    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "host": platform.node(), "host_python_us": host_speed_us(), "host_cpu": host_cpu(), "gpu": gpu or "cpu",
              "torch": version("torch"), "shape": shape_name,
              "config": {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
              "engine": engine, "servers": names, "concurrency": concurrency,
              "design": "simultaneous" if args.simultaneous else "sequential",
              "max_rounds": None if rounds == sys.maxsize else rounds,
              "window_s": args.window_s, "settle_s": args.settle_s, "budget_s": args.budget_s,
              "prompt_len": prompt_len, "max_tokens_range": lengths, "steered_fraction": args.steered_fraction,
              "spec_pool": pool, "original": original, "client_processes": clients,
              "cpus": None if plan is None else {**cpus, "clients": plan[1]},
              "env": {k: os.environ[k] for k in ("VLLM_USE_V2_MODEL_RUNNER", RULE_CONFIGS) if k in os.environ},
              "mps": args.mps, "mps_split": args.mps_split, "gpu_each": args.gpu_each, "gpus": gpus or None,
              "step_phases_timed": bool(args.step_phases),
              "phases_s": {}, "stopped_by": {}, "stretches": {}, "step_phases": {}, "samples": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save = _Save(result, args.out, BLOCK if args.simultaneous else 1)
    print(f"work dir (server logs): {work}", flush=True)
    load = LoadSet(servers, clients) if args.simultaneous else Load(clients)  # spawns while the servers start
    pending: dict = {}
    watches = {s.name: original_plugin.LogWatch(s.log) for s in servers if KINDS[s.name].original}
    client = httpx.Client(timeout=30)
    daemon = Mps(work, servers, split=args.mps_split) if args.mps else contextlib.nullcontext()
    with daemon as mps, running(servers, load, client), GpuBusy() as busy:
        for s in servers:
            s.start()
        result["startup_s"] = wait_ready(servers, t0)
        if mps is not None:
            mps.check()
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
            if args.simultaneous:
                _stretch(load, servers, client, c, make, args, c_end, rounds, watches, save, busy, gpu_of)
            else:
                _rounds(load, servers, client, c, make, args, c_end, rounds, pending, watches, save, busy, gpu_of)
        for s in servers:
            if s.name in pending:
                _check_pending(s, pending)
        result["steering_probe"]["end"] = _probe(servers, client, layers, shape["vocab_size"], prompt_len)
        for s in servers:
            _check_log(s, watches)
    result["phases_s"]["total"] = round(time.monotonic() - t0, 1)
    save()
    cpu = result["host_cpu"]
    print(f"\n{shape_name} on {result['gpu']} (host: {cpu['model']}, {cpu['cpus']} CPUs, SMT {cpu['smt']}, "
          f"{result['host_python_us']:g} µs of fixed Python), "
          f"vLLM {result['vllm']}, {result['design']}, "
          f"{args.steered_fraction:.0%} steered, prompt {prompt_len} + {lengths[0]}-{lengths[1]} tokens, windows "
          f"{args.window_s:g} s after {args.settle_s:g} s, phases {result['phases_s']}"
          + (" (smoke: the numbers mean nothing)" if args.smoke else "") + "\n")
    print(_markdown(result["rows"], names, args.simultaneous))
    if args.simultaneous and "hotwire" in names:  # hotwire beside each other hotwire kind, window by window
        for other in [n for n in names if KINDS[n].plugin and n != "hotwire"]:
            print("\n".join(pair_ratio.report(result["samples"], other, "hotwire", BLOCK)))


if __name__ == "__main__":
    main()
