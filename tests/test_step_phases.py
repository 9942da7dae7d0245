"""``benchmarks/bench_site/step_phases.py``: its timers add what they time, a step's output future
gets its wait timed, and two readings turn into time per step."""

import json
import sys
import time
from concurrent.futures import Future
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "bench_site"))

import step_phases  # noqa: E402


def _reading(t: float, steps: int, wall_ns: dict, cpu_ns: dict, calls: dict) -> dict:
    return {"pid": 1, "t": t, "calls": {"steps": steps, **calls}, "wall_ns": wall_ns, "cpu_ns": cpu_ns}


def test_per_step_divides_the_differences_by_the_steps_between_readings():
    a = _reading(10.0, 100, {"schedule": 1_000_000, "wait_output": 0}, {"schedule": 900_000, "wait_output": 0},
                 {"schedule": 100, "tokens": 25_600})
    b = _reading(12.0, 200, {"schedule": 3_000_000, "wait_output": 500_000}, {"schedule": 2_900_000, "wait_output": 0},
                 {"schedule": 200, "wait_output": 100, "tokens": 51_200, "tokens:FULL": 12_800})
    out = step_phases.per_step(a, b)
    assert out["steps"] == 100 and out["seconds"] == 2.0 and out["step_ms"] == 20.0
    assert out["phases"]["schedule"] == {"wall_us": 20.0, "cpu_us": 20.0, "calls": 1.0, "share": 0.001}
    assert out["phases"]["wait_output"]["wall_us"] == 5.0 and out["phases"]["wait_output"]["cpu_us"] == 0.0
    assert out["per_step"] == {"tokens": 256.0, "tokens:FULL": 128.0}


def test_timers_add_their_calls_and_an_output_futures_wait(tmp_path):
    def slow(x):
        time.sleep(0.01)
        return x

    timed = step_phases._timed("test_slow", slow)
    before = (step_phases._wall["test_slow"], step_phases._calls["test_slow"])
    assert timed(3) == 3 and timed(4) == 4
    assert step_phases._calls["test_slow"] - before[1] == 2
    assert step_phases._wall["test_slow"] - before[0] >= 20_000_000  # two sleeps of 10 ms
    assert step_phases._cpu["test_slow"] < step_phases._wall["test_slow"]  # sleeping is no CPU time

    future: Future = Future()
    future.set_result("out")
    waits = step_phases._calls["wait_output"]
    assert step_phases._waited(future).result() == "out"
    assert step_phases._calls["wait_output"] == waits + 1

    step_phases.dump(tmp_path / "engine-core-1.json")
    reading = step_phases.read(tmp_path, 1)
    assert reading["calls"]["test_slow"] == step_phases._calls["test_slow"]
    assert json.loads((tmp_path / "engine-core-1.json").read_text()) == reading
    assert step_phases.read(tmp_path, 2) is None  # no dump yet: nothing, not an error


def test_hotwires_hooks_and_op_are_timed_where_the_process_has_them(monkeypatch):
    import importlib

    import pytest
    import torch

    pytest.importorskip("triton")
    def target(module_name, owner):
        module = importlib.import_module(module_name)
        return module if owner is None else getattr(module, owner)

    originals = {}
    for _, module_name, owner, fn in step_phases.HOTWIRE:
        originals[owner, fn] = getattr(target(module_name, owner), fn)
        monkeypatch.setattr(target(module_name, owner), fn, originals[owner, fn])  # put back after the test
    step_phases._instrument_hotwire()
    from hotwire.engine_plugin import steer_triton

    assert {(owner, fn): getattr(target(module_name, owner), fn).__wrapped__
            for _, module_name, owner, fn in step_phases.HOTWIRE} == originals
    assert ("Steerer", "on_states") in originals and ("Router", "route_states") in originals
    calls = step_phases._calls["hotwire:op_launch"]
    empty = torch.zeros(0, 4)
    steer_triton.launch(empty, None, torch.zeros(0), empty, torch.zeros(1, 1, 8, dtype=torch.int32),
                        torch.zeros(0, dtype=torch.int32))  # no token: returns before any launch
    assert step_phases._calls["hotwire:op_launch"] == calls + 1


def test_per_step_gives_faults_for_the_phases_that_count_them():
    a = {**_reading(0.0, 10, {"forward:NONE": 0, "schedule": 0}, {"forward:NONE": 0, "schedule": 0}, {}),
         "faults": {"forward:NONE": 5}}
    b = {**_reading(1.0, 20, {"forward:NONE": 10, "schedule": 10}, {"forward:NONE": 10, "schedule": 10}, {}),
         "faults": {"forward:NONE": 45}}
    phases = step_phases.per_step(a, b)["phases"]
    assert phases["forward:NONE"]["faults"] == 4.0
    assert "faults" not in phases["schedule"]


def test_a_call_across_the_frame_stacks_chunk_end_shows_as_a_fault_per_call():
    """What the fault counts are for: a call made at the end of CPython's 16 KiB frame chunk maps a
    fresh chunk and unmaps it on return, every time (session 28). Under ever deeper padding frames,
    the same 100 nested calls fault about once each at a chunk's end and hardly ever elsewhere."""
    import resource
    import statistics

    import pytest

    if getattr(resource, "RUSAGE_THREAD", None) is None or sys.version_info < (3, 11):
        pytest.skip("needs per-thread fault counts (Linux) and CPython's chunked frame stack (3.11+)")

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import frame_stack  # the same padding frames and three nested calls as its timing

    counts: list[int] = []

    def measured() -> None:
        name = f"test_chunk_{len(counts)}"
        with step_phases._clock(name, faults=True):
            for _ in range(100):
                frame_stack._a(1)
        counts.append(step_phases._faults[name])

    pad = frame_stack.padded(5, measured)
    for n in range(300):
        pad(n)
    assert max(counts) >= 100, counts  # at a chunk's end: each call maps a chunk
    assert statistics.median(counts) <= 2, counts  # elsewhere: none, or a stray one
