"""Registration under load: does pushing vectors through the control API slow a served request?

Why: the target is that registration never slows a request: time to first token (p50 and p99) and
generated tokens/s of a served hotwire engine while the control API uploads, replaces and deletes
a vector every second stay within 1.05 x the same load without pushes. A push lands in the engine
at a step boundary (the engine core reads the mailbox in its schedule hook, the rows ride to the
ranks with the step), so a slow path there shows up as a late first token or a slower step.

How (``serving.py`` has the shared parts: servers, pinning, load, windows, statistics):
* One hotwire ``vllm serve`` (as ``serve_throughput.py``'s ``hotwire`` server: 256 startup vectors,
  every layer armed, pinned to ``SERVER_CORES`` physical cores) and ``hotwire control-api`` beside
  it on the engine's mailbox (its own core, a bearer token, a fresh catalog), awaited on /readyz.
* Load: the closed loop of ``serve_throughput.py`` (C requests in flight, half steered by the
  startup vectors, which the pusher never touches), started once and kept running through every
  round; ``max_num_seqs`` leaves room for the probes beside it.
* Probes: streamed requests (128-token prompt, ``--probe-tokens`` generated, half steered) sent on
  a fixed schedule, ``--probe-rate`` per second, each on time whatever the others do, from their
  own process; time to first token = until the first streamed chunk. Streaming every load request
  instead would cost the load generator a chunk per token (~20 k/s at 0.6B on the H200), and its
  delays would be read as the server's. The server's own mean TTFT over all requests
  (``vllm:time_to_first_token_seconds``) is recorded beside.
* Rounds alternate pushes on / off, A B B A (on off off on on off ...), after a warm-up pair. A
  round: ``--gap-s`` (pushes, if on, already running), then a window of ``--window-s`` with the
  probes; tokens/s from ``vllm:generation_tokens_total`` over the window, as in
  ``serve_throughput.py``. Pushes on: every second the pusher uploads a new vector (``[layers,
  hidden]`` on the two steered layers: two mailbox rows), replaces one (``replace=true``) and
  deletes the oldest, each a real HTTP call that must succeed (201, 200, 204); ``--pool`` of its
  vectors are alive at a time. After the round: the engine applied everything written
  (``/steer/slots``: applied generation >= target), the last new and the last replaced vector are
  resident at their generations, the last deleted one is gone, the engine applied rows (at most
  two per upload and replace: the mailbox holds states, so a slot written twice between two of the
  engine's reads is applied once) and rejected none.
* Ratios per adjacent pair (on, off): tokens/s off/on (a slowdown above 1), and TTFT p50 and p99
  on/off over the pooled probes of the pairs, each with a bootstrap 95 % interval that resamples
  whole pairs (probes in one round are not independent); verdict "met" when the interval lies at
  or below 1.05, "not met" when above, "unresolved" otherwise or with fewer than ``MIN_PAIRS``.
  Beside them, per round: engine steps and ms per step, hotwire's host time per step from its
  mailbox counters (``serving.host_stats``; medians on / off in the report), the pusher's call
  latencies and achieved cadence, and how long its pushes took to show after it stopped.
* Checks: every completed load request and probe is 200 with ``max_tokens`` tokens; at the end
  hotwire counted at least the steered requests that completed and at most those sent, and no
  ``unsteered_*`` refusal; no preemption.

The JSON (``--out``) is rewritten after every round (each round keeps its probes' TTFTs), so a
time-out keeps what was measured. Run time: start-up (~1.5-2 min at 0.6B on the H200) plus
``--gap-s`` + ``--window-s`` + ~0.5 s per round, until the next round would overrun ``--budget-s``
(default 450 s: ~28 rounds, 14 pairs at 0.6B). ``--smoke`` runs the tiny random model on CPU: it
checks the script end to end; its numbers mean nothing.

    python benchmarks/registration_load.py --shape qwen3-0.6b \\
        --out benchmarks/results/h200-DATE-registration-qwen3-0.6b.json
    python benchmarks/registration_load.py --smoke --out /tmp/registration-smoke.json   # CPU, end to end only
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import platform
import secrets
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import numpy as np

from hotwire.shared.mailbox import clock_ns
from hotwire.tools.tiny_model import benchmark_model, steered_layers
from serving import (SERVER_CORES, Load, add_common_args, Managed, Server, check_steering, cpu_plan, engine_args, median,
                     median_ci, print_logs, snapshot, start_run, stop_all, verdict, wait_ready, window_row,
                     write_vectors)

TARGET = 1.05
MIN_PAIRS = 4  # fewer pairs' bootstrap interval is too narrow to trust: "unresolved"
GPU_MEMORY_UTILIZATION = 0.25
PROBE_ROOM = 16  # sequences beyond the load's C, for the probes in flight
LAND_TIMEOUT_S = 10.0  # for the pushes of a round to show in the engine


class ControlApi(Managed):
    """``hotwire control-api`` on one engine's mailbox, with a fresh catalog and a bearer token."""

    def __init__(self, work: Path, mailbox: Path, cpus: list[int] | None):
        self.token = secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOTWIRE_")}
        super().__init__("control_api", work / "control_api.log", {**env, "HOTWIRE_TOKEN": self.token}, cpus)
        self.mailbox, self.state_dir = mailbox, work / "control-state"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "hotwire.control_api.cli", "control-api", "--host", "127.0.0.1",
                "--port", str(self.port), "--mailbox", str(self.mailbox), "--state-dir", str(self.state_dir),
                "--log-level", "warning"]

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)

    def wait_ready(self, timeout: float = 120) -> float:
        """Seconds until /readyz (attached to the engine, layers armed, heartbeat fresh)."""
        t0 = time.monotonic()
        with httpx.Client(timeout=5) as client:
            while not self.get_ok(client, "/readyz"):
                if (why := self.died()) is not None:
                    raise SystemExit(why)
                if time.monotonic() - t0 > timeout:
                    raise SystemExit(f"control API not ready after {timeout:g} s:\n" + self.tail(4000))
                time.sleep(0.2)
        return time.monotonic() - t0


