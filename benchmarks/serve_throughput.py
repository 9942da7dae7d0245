"""Served throughput: ``vllm serve`` with hotwire (half the requests steered) vs a plugin-free server.

Why: the served target is output tokens/s with hotwire loaded and 50 % of the requests steered
>= 0.99 x the plugin-free server, at 64 and 256 concurrent requests; a server armed only on the
two layers the requests steer splits the cost of arming every layer (one kernel per armed layer
per step) from the rest, and an eager-mode hotwire server gives the contrast (``--enforce-eager``:
no torch.compile, no CUDA graphs, what hook-based steering pays). Separate server processes on
the lent H200 differ by up to 30 % from one start to the next, so every figure here is taken side
by side in one run, and the ratios are medians of per-round ratios of servers measured back to
back. Rounds of one server still scatter by 5-12 % on the H200, so each ratio comes with a
bootstrap 95 % interval of that median, and the verdict is "met" or "not met" only when the
interval lies on one side of the target ("unresolved" otherwise).

How:
* Servers: ``python -m vllm.entrypoints.openai.api_server`` subprocesses, each in its own
  session (its process group is killed on exit), started together and awaited on ``/health``
  (a server that dies fails the run at once, with its log tail): ``plugin_free``
  (``VLLM_PLUGINS=none``; checked to create no mailbox), ``hotwire`` (the plugin loaded through
  its entry point, 256 random startup vectors from ``HOTWIRE_VECTORS``, its own
  ``HOTWIRE_MAILBOX``, every layer armed), ``hotwire_2`` (the same, ``HOTWIRE_LAYERS`` = the two
  steered layers) and ``eager`` (hotwire with ``--enforce-eager``), as ``--servers`` lists them.
  GPU: a Qwen3 shape (``write_config``), ``--load-format dummy``, bf16, ``TRITON_ATTN``,
  ``--skip-tokenizer-init`` (prompts are token ids; vLLM returns token ids without detokenizing,
  which suits a dummy model's arbitrary ids), vLLM's default torch.compile and CUDA graphs. Each
  server is pinned to its own ``SERVER_CORES`` physical cores and the load generator to the rest
  (``_cpu_plan``; skipped when the CPUs are too few, and within ``taskset`` when run under it). The
  servers share one GPU: each gets ``--gpu-memory-utilization 0.25`` and an explicit
  ``--kv-cache-memory-bytes`` (room for every request at the largest concurrency, so nothing is
  preempted), which also skips vLLM's start-up memory profiling, which a neighbour would skew.
* Load: ``/v1/completions`` with random token-id prompts (128 tokens, new ones every round,
  the same for every server in a round), ``max_tokens`` 128, ``ignore_eos``, greedy. A fraction
  (``--steered-fraction``, spread evenly) carries ``"vllm_xargs": {"hotwire": spec}`` with two
  entries, on layers n/3 and 2n/3, each with its own vector id and scale; every server gets the
  identical bodies (a plugin-free server ignores the spec). A closed loop keeps exactly C
  requests in flight until C x ``--requests-per-client`` have completed, spread over
  ``--client-processes`` processes (asyncio + httpx each, started together): one such process
  alone tops out before the server does.
  Output tokens/s = completion tokens / round wall time; per-request latency p50 beside it.
* Order: per concurrency, a warm-up round per server (as many requests as a measured round: in
  the H200 runs one wave of C was not enough, the first measured rounds still ran slower), then
  ``--rounds`` rounds, each running every server once; the server order rotates from round to
  round (A B, B A, ...) so drift within a round does not always favour the same server.
* Where the time goes, per round and server: engine steps (vLLM's ``/metrics``) and wall ms per
  step, CPU seconds per server process (API server, engine core; CUDA's spin-wait counts as busy)
  and of the load generator, and for hotwire servers the host time of hotwire's own per-step work
  on the engine's step thread (its ``host_ns`` counter) as a share of the round's wall time.
* Checks (a benchmark that silently stops steering must fail): every response is 200 with
  ``usage.completion_tokens == max_tokens`` (a dropped connection is re-sent up to twice and
  counted per round as ``resent``; a failed round prints every server's log tail); after every
  round each hotwire server's mailbox counters show the steered requests of that round counted and
  no ``unsteered_*`` refusal.

The JSON (``--out``) is rewritten after every round, so a time-out keeps what was measured.
Run time: start-up (the servers in parallel) plus, per concurrency, 1 + ``--rounds`` rounds of
every server. With ``eager`` the eager server dominates: a decode step of ~50 ms on the H200
(``decode.py``), so each of its rounds takes 2 waves x 128 steps ~ 15 s.
``--smoke`` runs the tiny random model on CPU (fp32, eager, small lengths and concurrency): it
checks the script end to end; its numbers mean nothing.

    python benchmarks/serve_throughput.py --shape qwen3-0.6b --requests-per-client 8 --rounds 4 \\
        --out benchmarks/results/h200-DATE-serve-qwen3-0.6b.json
    python benchmarks/serve_throughput.py --smoke --servers plugin_free hotwire eager \\
        --out /tmp/serve-smoke.json   # CPU, end to end only
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import version
from pathlib import Path

import httpx
import numpy as np

from hotwire.engine_plugin.core_sync import HEARTBEAT_S
from hotwire.tools.tiny_model import benchmark_model, steered_layers

N_VECTORS, SERVED, TARGET = 256, "bench", 0.99
GPU_MEMORY_UTILIZATION = 0.25  # per server; three share the GPU
STARTUP_TIMEOUT_S = 480
SERVER_CORES = 3  # physical cores per server: API server, engine core and their helper threads
SERVERS = {  # name: (plugin loaded, --enforce-eager, armed only on the steered layers)
    "plugin_free": (False, False, False),
    "hotwire": (True, False, False),
    "hotwire_2": (True, False, True),
    "eager": (True, True, False),
}


# ---------------------------------------------------------------- servers
class Server:
    """One ``vllm serve`` in its own session (its process group: API server, engine core, worker)."""

    def __init__(self, name: str, work: Path, model: Path, engine: dict, vectors: Path, steered: str,
                 cpus: list[int] | None):
        self.name, self.model, self.cpus = name, model, cpus
        plugin, eager, two = SERVERS[name]
        self.engine = {**engine, "enforce_eager": True} if eager else engine
        self.plugin = plugin
        self.mailbox = work / f"{name}.mbx"
        self.log = work / f"{name}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HOTWIRE_") and k != "VLLM_PLUGINS"}
        self.env.update(HOTWIRE_MAILBOX=str(self.mailbox), HOTWIRE_VECTORS=str(vectors))
        if two:
            self.env["HOTWIRE_LAYERS"] = steered
        if not plugin:
            self.env["VLLM_PLUGINS"] = "none"  # vLLM loads no general plugin
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        flags = []
        for key, value in self.engine.items():
            flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
        pin = [] if self.cpus is None else ["taskset", "-c", ",".join(map(str, self.cpus))]
        argv = [*pin, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-uvicorn-access-log", *flags]
        with open(self.log, "w") as log:
            log.write(" ".join(argv) + "\n")
            log.flush()
            self.proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"{self.name} exited with {self.proc.returncode}; log {self.log}:\n" + \
            self.log.read_text(errors="replace")[-6000:]

    def healthy(self, client: httpx.Client) -> bool:
        try:
            return client.get(self.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def counters(self) -> dict[str, int]:
        from hotwire.shared.mailbox import MailboxView

        return MailboxView.open(str(self.mailbox)).counters()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system, all threads) each process of the server has used so far,
        by process name (the API server's, ``VLLM::EngineCore``, ...): where a host-bound server's
        time goes."""
        import psutil

        out: dict[str, float] = {}
        root = psutil.Process(self.proc.pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                name, t = p.name(), p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            out[name] = out.get(name, 0.0) + t.user + t.system
        return out

    def engine_totals(self, client: httpx.Client) -> dict[str, float]:
        """Engine steps (``vllm:iteration_tokens_total`` observations) and preemptions so far."""
        from prometheus_client.parser import text_string_to_metric_families

        want = {"vllm:iteration_tokens_total_count": "steps", "vllm:num_preemptions_total": "preemptions"}
        out = dict.fromkeys(want.values(), 0.0)
        for family in text_string_to_metric_families(client.get(self.url + "/metrics").text):
            for sample in family.samples:
                if sample.name in want:
                    out[want[sample.name]] += sample.value
        return out

    def signal(self, sig: int) -> bool:
        """Signal the whole process group; False when none of it is left."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the leader's pid is the group id
        except (ProcessLookupError, PermissionError):
            return False
        return True


def _stop(servers: list[Server]) -> None:
    """SIGTERM every server's group, give them 10 s together, then SIGKILL what is left (vLLM's
    engine core and workers may outlive the API server). Short: a caller's time-out (``timeout -k``)
    may SIGKILL this process soon after interrupting it, and the servers are in other sessions."""
    for s in servers:
        s.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(s.proc is not None and s.proc.poll() is None for s in servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    for s in servers:
        while s.signal(signal.SIGKILL) and time.monotonic() < deadline + 10:
            s.proc.poll()  # reap the leader: a zombie keeps its group signalable
            time.sleep(0.2)
        if s.proc is not None:
            s.proc.wait()


def _cpu_plan(n_servers: int, clients: int) -> tuple[list[list[int]], list[int]] | None:
    """Disjoint CPU sets: ``SERVER_CORES`` physical cores (hyperthread siblings together) for each
    server, the rest for the load generator; None when the CPUs this process may use are too few
    or there is no ``taskset`` to start a server on its set (it execs the server, so the API server
    keeps its pid and every process it starts inherits the set).

    Why: a host-bound server's step time follows the core its engine thread lands on; with every
    process free to move, a neighbour on the sibling hyperthread moved whole rounds by 10-20 %.
    """
    allowed = sorted(os.sched_getaffinity(0))
    cores: dict[str, list[int]] = {}
    for cpu in allowed:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.setdefault(siblings, []).append(cpu)
    whole = sorted(cores.values(), key=len, reverse=True)  # servers first get cores with every sibling
    take = n_servers * SERVER_CORES
    taskset = shutil.which("taskset")
    if len(whole) < take + clients or taskset is None:
        why = "no taskset" if taskset is None else (
            f"{n_servers} servers x {SERVER_CORES} + {clients} load-generator processes need {take + clients} "
            f"physical cores, {len(whole)} allowed")
        print(f"CPU pinning off ({why}): rounds scatter more", file=sys.stderr, flush=True)
        return None
    flat = itertools.chain.from_iterable
    servers = [list(flat(whole[i * SERVER_CORES:(i + 1) * SERVER_CORES])) for i in range(n_servers)]
    return servers, sorted(flat(whole[take:]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(servers: list[Server], t0: float) -> dict[str, float]:
    """Wait for every server's /health; fail at once when one dies. Returns start-up seconds."""
    ready: dict[str, float] = {}
    with httpx.Client(timeout=5) as client:  # one client: building one is slow on a busy host
        while len(ready) < len(servers):
            for s in servers:
                if s.name in ready:
                    continue
                if (why := s.died()) is not None:
                    raise SystemExit(why)
                if s.healthy(client):
                    ready[s.name] = round(time.monotonic() - t0, 1)
                    print(f"{s.name} ready after {ready[s.name]:.0f} s", flush=True)
                    if s.mailbox.exists() != s.plugin:  # only an armed engine creates its mailbox
                        raise SystemExit(f"{s.name}: hotwire armed={s.mailbox.exists()}, expected {s.plugin}\n"
                                         + s.log.read_text(errors="replace")[-6000:])
            if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                late = [s.name for s in servers if s.name not in ready]
                raise SystemExit(f"not ready after {STARTUP_TIMEOUT_S} s: {late}")
            time.sleep(0.5)
    return ready


