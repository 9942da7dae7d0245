"""What ``serve_throughput.py`` and ``registration_load.py`` share: ``vllm serve`` processes pinned
to their own cores, a closed-loop load that keeps exactly C requests in flight until told to stop,
streamed probes for time to first token, windows read from the server's own counters, and the
statistics.

Why windows: a round that sends a fixed set of requests and times the whole of it measures its
ramp-up (C prefills at once) and its tail (the last requests finishing with the batch nearly empty)
as much as the steady state; on the H200 those rounds scattered by 5-12 %. Here the load runs
until stopped, a window starts once it has settled, and its tokens are the difference of vLLM's
own ``vllm:generation_tokens_total`` between the window's two ``/metrics`` reads (each read timed
at the midpoint of its request). Request lengths are drawn per request (``max_tokens`` uniform in
[L/2, 3L/2]), so the C requests that start together do not also finish together, step after step.

hotwire's counters (``steps``, ``host_ns`` and the per-hook ones) reach the mailbox only when the
engine's heartbeat publishes them, together with the heartbeat's time stamp; a window's counter
deltas are therefore taken between the two heartbeats last published before its edges, over those
heartbeats' own time stamps (for shares of the window), not waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from hotwire.engine_plugin.counters import STEP_TIME  # hotwire's step-time counters (an older engine lacks some)
from hotwire.shared.spec import SPEC_KEY
from host_state import per_call_us

SERVED = "bench"  # the served model name
N_VECTORS = 256  # startup vectors v0..v255 the steered requests name
STARTUP_TIMEOUT_S = 480
SERVER_CORES = 3  # physical cores per server: API server, engine core and their helper threads


# ---------------------------------------------------------------- processes
class Managed:
    """A subprocess in its own session (its process group is signalled as a whole), logging to a file."""

    def __init__(self, name: str, log: Path, env: dict[str, str], cpus: list[int] | None):
        self.name, self.log, self.env, self.cpus = name, log, env, cpus
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        pin = [] if self.cpus is None else ["taskset", "-c", ",".join(map(str, self.cpus))]
        argv = [*pin, *self.argv()]
        with open(self.log, "w") as log:
            log.write(" ".join(argv) + "\n")
            log.flush()
            self.proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"{self.name} exited with {self.proc.returncode}; log {self.log}:\n" + self.tail(6000)

    def tail(self, n: int) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def get_ok(self, client: httpx.Client, path: str) -> bool:
        try:
            return client.get(self.url + path).status_code == 200
        except httpx.HTTPError:
            return False

    def pin(self, cpus: list[int]) -> None:
        """Move every thread of the group's processes onto ``cpus`` (threads started later inherit
        it from the thread that starts them): the simultaneous design's rotation of core sets."""
        import psutil

        root = psutil.Process(self.proc.pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                threads = p.threads()
            except psutil.NoSuchProcess:
                continue
            for t in threads:
                try:
                    os.sched_setaffinity(t.id, cpus)
                except (ProcessLookupError, PermissionError):  # a thread that has ended since
                    continue
        self.cpus = list(cpus)

    def steal_seconds(self) -> float:
        """CPU time the hypervisor has taken from this server's pinned cores so far (all cores when
        unpinned; 0 on a host that is no VM): windows whose host was slowed by a neighbour show it."""
        import psutil

        times = psutil.cpu_times(percpu=True)
        return sum(getattr(times[i], "steal", 0.0) for i in (self.cpus or range(len(times))) if i < len(times))

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system, all threads) each process of the group has used so far, by
        process name (the API server's, ``VLLM::EngineCore``, ...): where a host-bound server's time goes."""
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

    def signal(self, sig: int) -> bool:
        """Signal the whole process group; False when none of it is left."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the leader's pid is the group id
        except (ProcessLookupError, PermissionError):
            return False
        return True


def engine_core(server: Server) -> psutil.Process:
    """The server's engine-core process (vLLM names it ``VLLM::EngineCore``)."""
    import psutil

    root = psutil.Process(server.proc.pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            if "EngineCore" in p.name() or any("EngineCore" in part for part in p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            continue
    raise SystemExit(f"{server.name}: no EngineCore process under pid {root.pid}")


def phase_readings(servers: list[Server], folder: Path) -> dict[str, dict | None]:
    """Each server's engine-core phase totals as last written (``bench_site/step_phases.py``)."""
    from bench_site import step_phases

    return {s.name: step_phases.read(folder, engine_core(s).pid) for s in servers}


class Server(Managed):
    """One ``vllm serve`` (API server, engine core, worker), with or without hotwire loaded."""

    def __init__(self, name: str, work: Path, model: Path, engine: dict, *, plugin: bool, vectors: Path,
                 cpus: list[int] | None, env: dict[str, str] | None = None):
        base = {k: v for k, v in os.environ.items() if not k.startswith("HOTWIRE_") and k != "VLLM_PLUGINS"}
        self.mailbox = work / f"{name}.mbx"
        if not plugin:
            base["VLLM_PLUGINS"] = "none"  # vLLM loads no general plugin (unless ``env`` names one)
        base.update(HOTWIRE_MAILBOX=str(self.mailbox), HOTWIRE_VECTORS=str(vectors), **(env or {}))
        super().__init__(name, work / f"{name}.log", base, cpus)
        self.model, self.engine, self.plugin = model, engine, plugin
        self._view = None

    def argv(self) -> list[str]:
        flags = []
        for key, value in self.engine.items():
            flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-uvicorn-access-log", *flags]

    # hotwire's mailbox (read only)
    def beat(self) -> tuple[int, dict[str, int]]:
        """(time stamp of the heartbeat last published, in ns, the counters as published)."""
        if self._view is None:
            from hotwire.shared.mailbox import MailboxView

            self._view = MailboxView.open(str(self.mailbox))
        return int(self._view.header["heartbeat_ns"]), self._view.counters()

    def counters_after(self, t_ns: int, timeout: float = 10.0) -> dict[str, int]:
        """The counters as published by the first heartbeat after ``t_ns`` (``mailbox.clock_ns()``)."""
        deadline = time.monotonic() + timeout
        while True:
            beat_ns, counters = self.beat()
            if beat_ns > t_ns:
                return counters
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.name}: no hotwire heartbeat for {timeout:g} s")
            time.sleep(0.01)

    def close_mailbox(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None

    # vLLM's /metrics
    def metrics(self, client: httpx.Client) -> dict[str, float]:
        """The server's counters and gauges that the benchmarks read, with ``t``: the midpoint of
        the request (``time.monotonic()``) and ``read_ms``: how long it took."""
        from prometheus_client.parser import text_string_to_metric_families

        want = {"vllm:generation_tokens_total": "generation_tokens", "vllm:iteration_tokens_total_count": "steps",
                "vllm:num_preemptions_total": "preemptions", "vllm:num_requests_running": "running",
                "vllm:num_requests_waiting": "waiting", "vllm:time_to_first_token_seconds_sum": "ttft_sum_s",
                "vllm:time_to_first_token_seconds_count": "ttft_count"}
        for attempt in range(2):  # once more on a dropped connection: uvicorn closes one idle for 5 s, a
            t0 = time.monotonic()  # window's length, and may do so as the client reuses it
            try:
                text = client.get(self.url + "/metrics").text
                break
            except httpx.TransportError:
                if attempt:
                    raise
        t1 = time.monotonic()
        out: dict[str, float] = {"t": (t0 + t1) / 2, "read_ms": 1000 * (t1 - t0)}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in want:
                    out[want[sample.name]] = out.get(want[sample.name], 0.0) + sample.value
        missing = set(want.values()) - set(out)
        if missing:
            raise SystemExit(f"{self.name}: /metrics lacks {sorted(missing)} (this vLLM names them otherwise)")
        return out

    def wait_idle(self, client: httpx.Client, timeout: float = 15.0) -> float:
        """Seconds until no request runs or waits (after the load stopped: its cancelled requests
        aborted); fails the run when the server stays busy."""
        t0 = time.monotonic()
        while True:
            m = self.metrics(client)
            if m["running"] + m["waiting"] == 0:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"{self.name}: {m['running']:.0f} running, {m['waiting']:.0f} waiting "
                                 f"{timeout:g} s after the load stopped")
            time.sleep(0.05)


def stop_all(procs: list[Managed]) -> None:
    """SIGTERM every group, give them 10 s together, then SIGKILL what is left (vLLM's engine core and
    workers may outlive the API server). Short: a caller's time-out (``timeout -k``) may SIGKILL this
    process soon after interrupting it, and the servers are in other sessions."""
    for p in procs:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(p.proc is not None and p.proc.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in procs:
        while p.signal(signal.SIGKILL) and time.monotonic() < deadline + 10:
            p.proc.poll()  # reap the leader: a zombie keeps its group signalable
            time.sleep(0.2)
        if p.proc is not None:
            p.proc.wait()
        if isinstance(p, Server):
            p.close_mailbox()


def print_logs(procs: list[Managed]) -> None:
    """Why a run failed is usually in a server's log."""
    for p in (p for p in procs if p.proc is not None):
        print(p.died() or f"--- {p.name} (running), log tail:\n" + p.tail(4000), flush=True)


@contextlib.contextmanager
def running(procs: list[Managed], load: "Load", client: httpx.Client):
    """A benchmark's run of ``procs``: their log tails printed if it fails; the client, the load
    generator and every process stopped however it ends."""
    try:
        yield
    except BaseException:
        print_logs(procs)
        raise
    finally:
        client.close()
        load.shutdown()
        stop_all(procs)


def cpu_plan(cores: list[int], clients: int, per_core: int = 1) -> tuple[list[list[int]], list[int]] | None:
    """Disjoint CPU sets: ``cores[i]`` physical cores (hyperthread siblings together) for process i,
    the rest for the load generator's ``clients`` processes, ``per_core`` of them to a physical core
    (at least ``ceil(clients / per_core)`` cores); None when the CPUs this process may use are too few
    or there is no ``taskset`` to start a process on its set (it execs the process, so a vLLM API
    server keeps its pid and every process it starts inherits the set).

    Why: a host-bound server's step time follows the core its engine thread lands on; with every
    process free to move, a neighbour on the sibling hyperthread moved whole rounds by 10-20 %.
    """
    allowed = sorted(os.sched_getaffinity(0))
    by_core: dict[str, list[int]] = {}
    for cpu in allowed:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        by_core.setdefault(siblings, []).append(cpu)
    whole = sorted(by_core.values(), key=len, reverse=True)  # pinned processes first get whole cores
    take, need = sum(cores), -(-clients // per_core)
    taskset = shutil.which("taskset")
    if len(whole) < take + need or taskset is None:
        why = "no taskset" if taskset is None else (
            f"{'+'.join(map(str, cores))} pinned + {clients} load-generator processes ({per_core} to a core) "
            f"need {take + need} physical cores, {len(whole)} allowed")
        print(f"CPU pinning off ({why}): rounds scatter more", file=sys.stderr, flush=True)
        return None
    flat, starts = itertools.chain.from_iterable, [0, *itertools.accumulate(cores)]
    sets = [sorted(flat(whole[a:b])) for a, b in zip(starts, starts[1:])]
    return sets, sorted(flat(whole[take:]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(servers: list[Server], t0: float) -> dict[str, float]:
    """Wait for every server's /health; fail at once when one dies. Returns start-up seconds."""
    ready: dict[str, float] = {}
    with httpx.Client(timeout=5) as client:  # one client: building one is slow on a busy host
        while len(ready) < len(servers):
            for s in servers:
                if s.name in ready:
                    continue
                if (why := s.died()) is not None:
                    raise SystemExit(why)
                if s.get_ok(client, "/health"):
                    ready[s.name] = round(time.monotonic() - t0, 1)
                    print(f"{s.name} ready after {ready[s.name]:.0f} s", flush=True)
                    if s.mailbox.exists() != s.plugin:  # only an armed engine creates its mailbox
                        raise SystemExit(f"{s.name}: hotwire armed={s.mailbox.exists()}, expected {s.plugin}\n"
                                         + s.tail(6000))
            if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                late = [s.name for s in servers if s.name not in ready]
                raise SystemExit(f"not ready after {STARTUP_TIMEOUT_S} s: {late}")
            time.sleep(0.5)
    return ready


def add_common_args(ap: argparse.ArgumentParser, clients_help: str | None = None) -> None:
    """The options every served benchmark takes, beside its own. ``clients_help``: a caller that
    picks the number of load-generator processes itself (``--client-processes`` then defaults to
    None) says how."""
    ap.add_argument("--shape", default="qwen3-0.6b", help="qwen3-0.6b | qwen3-4b | qwen3-8b (ignored with --smoke)")
    ap.add_argument("--budget-s", type=float, default=450,
                    help="no round starts that would end later than this after the start (default 450)")
    ap.add_argument("--client-processes", type=int, default=None if clients_help else 4,
                    help=clients_help or "load-generator processes (default 4)")
    ap.add_argument("--steered-fraction", type=float, default=0.5)
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the script, numbers mean nothing")
    ap.add_argument("--timed-configs", action="store_true",
                    help="let inductor choose reduction configs by timing them at compile (vLLM's default); "
                         f"without it every server starts with {RULE_CONFIGS}=1 (one config by rule)")
    ap.add_argument("--out", type=Path, required=True)


# Inductor times a reduction kernel's candidate configs on the device at its first run and keeps the
# fastest. Servers compiling at once on one shared GPU time them under each other's load, so each
# may keep another config: a difference between server instances that no window of the run sees.
# With this set every server keeps the one config inductor picks by rule, the same in all.
RULE_CONFIGS = "TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS"


def start_run(smoke: bool, timed_configs: bool = False) -> str | None:
    """A SIGTERM runs the callers' ``finally`` (which stops the servers); the servers to be started
    get :data:`RULE_CONFIGS` unless ``timed_configs``; the GPU's name, or exit when a GPU run finds
    none."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not timed_configs:
        os.environ[RULE_CONFIGS] = "1"  # the servers' environment is this process's (Server)
    gpu = None if smoke else gpu_name()
    if not smoke and gpu is None:
        raise SystemExit("no NVIDIA GPU (nvidia-smi): use --smoke to check the script on CPU")
    return gpu


def host_speed_us() -> float:
    """µs this host takes for a fixed piece of pure Python on one core (the median of 7 runs).

    Why: the same GPU kind comes on hosts of different speeds, and the host decides the regime a
    served run finds: at 256 in flight four servers on one H100 were host-bound on a slower host
    and waited for the GPU on a faster one, and steering's cost differed with it (session 29).
    Recorded before the servers start, so their load does not enter it. It does not say how fast
    vLLM runs there: session 40's host ran it as fast as session 38's and vLLM's steps 1.7 times
    slower (compare runs by plugin-free's own step phases, and see :func:`host_cpu`)."""
    return round(per_call_us(lambda: sum(i * i for i in range(100_000)), repeat=7, inner=1), 1)


def host_cpu(cpuinfo: str | None = None, smt: str | None = None) -> dict:
    """The host's CPU as a served run records it: its model, how many logical CPUs the host has, and
    whether they are hyperthreads of shared cores (``smt``: the kernel's
    ``/sys/devices/system/cpu/smt/active``, None where it does not say). Hosts of one GPU kind differ
    (:func:`host_speed_us`), and this is what can tell two of them apart afterwards."""
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    cpuinfo = read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    smt = read("/sys/devices/system/cpu/smt/active") if smt is None else smt
    model = next((line.split(":", 1)[1].strip() for line in (cpuinfo or "").splitlines()
                  if line.startswith("model name")), None)
    return {"model": model, "cpus": os.cpu_count(),
            "smt": None if smt is None or smt.strip() not in ("0", "1") else smt.strip() == "1"}


def visible_gpus() -> list[str]:
    """The GPUs this process's children see, as ``CUDA_VISIBLE_DEVICES`` names them (else every
    GPU ``nvidia-smi`` lists, by index)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(len(gpu_names()))]


def smi_index(device: str | None) -> int | None:
    """``nvidia-smi``'s index for a ``CUDA_VISIBLE_DEVICES`` entry; None for a UUID or none (then a
    reading covers every GPU)."""
    return int(device) if device is not None and device.isdigit() else None


def gpu_names() -> list[str]:
    """Each visible NVIDIA GPU's name and driver (``nvidia-smi``, in its index order); none without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def gpu_name() -> str | None:
    names = gpu_names()
    return names[0] if names else None


def startup_vectors(hidden: int) -> np.ndarray:
    """The ``N_VECTORS`` random startup vectors v0, v1, ... the steered requests name, one per row
    (float32, seeded: every server that loads them gets the same values)."""
    return np.random.default_rng(0).standard_normal((N_VECTORS, hidden)).astype(np.float32)


def write_vectors(folder: Path, hidden: int) -> Path:
    """:func:`startup_vectors` as hotwire's ``HOTWIRE_VECTORS`` folder (``v<i>.safetensors``)."""
    from hotwire.shared.wire import encode_safetensors

    folder.mkdir(parents=True, exist_ok=True)
    for i, vec in enumerate(startup_vectors(hidden)):
        (folder / f"v{i}.safetensors").write_bytes(encode_safetensors(vec))
    return folder


def engine_args(shape: dict, smoke: bool, max_seqs: int, prompt_len: int, max_tokens: int,
                gpu_memory_utilization: float) -> dict:
    """``vllm serve`` flags: CPU smoke (fp32, eager), or a dummy-weight bf16 GPU server whose KV
    cache holds every request in flight (16-token blocks, plus a quarter), so nothing is preempted;
    an explicit KV size also skips vLLM's start-up memory profiling, which a neighbour would skew."""
    engine = dict(skip_tokenizer_init=True, max_num_seqs=max_seqs)
    if smoke:
        engine.update(dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=128 * 2**20)
        return engine
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2  # bf16
    longest = prompt_len + max_tokens + max_tokens // 2
    kv_tokens = max(4096, int(1.25 * max_seqs * 16 * math.ceil(longest / 16)))
    engine.update(load_format="dummy", dtype="bfloat16", attention_backend="TRITON_ATTN", max_model_len=2048,
                  kv_cache_memory_bytes=kv_tokens * per_token, gpu_memory_utilization=gpu_memory_utilization)
    return engine


# ---------------------------------------------------------------- load
_STOP = None  # the pool's stop event (set in each load-generator process by _init)


_CPU = None  # the pool's shared array of its processes' CPU seconds (each process writes its own slot)
_SLOT = None  # this process's slot in it


def _init(stop, cpu, taken) -> None:
    global _STOP, _CPU, _SLOT
    _STOP, _CPU = stop, cpu
    with taken.get_lock():
        _SLOT, taken.value = taken.value, taken.value + 1


def _spawned(seconds: float) -> None:
    time.sleep(seconds)


UNKNOWN_PREFIX = "unknown-"  # vector ids no server of a run holds (``steer_spec``)


def steer_spec(g: int, layers: tuple[int, int], prefix: str = "v") -> list[dict]:
    """The two-entry spec of request ``g`` of a round's stream: its own startup vectors and scales, on
    the two steered layers. Scales are multiples of 1/16 (exact in JSON and in float32). Another
    ``prefix`` names vectors no server holds: the same spec text, refused at admission."""
    l1, l2 = layers
    return [{"id": f"{prefix}{g % N_VECTORS}", "layer": l1, "scale": 0.5 + (g % 17) / 16},
            {"id": f"{prefix}{(g + 7) % N_VECTORS}", "layer": l2, "scale": -0.25 - (g % 13) / 16}]


def pool_entries(pool: int, layers: tuple[int, int]) -> set[tuple[str, int, float]]:
    """The distinct (id, layer, scale) entries of a pool of ``pool`` specs (:func:`bodies`)."""
    return {(e["id"], e["layer"], e["scale"]) for g in range(pool) for e in steer_spec(g, layers)}


def steered_at(k: int, fraction: float) -> bool:
    """Is request ``k`` (from 0) of a load steered? ``fraction`` of them are, evenly spread (0.5:
    every other one, from the second)."""
    return math.floor((k + 1) * fraction) > math.floor(k * fraction)


def bodies(seed: int, client: int, clients: int, vocab: int, layers: tuple[int, int], fraction: float,
           prompt_len: int, max_tokens: tuple[int, int], stagger: int = 0, pool: int | None = None,
           unknown_ids: bool = False, spec_key: str = SPEC_KEY):
    """Endless completion bodies of one load-generator process: random token-id prompts, ``max_tokens``
    uniform in the given range, every ``1/fraction``-th one steered by its own two-entry spec
    (:func:`steer_spec`; with ``pool``, drawn from its first ``pool`` specs instead, a fixed set a
    server with a fixed slot budget can hold; with ``unknown_ids``, the same specs naming vectors
    no server holds; under ``spec_key`` in ``vllm_xargs``, which hotwire reads only when it is
    :data:`SPEC_KEY`). The same arguments give the same sequence, so every server of a round is sent
    the same requests, in the same order.

    The first ``stagger`` bodies (one per slot of a closed loop) are the rest of a request already
    under way: a length drawn in proportion to itself, then a uniform point of it (what a slot of a
    long-running loop holds at a random moment). So the load starts in its steady state: requests
    started together do not finish together, and a window after a short settle sees the batch
    a long-running server sees, not a first wave's prefills and completions."""
    rng = np.random.default_rng([seed, client])
    lengths = np.arange(max_tokens[0], max_tokens[1] + 1)
    for k in itertools.count():
        g = k * clients + client  # index in the round's interleaved stream: picks the vectors
        n = int(rng.integers(max_tokens[0], max_tokens[1] + 1))
        if k < stagger:
            n = int(rng.integers(1, rng.choice(lengths, p=lengths / lengths.sum()) + 1))
        body = {"model": SERVED, "prompt": rng.integers(10, vocab - 10, prompt_len).tolist(),
                "max_tokens": n, "temperature": 0.0, "ignore_eos": True}
        if steered_at(k, fraction):
            spec = steer_spec(g if pool is None else g % pool, layers, UNKNOWN_PREFIX if unknown_ids else "v")
            body["vllm_xargs"] = {spec_key: json.dumps(spec)}
        yield body


def steers(body: dict) -> bool:
    """Does ``body`` carry a spec hotwire reads?"""
    return SPEC_KEY in body.get("vllm_xargs", {})


async def _closed_loop(url: str, concurrency: int, make: dict, deadline: float) -> dict:
    """``concurrency`` requests in flight until the stop event (or ``deadline``, epoch s), then the ones
    in flight cancelled (the server aborts them). Every completed response must be 200 with
    ``usage.completion_tokens == max_tokens``."""
    feed = bodies(**make, stagger=concurrency)
    n = Counter()
    per_token: list[float] = []

    async def post(client: httpx.AsyncClient, body: dict) -> httpx.Response:
        """A connection the server dropped is re-sent, up to twice, and counted (``resent``)."""
        for attempt in range(3):
            try:
                return await client.post("/v1/completions", json=body)
            except httpx.TransportError:
                if attempt == 2:
                    raise
                n["resent"] += 1

    async def slot(client: httpx.AsyncClient) -> None:
        while True:
            body = next(feed)
            steered = steers(body)
            n["started"] += 1
            n["steered_started"] += steered
            t = time.perf_counter()
            try:
                r = await post(client, body)
            except asyncio.CancelledError:
                n["cancelled"] += 1
                raise
            if r.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:2000]}")
            tokens = r.json()["usage"]["completion_tokens"]
            if tokens != body["max_tokens"]:
                raise RuntimeError(f"{url}: {tokens} completion tokens, expected {body['max_tokens']}")
            per_token.append((time.perf_counter() - t) / tokens)
            n["completed"] += 1
            n["steered_completed"] += steered
            n["tokens"] += tokens

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        tasks = [asyncio.create_task(slot(client)) for _ in range(concurrency)]
        try:
            while not _STOP.is_set() and time.time() < deadline:
                await asyncio.sleep(0.02)
                _CPU[_SLOT] = time.process_time()
                for t in tasks:
                    if t.done():
                        t.result()  # a request's failure ends the run with its error
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return {**n, "per_token_s": per_token}


def _client(url: str, concurrency: int, make: dict, deadline: float) -> dict:
    """One load-generator process, with the CPU seconds it used (one near a core's worth is the
    bottleneck, not the server)."""
    cpu = time.process_time()
    out = asyncio.run(_closed_loop(url, concurrency, make, deadline))
    return {**out, "cpu_s": time.process_time() - cpu}


async def _probes(url: str, start_at: float, duration: float, rate: float, make: dict) -> list[dict]:
    """Streamed requests at ``rate`` per second from ``start_at`` (epoch s) for ``duration`` s, each
    sent on time whatever the others do (open loop); its time to first token is until the first
    streamed chunk (one token each). Each must stream ``max_tokens`` tokens, by its usage."""
    feed = bodies(**make)

    async def probe(client: httpx.AsyncClient, body: dict, at: float) -> dict:
        ttft = None
        lag = time.time() - start_at - at
        t = time.perf_counter()
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{url}: probe HTTP {r.status_code}: {(await r.aread())[:2000]!r}")
            usage = None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and ttft is None:
                    ttft = time.perf_counter() - t
                usage = chunk.get("usage") or usage
        if ttft is None or usage is None or usage["completion_tokens"] != body["max_tokens"]:
            raise RuntimeError(f"{url}: probe streamed no first token or not {body['max_tokens']} tokens: {usage}")
        return {"at": round(at, 3), "lag_s": lag, "ttft_s": ttft, "latency_s": time.perf_counter() - t,
                "steered": steers(body)}

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=None)) as client:
        tasks = []
        for j in range(max(1, round(duration * rate))):
            await asyncio.sleep(max(0.0, start_at + j / rate - time.time()))
            tasks.append(asyncio.create_task(probe(client, next(feed), j / rate)))
        return list(await asyncio.gather(*tasks))


def _probe_client(url: str, start_at: float, duration: float, rate: float, make: dict) -> list[dict]:
    return asyncio.run(_probes(url, start_at, duration, rate, make))


class Load:
    """Load-generator processes (spawned once, reused): a closed loop split over ``clients``
    processes (one asyncio + httpx client tops out before the server does: at 256 in flight one
    process delivered less than at 64, 6.2 k against 10.3 k tokens/s on the H200), and optionally
    one more for probes. The processes spawn in the background from here (several loads, and the
    servers, start together); the first use waits for them."""

    def __init__(self, clients: int, probes: bool = False):
        ctx = multiprocessing.get_context("spawn")
        self.stop_event = ctx.Event()
        self.clients = clients
        workers = clients + probes
        self._cpu = ctx.Array("d", workers)
        self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                        initargs=(self.stop_event, self._cpu, ctx.Value("i", 0)))
        # every process spawned now, not on a first use that would then start late
        self._spawning = [self.pool.submit(_spawned, 1.0) for _ in range(workers)]
        self._running: list[Future] = []

    def _ready(self) -> None:
        for f in self._spawning:
            f.result()
        self._spawning = []

    def start(self, url: str, concurrency: int, make: dict, deadline: float, processes: int | None = None) -> None:
        """Start ``concurrency`` requests in flight on ``url``, bodies from :func:`bodies` (``make``
        less ``client``/``clients``), spread over ``processes`` (at most ``clients``, the default),
        until :meth:`stop` or ``deadline`` (epoch s)."""
        self._ready()
        self.stop_event.clear()
        p = min(processes or self.clients, self.clients, concurrency)
        self._running = [self.pool.submit(_client, url, concurrency // p + (i < concurrency % p),
                                          {**make, "client": i, "clients": p}, deadline) for i in range(p)]

    def cpu_seconds(self) -> list[float]:
        """Each process's CPU seconds so far, as it last wrote them while running a load (every 20 ms)."""
        return list(self._cpu[:])

    def wait(self, until: float) -> None:
        """Sleep until ``until`` (monotonic), failing at once when a load-generator process failed."""
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))
            self.check()

    def check(self) -> None:
        """Raise a load-generator process's failure (a bad response) while the load runs."""
        for f in self._running:
            if f.done():
                f.result()
                raise SystemExit("a load-generator process ended before the load was stopped")

    def stop(self) -> dict:
        """Cancel what is in flight; the processes' counts summed, their CPU seconds listed."""
        self.stop_event.set()
        parts = [f.result() for f in self._running]
        self._running = []
        total = Counter()
        for part in parts:
            total.update({k: v for k, v in part.items() if isinstance(v, int)})
        per_token = [x for part in parts for x in part["per_token_s"]]
        return {**total, "ms_per_token_p50": round(1000 * float(np.median(per_token)), 3) if per_token else None,
                "client_cpu_s": [round(part["cpu_s"], 2) for part in parts]}

    def probes(self, url: str, start_at: float, duration: float, rate: float, make: dict) -> Future:
        self._ready()
        return self.pool.submit(_probe_client, url, start_at, duration, rate, {**make, "client": 0, "clients": 1})

    def shutdown(self) -> None:
        self.stop_event.set()
        self.pool.shutdown(cancel_futures=True)


