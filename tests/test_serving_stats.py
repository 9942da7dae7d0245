"""The statistics and window bookkeeping of ``benchmarks/serve_throughput.py``: the moving-block
bootstrap of the median (``serving.median_ci``), the read order of the simultaneous design's window
edges (``simultaneous.read_order``), the pairing of its windows into ratios (``_summary``), and the
move of a server's whole process tree onto another CPU set (``serving.Managed.pin``)."""

import os
import shutil
import sys
import time
import warnings
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import serve_throughput  # noqa: E402
import serving  # noqa: E402
from serving import block_resample, cpu_plan, median_ci  # noqa: E402
from simultaneous import default_processes, read_order  # noqa: E402
from gpu_busy import GpuBusy  # noqa: E402


@pytest.mark.parametrize("n, block", [(10, 3), (12, 4), (7, 7), (5, 1)])
def test_block_resample_draws_runs_of_consecutive_values(n, block):
    rows = block_resample(n, block, 500, np.random.default_rng(1))
    assert rows.shape == (500, n)
    for start in range(0, n, block):  # every run: one start in 0..n-block, then consecutive indices
        run = rows[:, start:start + block]
        assert ((run[:, 0] >= 0) & (run[:, 0] <= n - block)).all()
        assert (np.diff(run, axis=1) == 1).all()
    assert len(np.unique(rows[:, 0])) == n - block + 1  # every start is drawn


def test_block_one_is_the_independent_bootstrap():
    """Block 1 is what median_ci drew before blocks: the sequential design's intervals are unchanged."""
    values = list(np.random.default_rng(3).normal(1.0, 0.05, 9))
    medians = np.median(np.random.default_rng(0).choice(values, size=(2000, len(values))), axis=1)
    assert median_ci(values) == [round(float(q), 4) for q in np.quantile(medians, [0.025, 0.975])]


def test_blocks_widen_the_interval_of_correlated_windows():
    """Runs of three equal values hold ten values' worth of information, not thirty: drawn
    independently, the interval is too narrow; in blocks of three it is not."""
    levels = np.random.default_rng(5).normal(1.0, 0.05, 10)
    values = list(np.repeat(levels, 3))
    iid, blocked = median_ci(values), median_ci(values, block=3)
    ten = median_ci(list(levels))  # the ten levels alone
    assert blocked[1] - blocked[0] > 1.5 * (iid[1] - iid[0])
    assert blocked[1] - blocked[0] == pytest.approx(ten[1] - ten[0], rel=0.5)


def test_a_block_as_long_as_the_series_has_no_spread():
    values = [1.0, 0.9, 1.1, 0.95]
    assert median_ci(values, block=4) == [0.975, 0.975]  # the series itself, every time
    assert median_ci(values, block=10) == median_ci(values, block=4)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_read_order_centres_every_window_on_the_same_slot(n):
    servers = [f"s{i}" for i in range(n)]
    for k in range(6):
        first, second = read_order(servers, k), read_order(servers, k + 1)
        assert sorted(first) == servers  # every server read once per edge
        centre = {s: first.index(s) + second.index(s) for s in servers}
        assert set(centre.values()) == {n - 1}, (k, first, second)


def test_default_processes():
    assert [default_processes(c) for c in (4, 64, 128, 256)] == [1, 1, 1, 2]


def _sample(c: int, window: int, server: str, tokens: float) -> dict:
    return {"concurrency": c, "round": window, "server": server, "tokens_per_s": tokens, "step_ms": 20.0,
            "steps": 250, "window_s": 5.0, "cpu_s": {"VLLM::EngineCore": 5.0}, "client_cpu_s": [0.4]}