# ---------------------------------------------------------------- load
def _bodies(n: int, seed: int, shape: dict, fraction: float, prompt_len: int, max_tokens: int) -> list[dict]:
    """``n`` completion bodies; ``fraction`` of them, spread evenly, steered by their own spec."""
    rng = np.random.default_rng(seed)
    l1, l2 = steered_layers(shape["num_hidden_layers"])
    bodies = []
    for i in range(n):
        body = {"model": SERVED, "prompt": rng.integers(10, shape["vocab_size"] - 10, prompt_len).tolist(),
                "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        if math.floor((i + 1) * fraction) > math.floor(i * fraction):
            spec = [{"id": f"v{i % N_VECTORS}", "layer": l1, "scale": 0.5 + (i % 17) / 16},
                    {"id": f"v{(i + 7) % N_VECTORS}", "layer": l2, "scale": -0.25 - (i % 13) / 16}]
            body["vllm_xargs"] = {"hotwire": json.dumps(spec)}
        bodies.append(body)
    return bodies


async def _closed_loop(url: str, bodies: list[dict], concurrency: int) -> dict:
    """Send ``bodies`` with exactly ``concurrency`` in flight; completion tokens and latencies."""
    pending = iter(bodies)
    latencies: list[float] = []
    tokens = resent = 0

    async def post(client: httpx.AsyncClient, body: dict) -> httpx.Response:
        """A connection the server dropped is re-sent, up to twice, and counted (``resent``)."""
        nonlocal resent
        for attempt in range(3):
            try:
                return await client.post("/v1/completions", json=body)
            except httpx.TransportError:
                if attempt == 2:
                    raise
                resent += 1

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        for body in pending:  # shared iterator: each loop takes the next body when its last one is done
            t = time.perf_counter()
            r = await post(client, body)
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:2000]}")
            n = r.json()["usage"]["completion_tokens"]
            if n != body["max_tokens"]:
                raise RuntimeError(f"{url}: {n} completion tokens, expected {body['max_tokens']}")
            tokens += n

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return {"tokens": tokens, "latencies": latencies, "resent": resent}


