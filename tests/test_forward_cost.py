"""benchmarks/forward_cost.py: two runs' outputs compare phase by phase and call by call,
``BENCH_OP_OFF=graph`` (bench_site/op_off.py) takes the op out of an armed layer's forward, and a
steered run's specs reach the engine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "benchmarks" / "forward_cost.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from forward_cost import compare  # noqa: E402


def _run(forward_us: float, step_ms: float, runtime: dict, kernels: dict, ops: dict, functions: dict) -> dict:
    return {"phases": {"step_ms": step_ms, "phases": {"forward:NONE": {"wall_us": forward_us, "calls": 0.2}}},
            "us_per_call": {"triton_launch": 9.0},
            "profile": {"runtime": runtime, "kernels": kernels, "ops": ops},
            "python": {"steps": 10, "functions": functions}}


def test_compare_lists_what_differs_and_by_how_much():
    free = _run(1800.0, 6.9, {"cudaLaunchKernel": [100, 900.0]}, {"attn": [28, 50.0]},
                {"aten::mm": [300, 2000.0], "aten::slice": [5000, 1400.0]},
                {"jit.py:695(run)": [680, 8.0, 34.0], "graphs.py:137(replay)": [290, 4.5, 5.3]})
    armed = _run(2600.0, 8.1, {"cudaLaunchKernel": [100, 950.0], "cudaMemcpyAsync": [2, 10.0]},
                 {"attn": [28, 51.0], "steer": [28, 30.0]},
                 {"aten::mm": [300, 2050.0], "aten::slice": [5000, 2200.0]},
                 {"jit.py:695(run)": [680, 18.5, 46.0], "graphs.py:137(replay)": [290, 5.3, 6.3]})
    armed["triton_launches"] = {"attn": {"calls": 28, "run_us": 27.0, "launcher_us": 9.0}}
    out = compare(free, armed)
    assert out["step_ms"] == [6.9, 8.1]
    assert out["triton_launches"] == {"attn": [None, {"calls": 28, "run_us": 27.0, "launcher_us": 9.0}]}
    assert out["phases"]["forward:NONE"]["a_us"] == 1800.0 and out["phases"]["forward:NONE"]["b_us"] == 2600.0
    assert out["runtime_differing"] == {"cudaMemcpyAsync": [None, [2, 10.0]]}  # counts differ only there
    assert out["kernels_differing"] == {"steer": [None, [28, 30.0]]}
    assert out["ops_differing"] == {}
    assert list(out["ops_by_time"])[0] == "aten::slice"  # the largest change in time first
    assert out["kernels_us"] == [50.0, 81.0]
    assert list(out["python_own_ms_differing"])[0] == "jit.py:695(run)"


def test_compare_needs_no_profile():
    a = {"phases": {"step_ms": 1.0, "phases": {}}}
    out = compare(a, a)
    assert out["step_ms"] == [1.0, 1.0] and "runtime_differing" not in out and "python_own_ms_differing" not in out


_TABLES = """
import torch
from hotwire.engine_plugin import steering
calls = []
steering.steer_ = lambda *a: calls.append(a)  # hotwire's op, recorded instead of run
t = steering.SteeringTables(slots=2, hidden=4, armed=1, requests=2, entries=1, max_tokens=4,
                            dtype=torch.float32, device=torch.device("cpu"))
class ToyDecoderLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.ones(4))
    def forward(self, positions, hidden):
        return hidden