def test_simultaneous_ratios_pair_the_windows_of_the_same_seconds():
    """Every window's common factor moves all servers by up to +-30 %, the ratio of the windows over
    the same seconds stays 0.98 (hotwire) and 1 (plugin_free_2): the ratios, their interval and the
    verdict see none of it."""
    names = ["plugin_free", "hotwire", "plugin_free_2"]
    common = np.random.default_rng(2).uniform(0.7, 1.3, 20)
    samples = [_sample(256, -1, n, 5000.0) for n in names]  # the warm-up: not in the ratios
    for w, f in enumerate(common):
        busy = {"gpu_util": 60.0 + w, "sm_mhz": 1980 - w}  # the shared GPU's, the same in every server's row
        samples += [{**_sample(256, w, "plugin_free", 20000 * f), **busy}, {**_sample(256, w, "hotwire", 19600 * f), **busy},
                    {**_sample(256, w, "plugin_free_2", 20000 * f)}]  # this one's GPU not sampled
    row, = serve_throughput._summary(samples, [256], names, block=3)
    assert row["rounds"] == 20 and row["block"] == 3
    assert row["hotwire_gpu_util"] == 69.5 and row["plugin_free_gpu_util_range"] == [60.0, 79.0]
    assert row["hotwire_sm_mhz_range"] == [1961, 1980] and "plugin_free_2_gpu_util" not in row
    assert "hotwire 69.5 % (60-79; SM 1961-1980 MHz)" in serve_throughput._markdown([row], names, True)
    assert "plugin_free_steal_s" not in row  # windows without steal time (older results): nothing said
    assert row["hotwire_over_plugin_free_ci95"] == [0.98, 0.98]
    assert row["hotwire_over_plugin_free_range"] == [0.98, 0.98]
    assert row["plugin_free_2_over_plugin_free"] == 1.0
    assert row["target"] == {"hotwire": "not met"}  # plugin_free_2 is a contrast, not a target


def test_a_window_counts_the_cpu_time_stolen_from_its_servers_cores(tmp_path, monkeypatch):
    """Steal time summed over the server's pinned cores (others left out), per window, and its
    median and maximum per server reported beside the ratios."""
    import psutil

    stolen = {"now": 0.0}

    def cpu_times(percpu=False):
        return [SimpleNamespace(steal=stolen["now"] * (i + 1)) for i in range(4)]

    monkeypatch.setattr(psutil, "cpu_times", cpu_times)
    server = serving.Server("hotwire", tmp_path, tmp_path, {}, plugin=False, vectors=tmp_path, cpus=[1, 3])
    before = server.steal_seconds()
    stolen["now"] = 0.5
    assert server.steal_seconds() - before == pytest.approx(0.5 * 2 + 0.5 * 4)  # cores 1 and 3 only
    names = ["plugin_free", "hotwire"]
    samples = [{**_sample(64, w, n, 10000.0), "steal_s": 0.2 * w if n == "hotwire" else 0.0}
               for w in range(5) for n in names]
    row, = serve_throughput._summary(samples, [64], names)
    assert row["hotwire_steal_s"] == [0.4, 0.8] and row["plugin_free_steal_s"] == [0.0, 0.0]
    assert "hotwire 0.4 s (max 0.8)" in serve_throughput._markdown([row], names, False)


def test_too_few_blocks_stay_unresolved():
    names = ["plugin_free", "hotwire"]
    samples = [_sample(64, w, n, 10000.0) for w in range(serve_throughput.MIN_ROUNDS * 3 - 1) for n in names]
    row, = serve_throughput._summary(samples, [64], names, block=3)
    assert row["hotwire_over_plugin_free_ci95"] == [1.0, 1.0]
    assert row["target"] == {"hotwire": "unresolved"}


def test_more_than_four_servers_are_refused():
    with pytest.raises(SystemExit, match="at most 4 share the GPU"):
        serve_throughput._check_servers(["plugin_free", "hotwire", "hotwire_2", "original", "plugin_free_2"])
    serve_throughput._check_servers(["plugin_free", "hotwire", "original", "plugin_free_2"])


def _physical_cores() -> int:
    cores = set()
    for cpu in os.sched_getaffinity(0):
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        cores.add(path.read_text().strip() if path.exists() else str(cpu))
    return len(cores)


@pytest.mark.skipif(shutil.which("taskset") is None or _physical_cores() < 2, reason="needs taskset and 2 cores")
def test_cpu_plan_puts_load_processes_per_core_on_the_cores_left():
    """Every core but one pinned: two load-generator processes fit on the last one two to a core,
    not one to a core."""
    n = _physical_cores()
    sets, clients = cpu_plan([1] * (n - 1), 2, per_core=2)
    assert len(sets) == n - 1 and clients and not set(clients) & {c for s in sets for c in s}
    assert cpu_plan([1] * (n - 1), 2) is None


def test_a_window_without_tokens_or_with_preemptions_fails_the_run():
    row = {"preemptions": 0, "generated": 1200, "window_s": 5.0}
    serve_throughput._check_window("hotwire", row)
    with pytest.raises(SystemExit, match="plugin_free: no token generated in a 5 s window"):
        serve_throughput._check_window("plugin_free", {**row, "generated": 0})
    with pytest.raises(SystemExit, match="hotwire: 3 preemptions"):
        serve_throughput._check_window("hotwire", {**row, "preemptions": 3})
    serve_throughput._check_window("plugin_free", {**row, "generated": 0}, smoke=True)  # CPU cores shared