# ---------------------------------------------------------------- windows
def snapshot(server: Server, client: httpx.Client) -> dict:
    """A window edge: the server's /metrics, its processes' CPU seconds, the CPU time stolen from its
    cores and, with hotwire, the heartbeat last published (time stamp and counters)."""
    out = {"metrics": server.metrics(client), "cpu": server.cpu_seconds(), "steal": server.steal_seconds()}
    if server.plugin:
        out["beat_ns"], out["counters"] = server.beat()
    return out


def window_row(a: dict, b: dict) -> dict:
    """What a window between two snapshots measured: generated tokens per second by the server's
    counter, engine steps and ms per step, CPU seconds per server process, CPU seconds stolen from
    its cores and, with hotwire, its host time per step (:func:`host_stats`)."""
    ma, mb = a["metrics"], b["metrics"]
    wall = mb["t"] - ma["t"]
    steps = int(mb["steps"] - ma["steps"])
    generated = int(mb["generation_tokens"] - ma["generation_tokens"])
    row = {"window_s": round(wall, 3), "tokens_per_s": round(generated / wall, 1), "generated": generated,
           "steps": steps, "step_ms": round(1000 * wall / max(steps, 1), 3),
           "preemptions": int(mb["preemptions"] - ma["preemptions"]),
           "metrics_read_ms": [round(ma["read_ms"], 1), round(mb["read_ms"], 1)],
           "cpu_s": {k: round(v - a["cpu"].get(k, 0.0), 2) for k, v in b["cpu"].items()},
           "steal_s": round(b["steal"] - a["steal"], 3)}
    if mb["ttft_count"] > ma["ttft_count"]:  # every request's first token, as the server timed it
        row["server_ttft_mean_ms"] = round(1000 * (mb["ttft_sum_s"] - ma["ttft_sum_s"])
                                           / (mb["ttft_count"] - ma["ttft_count"]), 2)
    if "counters" in a:
        row.update(host_stats(a["counters"], b["counters"], (b["beat_ns"] - a["beat_ns"]) / 1e9))
    return row