layer = ToyDecoderLayer()
steering.arm({0: layer}, steering.anchors({0: layer}, [0], torch.device('cpu')), t)
x = torch.ones(3, 4)
"""


def _armed_layer(check: str, op_off: str | None = None) -> str:
    """Run ``check`` after one toy layer is armed (``layer``, its tables ``t``, input ``x``, the op's
    calls in ``calls``), in a fresh interpreter with ``bench_site/op_off.py`` imported first when
    ``op_off`` names a mode; its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks" / "bench_site"),
                                                        os.environ.get("PYTHONPATH", "")])}
    prelude = ""
    if op_off is not None:
        env["BENCH_OP_OFF"], prelude = op_off, "import op_off  # noqa: F401\n"
    done = subprocess.run([sys.executable, "-c", prelude + _TABLES + check], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_op_off_graph_keeps_the_op_out_of_an_armed_layers_forward():
    assert _armed_layer("out = layer(torch.arange(3), x); print(out is x, len(calls))", "graph") == "True 0"


def test_op_off_bare_op_puts_a_bare_in_place_op_where_hotwires_was():
    check = """
traced = torch.fx.experimental.proxy_tensor.make_fx(lambda x: layer(torch.arange(3), x))(x)
touch = [n for n in traced.graph.nodes if n.op == "call_function"][-1]
print(len(calls), touch.target, [getattr(a, "name", a) for a in touch.args])
"""
    assert _armed_layer(check, "bare_op") == "0 hotwire_bench.touch_.default ['x_1']"


_STEER_ONE = """
from hotwire.engine_plugin import steer_op
t.bank[1] = 1.0
t.route[1, 0, 0] = torch.tensor([1, 0, 100, 0, torch.tensor(2.0).view(torch.int32).item(), 0, 0, 0])
t.tok_row[:3] = 1
x = torch.zeros(3, 4)
steer_op.steer_(x, None, torch.arange(3), layer.norm)
print(x.sum().item())
"""


def test_op_off_noop_impl_keeps_the_op_but_its_kernels_do_nothing():
    assert _armed_layer(_STEER_ONE, "noop_impl") == "0.0"
    assert _armed_layer(_STEER_ONE) == "24.0"  # as deployed: three tokens, 2.0 on each of four columns


def test_op_off_no_launch_never_launches_the_triton_kernel():
    check = "from hotwire.engine_plugin import steer_triton; print(steer_triton.launch(None, None, None, None, None, None))"
    assert _armed_layer(check, "no_launch") == "None"


def test_op_off_triton_launch_never_gives_a_specialisation_the_drivers_launch():
    check = """from hotwire.engine_plugin import steer_triton
steer_triton._LAUNCHES[("a specialisation",)] = print
print(steer_triton._LAUNCHES.get(("a specialisation",), steer_triton._UNTRIED))"""
    assert _armed_layer(check, "triton_launch") == "None"
    assert _armed_layer(check) == "<built-in function print>"  # as deployed: the launch it holds


def test_op_off_salts_the_compile_cache_key():
    """A setting that traces other code must not load the graph a deployed engine cached."""
    check = "from hotwire.engine_plugin import salts; print(salts.compile_salt(None).split(';')[-1])"
    assert _armed_layer(check, "graph") == "bench_op_off=graph"
    assert _armed_layer(check).startswith("max_seqs=")


def test_without_op_off_the_same_layer_calls_the_op():
    """The two checks above can fail: unpatched, the armed layer's forward calls the op."""
    assert _armed_layer("layer(torch.arange(3), x); print(len(calls))") == "1"


def test_host_state_waits_for_the_named_kernel_and_times_its_probes_there(monkeypatch):
    import types

    import host_state

    class JITFunction:
        def __init__(self, name):
            self.__name__ = name

        def run(self, *args, **kwargs):
            return "launched"

    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    calls = []
    seen, undo = host_state.in_forward("attention", {"probe": lambda: calls.append(1)}, repeat=3, inner=2)
    JITFunction("prepare").run()
    assert seen == {} and calls == []  # not the named kernel
    JITFunction("attention").run()
    undo()
    assert seen["kernel"] == "attention" and len(calls) == 6 and seen["us_per_call"]["probe"] >= 0


def test_triton_launch_timers_report_per_call_and_keep_the_last_tensors():
    import torch
    from triton_launches import Timers

    timers = Timers()
    for name, n, run_ns, launcher_ns in (("attn", 4, 80_000, 20_000), ("cache", 2, 10_000, 6_000)):
        timers.calls[name], timers.run_ns[name], timers.launcher_ns[name] = n, run_ns, launcher_ns
    q, out = torch.zeros(2), torch.zeros(3)
    timers.last_args = {"attn": {"q": q, "out": out}, "cache": {"key": q}}
    assert timers.report() == {"attn": {"calls": 4, "run_us": 20.0, "launcher_us": 5.0},
                               "cache": {"calls": 2, "run_us": 5.0, "launcher_us": 3.0}}
    assert list(timers.report()) == ["attn", "cache"]  # the most launched first
    assert timers.pointers(kernels=1) == {"attn:q": q, "attn:out": out}


def test_triton_launch_timers_wrap_the_jit_run_and_the_launcher(monkeypatch):
    """With a stand-in for Triton's two classes: a launch inside ``run`` counts for its kernel,
    the launcher's time apart, and nothing is counted while the timers are off."""
    import types

    import torch
    import triton_launches

    class Launcher:
        def __call__(self, *args):
            return "launched"

    class JITFunction:
        def __init__(self, name):
            self.__name__, self.arg_names, self.launcher = name, ["q", "n"], Launcher()

        def run(self, *args, grid, warmup, **kwargs):
            return self.launcher(*args)

    runtime = types.ModuleType("triton.runtime")
    runtime.driver = types.SimpleNamespace(active=types.SimpleNamespace(launcher_cls=Launcher))
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.runtime", runtime)
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    timers = triton_launches.install()
    kernel, q = JITFunction("kernel_unified_attention"), torch.zeros(4)
    assert kernel.run(q, 4, grid=(1,), warmup=False) == "launched"
    assert timers.calls == {}  # off
    timers.on = True
    for _ in range(3):
        kernel.run(q, 4, grid=(1,), warmup=False)
    Launcher()(1)  # a launch outside any run (inductor's own launches): not counted
    report = timers.report()["kernel_unified_attention"]
    assert report["calls"] == 3 and report["run_us"] >= report["launcher_us"] > 0
    assert list(timers.launcher_ns) == ["kernel_unified_attention"]
    assert timers.pointers() == {"kernel_unified_attention:q": q}


def test_host_state_sees_inside_the_forward_what_is_not_there_after_it(monkeypatch):
    """The probe records the state at the first launch only, where a profile function set for
    the forward is seen; the snapshot after it is not; ``undo`` puts ``run`` back."""
    import types

    import host_state

    class JITFunction:
        def run(self, *args, **kwargs):
            return "launched"

    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    original = JITFunction.run
    seen, undo = host_state.in_forward()
    assert seen == {}
    prior, profiler = sys.getprofile(), lambda *a: None  # noqa: E731
    sys.setprofile(profiler)
    try:
        assert JITFunction().run(1) == "launched"
    finally:
        sys.setprofile(prior)  # whatever profiles this test run, put back
    JITFunction().run(2)  # later launches change nothing
    undo()
    assert seen["profile"] == repr(profiler) and "MainThread" in seen["threads"]
    assert seen["us_per_call"] == {}
    assert host_state.snapshot()["profile"] == repr(prior)
    assert JITFunction.run is original


@pytest.mark.vllm
def test_a_steered_run_sends_half_the_requests_a_spec_each_and_the_engine_steers_them(tmp_path):
    """``--steered 0.5``: the served load's specs reach a real engine (CPU, tiny model), every one
    admitted, none refused: the GPU runs compare the forward of a steered engine, not a refusing one."""
    from hotwire.tools.tiny_model import build_tiny

    model = build_tiny(tmp_path / "model", layers=4)
    out = tmp_path / "fc.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--model", str(model), "--plugin", "--steered", "0.5",
                          "--max-seqs", "8", "--requests", "32", "--repeat", "5", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    counts = json.loads(out.read_text())["hotwire_counts"]
    assert counts["steered_requests"] == (8 + 32) // 2  # warm-up and timed loads, every other request
    assert not {k: v for k, v in counts.items() if k.startswith("unsteered_") and v}