def test_a_starved_smoke_window_has_no_ratio():
    names = ["plugin_free", "hotwire"]
    samples = [_sample(4, 0, "plugin_free", 0.0), _sample(4, 0, "hotwire", 100.0)]
    row, = serve_throughput._summary(samples, [4], names)
    assert np.isnan(row["hotwire_over_plugin_free"]) and row["target"] == {"hotwire": "unresolved"}


class _Sleeper(serving.Managed):
    """A process with a child process, each running a second thread: a server's tree in small."""

    def argv(self) -> list[str]:
        code = ("import subprocess, sys, threading, time; threading.Thread(target=time.sleep, args=(60,), "
                "daemon=True).start(); sys.argv[1:] and subprocess.Popen([sys.executable, '-c', "
                "'import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
                "time.sleep(60)']); time.sleep(60)")
        return [sys.executable, "-c", code, "child"]


def _affinities(pid: int) -> list[set[int]]:
    import psutil

    root = psutil.Process(pid)
    return [os.sched_getaffinity(t.id) for p in [root, *root.children(recursive=True)] for t in p.threads()]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None,
                    reason="needs two CPUs and taskset")
def test_pin_moves_every_thread_of_every_process_of_a_server(tmp_path):
    first, second = sorted(os.sched_getaffinity(0))[:2]
    proc = _Sleeper("sleeper", tmp_path / "sleeper.log", dict(os.environ), [first])
    proc.start()
    try:
        deadline = time.monotonic() + 20
        while len(_affinities(proc.proc.pid)) < 4 and time.monotonic() < deadline:  # 2 processes x 2 threads
            time.sleep(0.05)
        assert len(_affinities(proc.proc.pid)) == 4
        assert all(a == {first} for a in _affinities(proc.proc.pid))
        proc.pin([second])
        assert all(a == {second} for a in _affinities(proc.proc.pid))
        assert proc.cpus == [second]
    finally:
        serving.stop_all([proc])