def _client(url: str, bodies: list[dict], concurrency: int, start_at: float) -> dict:
    """One load-generator process: wait for the common start, run its share, note when it ended
    and the CPU seconds it used (a client near one core's worth is the bottleneck, not the server)."""
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    out = asyncio.run(_closed_loop(url, bodies, concurrency))
    return {**out, "end": time.time(), "cpu_s": time.process_time() - cpu}


def _round(pool: ProcessPoolExecutor, clients: int, url: str, bodies: list[dict], concurrency: int) -> dict:
    """One round: ``bodies`` split over ``clients`` processes, ``concurrency`` in flight in all.

    Several processes because one asyncio + httpx client tops out before the server does: at 256
    in flight one process delivered less than at 64 (6.2 k against 10.3 k tokens/s on the H200).
    """
    p = min(clients, concurrency)
    start_at = time.time() + 0.5  # every process is up and waiting by then
    futures = [pool.submit(_client, url, bodies[i::p], concurrency // p + (i < concurrency % p), start_at)
               for i in range(p)]
    parts = [f.result() for f in futures]
    wall = max(x["end"] for x in parts) - start_at
    latencies = [t for x in parts for t in x["latencies"]]
    tokens = sum(x["tokens"] for x in parts)
    q = np.quantile(latencies, [0.5, 0.9])
    return {"tokens_per_s": round(tokens / wall, 1), "wall_s": round(wall, 3), "requests": len(bodies),
            "completion_tokens": tokens, "latency_p50_s": round(float(q[0]), 4),
            "latency_p90_s": round(float(q[1]), 4), "resent": sum(x["resent"] for x in parts),
            "client_cpu_s": [round(x["cpu_s"], 2) for x in parts]}


def _measure(load: tuple[ProcessPoolExecutor, int], server: Server, bodies: list[dict], concurrency: int,
             steered_sent: dict[str, int]) -> dict:
    """One round on one server, with its CPU seconds per process and its engine steps; then its
    steering counters checked against what was sent."""
    with httpx.Client(timeout=30) as client:
        cpu, totals = server.cpu_seconds(), server.engine_totals(client)
        before = server.counters() if server.plugin else {}
        row = _round(*load, server.url, bodies, concurrency)
        cpu_after, totals_after = server.cpu_seconds(), server.engine_totals(client)
    row["cpu_s"] = {k: round(v - cpu.get(k, 0.0), 2) for k, v in cpu_after.items()}
    row.update({k: int(totals_after[k] - totals[k]) for k in totals})
    row["step_ms"] = round(1000 * row["wall_s"] / max(row["steps"], 1), 3)
    if server.plugin:
        steered_sent[server.name] += sum("vllm_xargs" in b for b in bodies)
        time.sleep(2 * HEARTBEAT_S)  # the engine's heartbeat publishes its step count and host time
        counters = server.counters()
        # hotwire's own host work on the engine's step thread, as a share of the round
        row["hotwire_host_ms"] = round((counters["host_ns"] - before["host_ns"]) / 1e6, 1)
        row["hotwire_host_share"] = round(row["hotwire_host_ms"] / (1000 * row["wall_s"]), 5)
        refused = {k: v for k, v in counters.items() if k.startswith("unsteered_") and v}
        if refused or counters["steered_requests"] < steered_sent[server.name]:
            raise SystemExit(f"{server.name}: {steered_sent[server.name]} steered requests sent, "
                             f"mailbox counters {counters}")
        row["steered_counted"] = counters["steered_requests"]
    return row


# ---------------------------------------------------------------- report
def _summary(rounds: list[dict], concurrency: list[int], names: list[str]) -> list[dict]:
    med = statistics.median
    rows = []
    for c in concurrency:
        by = {n: [r for r in rounds if r["concurrency"] == c and r["server"] == n] for n in names}
        n_rounds = min(len(v) for v in by.values())
        if n_rounds == 0:
            continue
        row = {"concurrency": c, "rounds": n_rounds}
        for n in names:
            row[f"{n}_tokens_per_s"] = round(med(r["tokens_per_s"] for r in by[n][:n_rounds]), 1)
            row[f"{n}_latency_p50_s"] = round(med(r["latency_p50_s"] for r in by[n][:n_rounds]), 4)
            row[f"{n}_step_ms"] = round(med(r["step_ms"] for r in by[n][:n_rounds]), 3)
            row[f"{n}_steps"] = round(med(r["steps"] for r in by[n][:n_rounds]))
            procs = sorted({p for r in by[n] for p in r["cpu_s"]})
            row[f"{n}_cpu_s"] = {p: round(med(r["cpu_s"].get(p, 0.0) for r in by[n][:n_rounds]), 2) for p in procs}
            row[f"{n}_client_cpu_s"] = round(med(sum(r["client_cpu_s"]) for r in by[n][:n_rounds]), 2)
            if "hotwire_host_share" in by[n][0]:
                row[f"{n}_hotwire_host_share"] = med(r["hotwire_host_share"] for r in by[n][:n_rounds])
        for n in names[1:]:
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(by[n], by["plugin_free"])]
            row[f"{n}_over_plugin_free"] = round(med(ratios), 4)
            row[f"{n}_over_plugin_free_range"] = [round(min(ratios), 4), round(max(ratios), 4)]
            row[f"{n}_over_plugin_free_ci95"] = _median_ci(ratios)
        # the target is on compiled hotwire servers; eager is the contrast
        row["target"] = {n: _verdict(row[f"{n}_over_plugin_free_ci95"]) for n in names[1:] if n != "eager"}
        rows.append(row)
    return rows