class Pusher:
    """Every second: upload a new vector, replace one, delete the oldest, through the control API.

    Runs on a thread while a round's pushes are on; a failed call stops it and fails the run at
    :meth:`stop`."""

    def __init__(self, api: ControlApi, n_layers: int, hidden: int, layers: tuple[int, int], pool: int):
        self.http = api.http()
        self.shape, self.layers, self.pool = (n_layers, hidden), list(layers), pool
        self.rng = np.random.default_rng(1)
        self.live: collections.deque[str] = collections.deque()  # its vectors, oldest first
        self.made = 0
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _call(self, op: str, method: str, path: str, expect: int, **kw) -> dict | None:
        t = time.perf_counter()
        r = self.http.request(method, path, **kw)
        self.ms[op].append(1000 * (time.perf_counter() - t))
        if r.status_code != expect:
            raise RuntimeError(f"{op} {path}: HTTP {r.status_code} (expected {expect}): {r.text[:1000]}")
        self.counts[op] += 1
        return r.json() if r.content else None

    def _upload(self, vector_id: str, replace: bool) -> int:
        data = self.rng.standard_normal(self.shape).astype("<f4")
        body = {"id": vector_id, "data": base64.b64encode(data.tobytes()).decode(), "dtype": "float32",
                "shape": list(self.shape), "layers": self.layers, "replace": replace}
        op = "replace" if replace else "upload"
        return self._call(op, "POST", "/steer/vectors", 200 if replace else 201, json=body)["generation"]

    def _new(self) -> str:
        self.made += 1
        vector_id = f"push-{self.made}"
        self.last_new = (vector_id, self._upload(vector_id, replace=False))
        return vector_id

    def _reset(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.ms: dict[str, list[float]] = {"upload": [], "replace": [], "delete": []}  # call latencies
        self.tick_at: list[float] = []  # when each tick began (monotonic)
        self.last_new = self.last_replaced = self.last_deleted = None

    def prime(self) -> None:
        """Its first ``pool`` vectors, before any round."""
        self._reset()
        for _ in range(self.pool):
            self.live.append(self._new())

    def start(self) -> None:
        self._reset()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = time.monotonic()
        try:
            while not self._stop.is_set():
                self.tick_at.append(time.monotonic())
                fresh = self._new()
                target = self.live[-1]  # the newest but this one: replaced, and deleted only `pool` ticks later
                self.last_replaced = (target, self._upload(target, replace=True))
                oldest = self.live.popleft()
                self._call("delete", "DELETE", f"/steer/vectors/{oldest}", 204)
                self.last_deleted = oldest
                self.live.append(fresh)
                self.counts["ticks"] += 1
                tick += 1.0
                if time.monotonic() > tick:
                    self.counts["late_ticks"] += 1  # the three calls took longer than a second
                    tick = time.monotonic()
                self._stop.wait(max(0.0, tick - time.monotonic()))
        except Exception as e:  # re-raised by stop()
            self.error = e

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise SystemExit(f"pusher: {self.error}")
        out = {k: self.counts[k] for k in ("upload", "replace", "delete", "ticks", "late_ticks")}
        spans = np.diff(self.tick_at)  # the achieved cadence, from one tick's start to the next
        out["ticks_per_s"] = round(1 / float(np.mean(spans)), 3) if spans.size else None
        # per call: median and largest ms
        out["call_ms"] = {op: [round(float(np.median(v)), 2), round(float(np.max(v)), 2)]
                          for op, v in self.ms.items() if v}
        return out

    def verify(self, server: Server, before: dict[str, int]) -> dict:
        """The round's pushes landed in the engine (see the module's docstring); ``landed_s``: from
        the pusher's stop until they all showed."""
        t0 = time.monotonic()
        deadline = t0 + LAND_TIMEOUT_S
        target = self._get("/steer/slots")["engine"]["target_generation"]
        while True:
            table = self._get("/steer/slots")
            new, replaced = (self._get(f"/steer/vectors/{v}") for v, _ in (self.last_new, self.last_replaced))
            landed = (table["engine"]["applied_generation"] >= target and new["resident"] and replaced["resident"])
            if landed or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        gone = self.http.get(f"/steer/vectors/{self.last_deleted}").status_code
        after = server.beat()[1]
        rows = after["mailbox_rows_applied"] - before["mailbox_rows_applied"]
        wrote = self.counts["upload"] + self.counts["replace"]
        problems = []
        if not landed:
            problems.append(f"not applied within {LAND_TIMEOUT_S:g} s: generation "
                            f"{table['engine']['applied_generation']} of {target}, {self.last_new[0]} resident "
                            f"{new['resident']}, {self.last_replaced[0]} resident {replaced['resident']}")
        if (new["generation"], replaced["generation"]) != (self.last_new[1], self.last_replaced[1]):
            problems.append(f"generations {new['generation']}, {replaced['generation']}; pushed "
                            f"{self.last_new[1]}, {self.last_replaced[1]}")
        if gone != 404:
            problems.append(f"deleted {self.last_deleted} answers {gone}")
        if rows < 1 or after["mailbox_rejected"] or after["mailbox_errors"]:
            problems.append(f"{rows} rows applied for {wrote} uploads and replaces; counters {after}")
        if problems:
            raise SystemExit("pushes did not land: " + "; ".join(problems))
        return {"landed_s": round(time.monotonic() - t0, 3), "rows_applied": rows,
                "rows_written": len(self.layers) * wrote, "applied_generation": table["engine"]["applied_generation"]}

    def _get(self, path: str) -> dict:
        r = self.http.get(path)
        if r.status_code != 200:
            raise SystemExit(f"control API {path}: HTTP {r.status_code}: {r.text[:1000]}")
        return r.json()

    def close(self) -> None:
        self.http.close()


# ---------------------------------------------------------------- report
def _pooled_ci(on: list[np.ndarray], off: list[np.ndarray], q: float,
               resamples: int = 2000) -> tuple[float, float, float, list[float]]:
    """The ``q`` quantile of the pooled probes with pushes on and off, their ratio on / off, and its
    bootstrap 95 % interval resampling whole pairs of rounds. Vectorised: a resample weights each pair by how often it was
    drawn, and a quantile is the first sorted sample whose cumulative weight reaches ``q``."""
    n = len(on)
    weights = np.random.default_rng(0).multinomial(n, [1 / n] * n, size=resamples)  # [resamples, pairs]

    def quantiles(groups: list[np.ndarray], w: np.ndarray) -> np.ndarray:
        values = np.concatenate(groups)
        pair = np.repeat(np.arange(n), [len(g) for g in groups])
        order = np.argsort(values, kind="stable")
        cum = np.cumsum(w[:, pair[order]], axis=1)
        first = (cum < q * cum[:, -1:]).sum(axis=1)
        return values[order][np.minimum(first, len(values) - 1)]

    q_on, q_off = float(quantiles(on, np.ones((1, n)))[0]), float(quantiles(off, np.ones((1, n)))[0])
    ratios = quantiles(on, weights) / quantiles(off, weights)
    return q_on, q_off, round(q_on / q_off, 4), [round(float(x), 4) for x in np.quantile(ratios, [0.025, 0.975])]


def _summary(rounds: list[dict]) -> dict:
    measured = [r for r in rounds if not r["warmup"]]
    pairs = [(a, b) if a["pushes_on"] else (b, a) for a, b in zip(measured[::2], measured[1::2])]
    if not pairs:
        return {"pairs": 0}
    on, off = [p[0] for p in pairs], [p[1] for p in pairs]
    out: dict = {"pairs": len(pairs)}
    slow = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in pairs]
    out["tokens_per_s_on"] = round(median([r["tokens_per_s"] for r in on]), 1)
    out["tokens_per_s_off"] = round(median([r["tokens_per_s"] for r in off]), 1)
    out["tokens_per_s_off_over_on"] = round(median(slow), 4)
    out["tokens_per_s_off_over_on_ci95"] = median_ci(slow)
    on_ttft = [np.asarray(r["ttft_ms"]) for r in on]
    off_ttft = [np.asarray(r["ttft_ms"]) for r in off]
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        q_on, q_off, out[f"ttft_{name}_on_over_off"], out[f"ttft_{name}_on_over_off_ci95"] = \
            _pooled_ci(on_ttft, off_ttft, q)
        out[f"ttft_{name}_ms_on"], out[f"ttft_{name}_ms_off"] = round(q_on, 2), round(q_off, 2)
    server = [(a.get("server_ttft_mean_ms"), b.get("server_ttft_mean_ms")) for a, b in pairs]
    if all(a and b for a, b in server):
        out["server_ttft_mean_on_over_off"] = round(median([a / b for a, b in server]), 4)
    out["probes_per_round"] = round(median([len(r["ttft_ms"]) for r in measured]))
    out["probe_lag_max_ms"] = max(r["probe_lag_max_ms"] for r in measured)  # a late probe: the client was slow
    out["ticks_per_s"] = round(median([r["pushes"]["ticks_per_s"] for r in on]), 3)  # medians of rounds
    out["pushes"] = {op: sum(r["pushes"][op] for r in on) for op in ("upload", "replace", "delete", "late_ticks")}
    for field in ("steady_us_per_step", "changed_us_per_step", "host_us_per_step", "step_ms"):
        values = [median([r.get(field) for r in side]) for side in (on, off)]
        if None not in values:
            out[f"{field}_on_off"] = [round(v, 3) for v in values]
    out["target"] = {k: verdict(out[f"{k}_ci95"], TARGET, at_least=False) if len(pairs) >= MIN_PAIRS else "unresolved"
                     for k in ("ttft_p50_on_over_off", "ttft_p99_on_over_off", "tokens_per_s_off_over_on")}
    return out