def test_gpu_busy_summarises_the_samples_of_a_window_and_the_run_reports_their_median(tmp_path, monkeypatch):
    """``gpu_busy.GpuBusy`` reads ``nvidia-smi``'s CSV lines (here a stand-in script printing the
    same format, with a GPU that reports "[N/A]" once) and keeps only the samples inside a window."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *-lms=*) ;; *) exit 0 ;; esac\n"  # the fields probe: accepted
                   "for u in 90 [N/A] 100 80; do echo \"0, $u, 1980\"; echo \"1, 5, 1410\"; sleep 0.05; done\n"
                   "sleep 30\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    with GpuBusy() as busy:
        deadline = time.monotonic() + 10
        while len(busy._samples) < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        t1 = time.monotonic()
    assert busy.between(t0, t1, 0) == {"gpu_util": 90.0, "gpu_util_min": 80.0, "sm_mhz": 1980, "sm_mhz_min": 1980,
                                          "gpu_samples": 3}
    assert busy.between(t0, t1, 1)["gpu_util"] == 5.0  # each GPU apart
    assert busy.between(t0, t1)["gpu_samples"] >= 6  # or all of them
    assert busy.between(t1 + 1, t1 + 2) is None
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with GpuBusy() as none:
        pass
    assert none.between(0, time.monotonic()) is None


def test_pair_ratio_pairs_two_servers_window_by_window_without_the_warm_up():
    import pair_ratio

    def sample(server, rnd, tokens, step_ms, c=256):
        return {"server": server, "round": rnd, "concurrency": c, "tokens_per_s": tokens, "step_ms": step_ms}

    samples = [sample("a", -1, 100.0, 10.0), sample("b", -1, 10.0, 99.0)]  # warm-up: left out
    for r, base in enumerate([100.0, 120.0, 90.0]):
        samples += [sample("a", r, base, 10.0), sample("b", r, 0.9 * base, 11.0), sample("pf", r, 1.0, 1.0)]
    samples.append(sample("a", 3, 100.0, 10.0))  # b did not report this window: no pair
    samples += [sample("a", 4, 0.0, 10.0), sample("b", 4, 50.0, 11.0)]  # a starved (smoke): NaN, no error
    rows = pair_ratio.pair(samples, "a", "b")
    assert list(rows) == [256]
    assert rows[256]["tokens"][:3] == pytest.approx([0.9] * 3) and rows[256]["steps"] == pytest.approx([1.1] * 4)
    assert np.isnan(rows[256]["tokens"][3])


def test_pair_ratio_takes_a_sequential_round_as_the_mean_of_each_servers_windows():
    """A B B A: two windows each a round; the ratio is of their means (serve_throughput's), and the
    bootstrap draws rounds one by one."""
    import pair_ratio

    def sample(server, rnd, tokens):
        return {"server": server, "round": rnd, "concurrency": 64, "tokens_per_s": tokens, "step_ms": 1000 / tokens}

    samples = []
    for r in range(3):  # the load drifts down within each round: a, b, b, a
        samples += [sample("a", r, 200.0), sample("b", r, 160.0), sample("b", r, 140.0), sample("a", r, 100.0)]
    assert pair_ratio.pair(samples, "a", "b")[64]["tokens"] == pytest.approx([1.0] * 3)
    assert pair_ratio.block_for({"design": "sequential"}) == 1
    assert pair_ratio.block_for({"design": "simultaneous"}) > 1


def test_pooled_interval_resamples_each_run_within_itself():
    from serving import pooled_median_ci

    one = [0.97, 1.01, 0.99, 1.03, 0.98, 1.02]
    assert pooled_median_ci([one], block=3) == median_ci(one, block=3)  # one run: the run's own interval
    # two runs at different levels, each drawn whole: every resample holds four of each, the median 1.5
    assert pooled_median_ci([[1.0] * 4, [2.0] * 4], block=4) == [1.5, 1.5]
    lo, hi = pooled_median_ci([one, one, one], block=3)
    one_lo, one_hi = median_ci(one, block=3)
    assert hi - lo < one_hi - one_lo  # three runs resolve more than one
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert all(np.isnan(median_ci([])))  # no windows (a starved smoke run): no interval, no error


def test_pair_ratio_pools_runs_of_one_setup_and_refuses_others():
    import pair_ratio

    def run(ratios, **setup):
        samples = []
        for r, x in enumerate(ratios):
            samples += [{"server": "pf", "round": r, "concurrency": 256, "tokens_per_s": 100.0, "step_ms": 10.0},
                        {"server": "hw", "round": r, "concurrency": 256, "tokens_per_s": 100.0 * x, "step_ms": 10.0}]
        return {"samples": samples, "servers": ["pf", "hw"], "shape": "qwen3-0.6b", "vllm": "0.25.1", **setup}

    lines = pair_ratio.pooled_report([run([0.9] * 5), run([0.95] * 3)], "pf", "hw", 3)
    assert lines == ["C=256: hw/pf tokens/s 0.9000 [0.9000-0.9000] over 8 rounds of 2 runs (each run: 0.9000, 0.9500)"]
    with pytest.raises(SystemExit, match="'vllm'"):
        pair_ratio.pooled_report([run([0.9]), run([0.9], vllm="0.32.0")], "pf", "hw", 3)
    # the step-phase timers cost about 10 µs a step: a timed run pools only with timed ones
    with pytest.raises(SystemExit, match="'step_phases_timed'"):
        pair_ratio.pooled_report([run([0.9]), run([0.9], step_phases_timed=True)], "pf", "hw", 3)
    # a result from before the key existed was not timed
    assert pair_ratio.pooled_report([run([0.9]), run([0.9], step_phases_timed=False)], "pf", "hw", 3)


def test_gpu_each_puts_the_nth_server_of_the_cores_order_on_gpu_n():
    """``--gpu-each``: a run with the order reversed swaps GPUs with the cores; too few GPUs refuse."""
    assert serve_throughput.gpu_each(["plugin_free", "hotwire"], ["0", "1"]) == {"plugin_free": "0", "hotwire": "1"}
    assert serve_throughput.gpu_each(["hotwire", "plugin_free"], ["2", "3", "4"]) == {"hotwire": "2", "plugin_free": "3"}
    with pytest.raises(SystemExit, match="2 servers need as many GPUs, 1 visible"):
        serve_throughput.gpu_each(["plugin_free", "hotwire"], ["0"])


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert serving.visible_gpus() == ["2", "3"]
    assert [serving.smi_index(d) for d in ("2", "GPU-5f0e", None)] == [2, None, None]


def test_a_server_given_a_gpu_sees_only_that_gpu(tmp_path):
    from server_kinds import make_server

    for name in ("plugin_free", "hotwire_2", "original"):
        on_1 = make_server(name, tmp_path, tmp_path, {}, "9,18", None, {"PYTHONPATH": "/x"}, gpu="1")
        assert on_1.env["CUDA_VISIBLE_DEVICES"] == "1" and on_1.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        shared = make_server(name, tmp_path, tmp_path, {}, "9,18", None, {"PYTHONPATH": "/x"})
        assert shared.env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert make_server("hotwire_2", tmp_path, tmp_path, {}, "9,18", None, gpu="0").env["HOTWIRE_LAYERS"] == "9,18"


def test_mps_reaches_the_servers_made_before_its_daemon(tmp_path, monkeypatch):
    """A server finds the daemon through its pipe folder: each server (made, not yet started) gets
    the run's folders in its own environment, and the daemon and its ``quit`` get the same."""
    from mps import Mps

    calls = tmp_path / "calls"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(f"#!/bin/sh\necho \"$* pipe=$CUDA_MPS_PIPE_DIRECTORY in=$(cat)\" >> {calls}\n")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    servers = [serving.Server(n, tmp_path, tmp_path, {}, plugin=False, vectors=tmp_path, cpus=None)
               for n in ("plugin_free", "hotwire")]
    with Mps(tmp_path, servers) as mps:
        pipe = str(mps.pipes)
        assert all(s.env["CUDA_MPS_PIPE_DIRECTORY"] == pipe and s.env["CUDA_MPS_LOG_DIRECTORY"] == str(mps.logs)
                   for s in servers)
    assert calls.read_text().splitlines() == [f"-d pipe={pipe} in=", f" pipe={pipe} in=quit"]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ  # this process's own environment untouched
    assert all("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in s.env for s in servers)  # every SM, unless split
    with Mps(tmp_path, servers + [serving.Server("plugin_free_2", tmp_path, tmp_path, {}, plugin=False,
                                                 vectors=tmp_path, cpus=None)], split=True):
        pass
    assert [s.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for s in servers] == ["33", "33"]


def test_a_run_under_mps_stops_when_no_server_reached_the_daemon(tmp_path, monkeypatch):
    """The daemon starts an MPS server when its first client connects: none once the servers are
    up means they run time-sliced, which the run must not report as MPS."""
    from mps import Mps

    servers_file = tmp_path / "servers"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(f"#!/bin/sh\nread cmd\n[ \"$cmd\" = get_server_list ] && cat {servers_file}\nexit 0\n")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    servers_file.write_text("")
    with Mps(tmp_path, []) as mps, pytest.raises(SystemExit, match="no server reached the MPS daemon"):
        mps.check()
    servers_file.write_text("4242\n")
    with Mps(tmp_path, []) as mps:
        mps.check()  # a server runs: the clients reached it


def test_gpu_samples_say_power_and_why_the_clock_was_held():
    """nvidia-smi's lines as the sampler reads them ("[N/A]" where a field is unknown): a window's
    mean power and, per named reason, the share of its samples that held the SM clock down; the
    summary row and the printed table carry both."""
    busy = GpuBusy()
    lines = ["0, 99, 1980, 650.5, 0x0000000000000000", "0, 98, 1755, 699.5, 0x0000000000000004",
             "1, 10, 1980, 100.0, 0x0000000000000001", "0, 97, 1600, [N/A], 0x0000000000000044",
             "0, [N/A], 1980, 1.0, 0x0"]
    busy._proc = SimpleNamespace(stdout=iter(lines))
    busy._read()
    t = busy._samples[-1][0]
    got = busy.between(0.0, t + 1, gpu=0)
    assert got["gpu_samples"] == 3 and got["sm_mhz_min"] == 1600 and got["power_w"] == 675.0
    assert got["clock_held"] == {"hw thermal": 0.33, "sw power cap": 0.67}
    names = ["plugin_free", "hotwire"]
    samples = [{**_sample(64, w, n, 4000.0), **got} for w in range(-1, 6) for n in names]
    row, = serve_throughput._summary(samples, [64], names, block=1)
    assert row["hotwire_power_w_range"] == [675.0, 675.0]
    assert row["plugin_free_clock_held"] == {"hw thermal": 0.33, "sw power cap": 0.67}
    assert "675-675 W, hw thermal up to 33%, sw power cap up to 67%)" in serve_throughput._markdown([row], names, True)


def test_host_cpu_names_the_model_and_whether_cores_are_shared():
    """A served run records its host's CPU (``serving.host_cpu``): two hosts of one GPU kind ran
    vLLM 1.7 times apart at one Python speed (session 40)."""
    info = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t: fpu\n"
    cpu = serving.host_cpu(info, "1\n")
    assert cpu["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu["smt"] is True and cpu["cpus"] == os.cpu_count()
    assert serving.host_cpu(info, "0\n")["smt"] is False
    assert serving.host_cpu("vendor_id\t: x\n", "notsupported\n") == {"model": None, "cpus": cpu["cpus"], "smt": None}