def host_stats(before: dict[str, int], after: dict[str, int], beat_s: float) -> dict:
    """hotwire's host time per engine step over a window, from its counters' deltas: all of it, on
    steady steps (no request came or went, the batch's requests unchanged) and on changed steps,
    per hook (the engine core's per-step hook, a rank's ``on_schedule`` and its batch routing), and
    its heartbeat thread's CPU time as a share of the window. Counters this engine does not publish
    are left out."""
    d = {k: after[k] - before[k] for k in STEP_TIME if k in after and k in before}
    steps = d["steps"]

    def us(ns: int, n: int) -> float | None:
        return round(ns / n / 1e3, 3) if n > 0 else None

    out = {"hotwire_steps": steps, "beat_window_s": round(beat_s, 3), "host_us_per_step": us(d["host_ns"], steps),
           "hotwire_host_share": round(d["host_ns"] / (beat_s * 1e9), 5) if beat_s > 0 else None}
    if "steps_changed" in d and "host_ns_changed" in d:
        out["steps_changed"] = d["steps_changed"]
        out["steady_us_per_step"] = us(d["host_ns"] - d["host_ns_changed"], steps - d["steps_changed"])
        out["changed_us_per_step"] = us(d["host_ns_changed"], d["steps_changed"])
    for hook in ("core", "schedule", "batch"):
        if f"host_ns_{hook}" in d:
            out[f"{hook}_us_per_step"] = us(d[f"host_ns_{hook}"], steps)
    if "heartbeat_ns" in d and beat_s > 0:
        out["heartbeat_cpu_share"] = round(d["heartbeat_ns"] / (beat_s * 1e9), 5)
    return out