def _report(s: dict) -> str:
    if not s["pairs"]:
        return "no complete pair of rounds"
    lines = [f"{s['pairs']} pairs of rounds (pushes on / off), {s['probes_per_round']} probes per round "
             f"(sent up to {s['probe_lag_max_ms']:g} ms late); "
             f"pushes: {s['ticks_per_s']:.2f} per s (each an upload, a replace and a delete), {s['pushes']}", "",
             "| measure | on | off | ratio | 95 % CI | verdict (<= 1.05) |", "| --- | --- | --- | --- | --- | --- |"]
    for key, label, unit in (("ttft_p50", "TTFT p50", "ms"), ("ttft_p99", "TTFT p99", "ms")):
        ci = s[f"{key}_on_over_off_ci95"]
        lines.append(f"| {label} ({unit}) | {s[f'{key}_ms_on']:.2f} | {s[f'{key}_ms_off']:.2f} | "
                     f"{s[f'{key}_on_over_off']:.4f} (on/off) | {ci[0]:.4f}-{ci[1]:.4f} | "
                     f"{s['target'][f'{key}_on_over_off']} |")
    ci = s["tokens_per_s_off_over_on_ci95"]
    lines.append(f"| tokens/s | {s['tokens_per_s_on']:g} | {s['tokens_per_s_off']:g} | "
                 f"{s['tokens_per_s_off_over_on']:.4f} (off/on) | {ci[0]:.4f}-{ci[1]:.4f} | "
                 f"{s['target']['tokens_per_s_off_over_on']} |")
    extra = [f"{k[:-7]} {v[0]:g} / {v[1]:g}" for k, v in s.items() if k.endswith("_on_off")]
    if extra:
        lines += ["", "medians on / off: " + "; ".join(extra)]
    if "server_ttft_mean_on_over_off" in s:
        lines.append(f"server-side mean TTFT of all requests, on/off: {s['server_ttft_mean_on_over_off']:.4f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def main() -> None:
    t0 = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, help="load requests in flight (default 64; smoke: 4)")
    ap.add_argument("--rounds", type=int, help="most measured rounds (default 60: the budget ends them; smoke: 4)")
    ap.add_argument("--window-s", type=float, help="measured window per round (default 8; smoke 4)")
    ap.add_argument("--gap-s", type=float, default=2.0, help="before each window, pushes already on (default 2)")
    ap.add_argument("--probe-rate", type=float, help="probes per second (default 20; smoke 2)")
    ap.add_argument("--probe-tokens", type=int, default=16, help="tokens each probe generates (default 16)")
    ap.add_argument("--pool", type=int, default=4, help="pusher's vectors alive at a time (default 4)")
    add_common_args(ap)
    args = ap.parse_args()
    gpu = start_run(args.smoke, args.timed_configs)
    if args.pool < 2:
        raise SystemExit("--pool must be at least 2 (one is replaced while the oldest is deleted)")
    c = args.concurrency or (4 if args.smoke else 64)
    rounds = args.rounds or (4 if args.smoke else 60)
    window = args.window_s or (4.0 if args.smoke else 8.0)
    if args.gap_s + window < 2:
        raise SystemExit("--gap-s + --window-s must span at least two pushes (2 s)")
    rate = args.probe_rate or (2.0 if args.smoke else 20.0)
    prompt_len, max_tokens = (16, 8) if args.smoke else (128, 128)
    lengths = (max_tokens // 2, max_tokens + max_tokens // 2)
    work = Path(tempfile.mkdtemp(prefix="hotwire-registration-"))

    model, shape_name = benchmark_model(work, args.shape, args.smoke)
    shape = json.loads((model / "config.json").read_text())
    write_vectors(work / "vectors", shape["hidden_size"])
    layers = steered_layers(shape["num_hidden_layers"])
    engine = engine_args(shape, args.smoke, c + PROBE_ROOM, prompt_len, max_tokens, GPU_MEMORY_UTILIZATION)
    plan = None if args.smoke else cpu_plan([SERVER_CORES, 1], args.client_processes + 1)
    if plan is not None:
        os.sched_setaffinity(0, plan[1])  # this process (the pusher) and the load generator's
    server = Server("hotwire", work, model, engine, plugin=True, vectors=work / "vectors", cpus=plan and plan[0][0])
    api = ControlApi(work, server.mailbox, plan and plan[0][1])
    make = dict(vocab=shape["vocab_size"], layers=layers, fraction=args.steered_fraction, prompt_len=prompt_len)

    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "host": platform.node(), "gpu": gpu or "cpu", "torch": version("torch"), "shape": shape_name,
              "config": {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
              "engine": engine, "concurrency": c, "max_rounds": rounds, "window_s": window, "gap_s": args.gap_s,
              "budget_s": args.budget_s, "probe_rate": rate, "probe_tokens": args.probe_tokens, "pool": args.pool,
              "prompt_len": prompt_len, "max_tokens_range": lengths, "steered_fraction": args.steered_fraction,
              "client_processes": args.client_processes,
              "cpus": None if plan is None else {"hotwire": plan[0][0], "control_api": plan[0][1], "clients": plan[1]},
              "phases_s": {}, "stopped_by": "rounds", "rounds": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"work dir (logs): {work}", flush=True)
    load = Load(args.client_processes, probes=True)
    client = httpx.Client(timeout=30)
    pusher = None
    probes_sent = {"steered_started": 0, "steered_completed": 0}
    try:
        server.start()
        result["startup_s"] = wait_ready([server], t0)
        api.start()
        result["control_api_ready_s"] = round(api.wait_ready(), 1)
        result["vllm"] = client.get(server.url + "/version").json().get("version")
        pusher = Pusher(api, shape["num_hidden_layers"], shape["hidden_size"], layers, args.pool)
        pusher.prime()
        result["phases_s"]["startup"] = round(time.monotonic() - t0, 1)
        print(f"startup: {result['phases_s']['startup']:.0f} s (vLLM {result['vllm']}), control API ready", flush=True)

        deadline = t0 + args.budget_s
        start_counters = server.counters_after(clock_ns())
        load.start(server.url, c, {**make, "max_tokens": lengths, "seed": 1},
                   time.time() + deadline - time.monotonic() + 120)  # the processes' own stop (epoch s)
        schedule = [True, False] + [k % 4 in (0, 3) for k in range(rounds)]  # warm-up pair, then A B B A
        last = args.gap_s + window
        t_rounds = time.monotonic()
        for r, on in enumerate(schedule):
            if time.monotonic() + last > deadline:
                result["stopped_by"] = "budget"
                break
            t = time.monotonic()
            before = server.beat()[1]
            if on:
                pusher.start()
            start_at = time.time() + args.gap_s
            probes = load.probes(server.url, start_at, window, rate,
                                 {**make, "max_tokens": (args.probe_tokens, args.probe_tokens), "seed": 100 + r})
            load.wait(t + args.gap_s)
            a = snapshot(server, client)
            load.wait(a["metrics"]["t"] + window)
            b = snapshot(server, client)
            row = {"round": r - 2, "warmup": r < 2, "pushes_on": on, **window_row(a, b)}
            if on:
                row["pushes"] = pusher.stop()
                row["landed"] = pusher.verify(server, before)
            samples = probes.result()
            probes_sent["steered_started"] += sum(p["steered"] for p in samples)
            probes_sent["steered_completed"] += sum(p["steered"] for p in samples)
            ttft = np.array([p["ttft_s"] for p in samples]) * 1000
            row.update(probes=len(samples), ttft_p50_ms=round(float(np.quantile(ttft, 0.5)), 2),
                       ttft_p99_ms=round(float(np.quantile(ttft, 0.99)), 2),
                       probe_lag_max_ms=round(1000 * max(p["lag_s"] for p in samples), 1),
                       ttft_ms=[round(x, 2) for x in ttft.tolist()])
            if row["preemptions"]:
                raise SystemExit(f"{row['preemptions']} preemptions: the KV cache is too small")
            result["rounds"].append(row)
            result["summary"] = _summary(result["rounds"])
            args.out.write_text(json.dumps(result, indent=1))  # partial results survive a time-out
            last = time.monotonic() - t
            push = (f", pushes {row['pushes']['ticks_per_s']:.2f}/s landed after {row['landed']['landed_s']:.2f} s"
                    if on else "")
            print(f"round {row['round']}{' (warm-up)' if row['warmup'] else ''} pushes {'on ' if on else 'off'}: "
                  f"{row['tokens_per_s']:.0f} tok/s, TTFT p50 {row['ttft_p50_ms']:.1f} p99 {row['ttft_p99_ms']:.1f} ms "
                  f"({row['probes']} probes){push} ({last:.0f} s)", flush=True)
        result["phases_s"]["rounds"] = round(time.monotonic() - t_rounds, 1)
        sent = load.stop()
        server.wait_idle(client)
        total = {k: sent.get(k, 0) + probes_sent.get(k, 0) for k in ("steered_started", "steered_completed")}
        result["load"] = {**{k: sent.get(k, 0) for k in ("completed", "cancelled", "resent")},
                          "client_cpu_s": sent["client_cpu_s"],
                          "steered_counted": check_steering(server.name, start_counters,
                                                            server.counters_after(clock_ns()), total)}
    except BaseException:
        print_logs([server, api])
        raise
    finally:
        if pusher is not None:
            pusher.close()
        client.close()
        load.shutdown()
        stop_all([api, server])
    result["phases_s"]["total"] = round(time.monotonic() - t0, 1)
    result["summary"] = _summary(result["rounds"])
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{shape_name} on {result['gpu']}, vLLM {result['vllm']}, C={c} ({args.steered_fraction:.0%} steered), "
          f"probes {rate:g}/s of {args.probe_tokens} tokens, windows {window:g} s, phases {result['phases_s']}, "
          f"load {result['load']}" + (" (smoke: the numbers mean nothing)" if args.smoke else "") + "\n")
    print(_report(result["summary"]))


if __name__ == "__main__":
    main()