def _median_ci(ratios: list[float], resamples: int = 2000) -> list[float]:
    """95 % bootstrap interval of the median per-round ratio: what a run's rounds can resolve."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(ratios, size=(resamples, len(ratios))), axis=1)
    return [round(float(q), 4) for q in np.quantile(medians, [0.025, 0.975])]


def _verdict(ci: list[float]) -> str:
    """"met" / "not met" when the interval lies on one side of the target, else "unresolved"."""
    return "met" if ci[0] >= TARGET else "not met" if ci[1] < TARGET else "unresolved"


def _markdown(rows: list[dict], names: list[str]) -> str:
    head = ["concurrency", "rounds"] + [f"{n} tok/s" for n in names] + \
           [f"{n}/plugin_free (min-max) [95 % CI]" for n in names[1:]] + [f"p50 latency s {'/'.join(names)}"]
    out = [("output tokens/s, median over rounds; ratios: median of per-round ratios, with their range "
            "and a bootstrap 95 % interval of the median"), "",
           "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [str(r["concurrency"]), str(r["rounds"])] + [f"{r[f'{n}_tokens_per_s']:g}" for n in names] + \
                [f"{r[f'{n}_over_plugin_free']:.4f} ({r[f'{n}_over_plugin_free_range'][0]:.4f}-"
                 f"{r[f'{n}_over_plugin_free_range'][1]:.4f}) [{r[f'{n}_over_plugin_free_ci95'][0]:.3f}-"
                 f"{r[f'{n}_over_plugin_free_ci95'][1]:.3f}]" for n in names[1:]] + \
                ["/".join(f"{r[f'{n}_latency_p50_s']:.3f}" for n in names)]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", ("where a round's time goes, medians: engine steps, wall ms per step, hotwire's host work on the "
                 "engine's step thread (% of the round), CPU s per server process, CPU s of all client processes"), "",
            "| concurrency | server | steps | ms/step | hotwire host % | server CPU s | client CPU s |",
            "|" + " --- |" * 7]
    for r in rows:
        for n in names:
            cpu = ", ".join(f"{p} {v:g}" for p, v in r[f"{n}_cpu_s"].items())
            share = r.get(f"{n}_hotwire_host_share")
            out.append(f"| {r['concurrency']} | {n} | {r[f'{n}_steps']} | {r[f'{n}_step_ms']:.3f} | "
                       f"{'-' if share is None else f'{100 * share:.2f}'} | {cpu} | {r[f'{n}_client_cpu_s']:g} |")
    out.append("")
    for r in rows:
        verdicts = [f"{n}/plugin-free {r[f'{n}_over_plugin_free']:.4f}: {verdict}"
                    for n, verdict in r["target"].items()]
        out.append(f"C={r['concurrency']} (target >= {TARGET}): " + "; ".join(verdicts) +
                   (f"; eager/plugin-free {r['eager_over_plugin_free']:.4f}" if "eager" in names else ""))
    return "\n".join(out)


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b", help="qwen3-0.6b | qwen3-4b | qwen3-8b (ignored with --smoke)")
    ap.add_argument("--concurrency", type=int, nargs="+", help="requests in flight (default 64 256; smoke: 4 8)")
    ap.add_argument("--requests-per-client", type=int, default=2, help="a round sends concurrency x this many (default 2)")
    ap.add_argument("--rounds", type=int, help="measured rounds per concurrency (default 5; smoke: 2)")
    ap.add_argument("--client-processes", type=int, default=4, help="load-generator processes (default 4)")
    ap.add_argument("--steered-fraction", type=float, default=0.5)
    ap.add_argument("--servers", nargs="+", choices=list(SERVERS), default=["plugin_free", "hotwire", "hotwire_2"],
                    help="servers side by side (plugin_free is always one: the ratios are on it)")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the script, numbers mean nothing")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally`: stop the servers

    gpu = None if args.smoke else _gpu_name()
    if not args.smoke and gpu is None:
        raise SystemExit("no NVIDIA GPU (nvidia-smi): use --smoke to check the script on CPU")
    concurrency = args.concurrency or ([4, 8] if args.smoke else [64, 256])
    rounds = args.rounds or (2 if args.smoke else 5)
    prompt_len, max_tokens = (16, 8) if args.smoke else (128, 128)
    work = Path(tempfile.mkdtemp(prefix="hotwire-serve-"))

    model, shape_name = benchmark_model(work, args.shape, args.smoke)
    shape = json.loads((model / "config.json").read_text())

    from hotwire.shared.wire import encode_safetensors

    (work / "vectors").mkdir()
    rng = np.random.default_rng(0)
    for i in range(N_VECTORS):
        vec = rng.standard_normal(shape["hidden_size"]).astype(np.float32)
        (work / "vectors" / f"v{i}.safetensors").write_bytes(encode_safetensors(vec))

    engine = dict(skip_tokenizer_init=True, max_num_seqs=max(concurrency))
    if args.smoke:
        engine.update(dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=128 * 2**20)
    else:  # KV room for every request of the largest concurrency (16-token blocks) plus a quarter
        per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2  # bf16
        kv_tokens = max(4096, int(1.25 * max(concurrency) * 16 * math.ceil((prompt_len + max_tokens) / 16)))
        engine.update(load_format="dummy", dtype="bfloat16", attention_backend="TRITON_ATTN", max_model_len=2048,
                      kv_cache_memory_bytes=kv_tokens * per_token, gpu_memory_utilization=GPU_MEMORY_UTILIZATION)
    names = ["plugin_free"] + [n for n in dict.fromkeys(args.servers) if n != "plugin_free"]
    steered = ",".join(map(str, steered_layers(shape["num_hidden_layers"])))
    plan = None if args.smoke else _cpu_plan(len(names), args.client_processes)
    if plan is not None:
        os.sched_setaffinity(0, plan[1])  # this process and the load generator's, which inherit it
    servers = [Server(n, work, model, engine, work / "vectors", steered, plan and plan[0][i])
               for i, n in enumerate(names)]

    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "host": platform.node(), "gpu": gpu or "cpu", "torch": version("torch"), "shape": shape_name,
              "config": {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
              "engine": engine, "servers": names, "concurrency": concurrency, "rounds": rounds,
              "requests_per_round": {str(c): c * args.requests_per_client for c in concurrency},
              "prompt_len": prompt_len, "max_tokens": max_tokens, "steered_fraction": args.steered_fraction,
              "client_processes": args.client_processes,
              "cpus": None if plan is None else {**{n: plan[0][i] for i, n in enumerate(names)}, "clients": plan[1]},
              "env": {k: os.environ[k] for k in ("VLLM_USE_V2_MODEL_RUNNER",) if k in os.environ},
              "phases_s": {}, "samples": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"work dir (server logs): {work}", flush=True)
    steered_sent = {n: 0 for n in names}
    pool = ProcessPoolExecutor(args.client_processes, mp_context=multiprocessing.get_context("spawn"))
    load = (pool, args.client_processes)
    try:
        t0 = time.monotonic()
        for s in servers:
            s.start()
        result["startup_s"] = _wait_ready(servers, t0)
        result["vllm"] = httpx.get(servers[0].url + "/version", timeout=10).json().get("version")
        result["phases_s"]["startup"] = round(time.monotonic() - t0, 1)
        print(f"startup: {result['phases_s']['startup']:.0f} s (vLLM {result['vllm']})", flush=True)
        for c in concurrency:
            n = c * args.requests_per_client
            t = time.monotonic()
            warm = _bodies(n, 10_000 + c, shape, args.steered_fraction, prompt_len, max_tokens)
            for s in servers:
                row = _measure(load, s, warm, c, steered_sent)
                print(f"C={c} warm-up {s.name}: {row['tokens_per_s']:.0f} tok/s", flush=True)
            result["phases_s"][f"c{c}_warmup"] = round(time.monotonic() - t, 1)
            t_rounds = time.monotonic()
            for r in range(rounds):
                t = time.monotonic()
                bodies = _bodies(n, 1000 * c + r, shape, args.steered_fraction, prompt_len, max_tokens)
                order = servers[r % len(servers):] + servers[:r % len(servers)]
                for s in order:
                    row = _measure(load, s, bodies, c, steered_sent)
                    result["samples"].append({"concurrency": c, "round": r, "server": s.name, **row})
                    result["rows"] = _summary(result["samples"], concurrency, names)
                    args.out.write_text(json.dumps(result, indent=1))  # partial results survive a time-out
                tps = {x["server"]: x["tokens_per_s"] for x in result["samples"][-len(servers):]}
                cells = [f"{n} {tps[n]:.0f}" for n in names] + \
                        [f"{n}/plugin_free {tps[n] / tps['plugin_free']:.4f}" for n in names[1:]]
                resent = sum(x["resent"] for x in result["samples"][-len(servers):])
                print(f"C={c} round {r}: tok/s {', '.join(cells)} ({time.monotonic() - t:.0f} s)"
                      + (f", {resent} requests re-sent" if resent else ""), flush=True)
            result["phases_s"][f"c{c}_rounds"] = round(time.monotonic() - t_rounds, 1)
    except BaseException:
        for s in (s for s in servers if s.proc is not None):  # why it failed is in a server's log
            print(s.died() or f"--- {s.name} (running), log tail:\n" + s.log.read_text(errors="replace")[-4000:],
                  flush=True)
        raise
    finally:
        pool.shutdown(cancel_futures=True)
        _stop(servers)
    result["phases_s"]["total"] = round(time.monotonic() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{shape_name} on {result['gpu']}, vLLM {result['vllm']}, {args.steered_fraction:.0%} steered, "
          f"prompt {prompt_len} + {max_tokens} tokens, phases {result['phases_s']}"
          + (" (smoke: the numbers mean nothing)" if args.smoke else "") + "\n")
    print(_markdown(result["rows"], names))


if __name__ == "__main__":
    main()