def check_steering(name: str, before: dict[str, int], after: dict[str, int], load: dict,
                   refusing: str | None = None) -> int:
    """hotwire counted every steered request that completed (and no more than were sent), and ran
    none unsteered; with ``refusing`` (a load whose specs name unknown vectors), it steered none
    and refused every one for that reason (``unsteered_<refusing>``) and no other. Returns the
    requests it counted: steered, or refused."""
    counter = "steered_requests" if refusing is None else f"unsteered_{refusing}"
    counted = after.get(counter, 0) - before.get(counter, 0)
    refused = {k: v for k, v in after.items() if k.startswith("unsteered_") and v and k != counter}
    if refusing is not None and after["steered_requests"] != before["steered_requests"]:
        refused["steered_requests"] = after["steered_requests"] - before["steered_requests"]
    if refused or not load["steered_completed"] <= counted <= load["steered_started"]:
        raise SystemExit(f"{name}: {load['steered_started']} steered requests sent, "
                         f"{load['steered_completed']} completed, {counted} counted; mailbox counters {after}")
    return counted


def probe_steering(reference: Server, steering: list[Server], exact: set[str], client: httpx.Client,
                   prompt: list[int], spec: list[dict], max_tokens: int = 16) -> dict[str, dict[str, list[int]]]:
    """One greedy request, sent alone: unsteered to ``reference`` and to each of ``steering``, and
    steered by ``spec`` to each of ``steering``. A steered answer must differ from the same server's
    unsteered one (else the server is not steering), and the unsteered answer of each server named in
    ``exact`` (its engine flags those of ``reference``) must equal ``reference``'s (steering leaves
    other requests untouched). Returns every answer's token ids, by server."""
    def answer(server: Server, steer: list[dict] | None) -> list[int]:
        body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        if steer is not None:
            body["vllm_xargs"] = {"hotwire": json.dumps(steer)}
        r = client.post(server.url + "/v1/completions", json=body)
        if r.status_code != 200:
            raise SystemExit(f"{server.name}: steering probe: HTTP {r.status_code}: {r.text[:2000]}")
        return r.json()["choices"][0]["token_ids"]

    out = {reference.name: {"unsteered": answer(reference, None)}}
    for s in steering:
        out[s.name] = {"unsteered": answer(s, None), "steered": answer(s, spec)}
        if out[s.name]["steered"] == out[s.name]["unsteered"]:
            raise SystemExit(f"{s.name}: the probe steered by {spec} answered {out[s.name]['steered']}, as "
                             f"it did unsteered: {s.name} is not steering\n" + s.tail(6000))
        if s.name in exact and out[s.name]["unsteered"] != out[reference.name]["unsteered"]:
            raise SystemExit(f"{s.name}: the unsteered probe answered {out[s.name]['unsteered']}, "
                             f"{reference.name} {out[reference.name]['unsteered']}: steering touched an "
                             "unsteered request\n" + s.tail(6000))
    return out


# ---------------------------------------------------------------- statistics
def block_resample(n: int, block: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Index rows of a moving-block bootstrap of ``n`` values in time order: each row is
    ``ceil(n / block)`` runs of ``block`` consecutive indices, each run's start drawn uniformly from
    the ``n - block + 1`` possible, cut to ``n``; ``block`` 1 draws indices independently."""
    block = max(1, min(block, n))
    runs = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(resamples, runs))
    return (starts[:, :, None] + np.arange(block)).reshape(resamples, runs * block)[:, :n]


def median_ci(values: list[float], block: int = 1, resamples: int = 2000) -> list[float]:
    """95 % bootstrap interval of the median: what a run's rounds can resolve. ``block`` > 1: a
    moving-block bootstrap, for values measured back to back whose neighbours may be correlated:
    drawing runs of ``block`` consecutive values keeps that correlation in every resample, where
    independent draws would lose it and give too narrow an interval."""
    return pooled_median_ci([values], block, resamples)


def pooled_median_ci(series: list[list[float]], block: int = 1, resamples: int = 2000) -> list[float]:
    """:func:`median_ci` of several runs' values pooled: each run resampled in its own blocks, to its
    own length (a block never joins the end of one run to the start of another, and every resample
    holds as many values of each run as the run has), and the median taken over them all."""
    rng = np.random.default_rng(0)
    drawn = [np.asarray(v)[block_resample(len(v), block, resamples, rng)] for v in series]
    medians = np.median(np.concatenate(drawn, axis=1), axis=1)
    return [round(float(q), 4) for q in np.quantile(medians, [0.025, 0.975])]


def verdict(ci: list[float], target: float, at_least: bool) -> str:
    """"met" / "not met" when the interval lies on one side of the target, else "unresolved"
    (``at_least``: the target is a lower bound)."""
    lo, hi = ci
    if at_least:
        return "met" if lo >= target else "not met" if hi < target else "unresolved"
    return "met" if hi <= target else "not met" if lo > target else "unresolved"


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None
