"""Graphs without the op (``engine_plugin.idle_graphs``): which table a holder reads per step, and
what happens when the second capture pass goes wrong. The holders here keep their graphs the way
vLLM's do (a dict keyed by batch descriptor: ``CUDAGraphWrapper.concrete_cudagraph_entries``, the
V2 manager's ``graphs``); on the GPU, ``tests/test_gpu.py`` counts the real captures."""

from __future__ import annotations

import weakref

import pytest

from hotwire.engine_plugin import idle_graphs


class Wrapper:  # as vLLM's CUDAGraphWrapper keeps its graphs
    def __init__(self):
        self.concrete_cudagraph_entries = {}

    def capture(self, key):
        self.concrete_cudagraph_entries.setdefault(key, "without op" if idle_graphs.skipping() else "with op")

    def clear_graphs(self):
        self.concrete_cudagraph_entries.clear()


class Manager:  # as the V2 runner's CudaGraphManager keeps its FULL graphs
    def __init__(self):
        self.graphs = {}
        self.captured = False

    def release_graphs(self):  # vLLM 0.32's, for elastic EP: drop them, capture again later
        self.graphs.clear()
        self.captured = False

    def capture(self, key):
        assert key not in self.graphs
        self.graphs[key] = "without op" if idle_graphs.skipping() else "with op"


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(idle_graphs, "_off", None)
    monkeypatch.setattr(idle_graphs, "_split_holders", weakref.WeakSet())
    monkeypatch.setattr(idle_graphs, "STATS", idle_graphs.Stats())
    yield
    idle_graphs.select(False)


def _pass(holders, keys):
    def run():
        for key in keys:
            for h in holders:
                h.capture(key)
    return run


def test_each_step_replays_the_table_of_its_kind_and_vllm_sees_one_dict():
    piece, full, other = Wrapper(), Manager(), Wrapper()
    other.concrete_cudagraph_entries["old"] = "with op"  # another engine's: not captured in this pass
    holders = [piece, full, other]
    for keys in (["b8"], ["b4", "b1"]):  # V1: one pass per batch descriptor, largest first
        idle_graphs.capture_twice(_pass([piece, full], keys), _pass([piece, full], keys), lambda: holders)
    assert idle_graphs.STATS.graphs == 6
    assert type(other) is Wrapper and "_hotwire_tables" not in other.__dict__
    assert isinstance(piece, Wrapper) and isinstance(full, Manager)  # still vLLM's classes to vLLM
    idle_graphs.select(False)
    assert piece.concrete_cudagraph_entries == {"b8": "with op", "b4": "with op", "b1": "with op"}
    assert set(full.graphs.values()) == {"with op"}
    idle_graphs.select(True)
    assert piece.concrete_cudagraph_entries == {"b8": "without op", "b4": "without op", "b1": "without op"}
    assert set(full.graphs.values()) == {"without op"} and len(full.graphs) == 3
    assert other.concrete_cudagraph_entries == {"old": "with op"}
    piece.clear_graphs()  # vLLM's memory profiling clears what it captured: both tables
    full.captured = True
    full.release_graphs()  # called on an idle step: the steered table goes too
    idle_graphs.select(False)
    assert piece.concrete_cudagraph_entries == {} and full.graphs == {} and not full.captured


def test_a_table_vllm_assigns_after_the_split_lands_on_the_side_of_the_step():
    full = Manager()
    idle_graphs.capture_twice(_pass([full], ["b8"]), _pass([full], ["b8"]), lambda: [full])
    idle_graphs.select(True)
    full.graphs = {"b2": "without op"}  # vLLM rebuilding its table, on an idle step
    idle_graphs.select(False)
    assert full.graphs == {"b8": "with op"}
    idle_graphs.select(True)
    assert full.graphs == {"b2": "without op"}


def test_a_second_pass_that_misses_a_graph_undoes_every_split_for_good():
    a, b = Wrapper(), Wrapper()
    idle_graphs.capture_twice(_pass([a, b], ["b8"]), _pass([a, b], ["b8"]), lambda: [a, b])
    assert "_hotwire_tables" in a.__dict__
    # the second pass of the next descriptor captures one holder only: pieces of one chain would mix
    idle_graphs.capture_twice(_pass([a, b], ["b4"]), _pass([a], ["b4"]), lambda: [a, b])
    for h in (a, b):
        assert type(h) is Wrapper and "_hotwire_tables" not in h.__dict__
    idle_graphs.select(True)
    assert a.concrete_cudagraph_entries == {"b8": "with op", "b4": "with op"}  # every graph keeps the op
    assert idle_graphs.STATS.graphs == 0
    idle_graphs.capture_twice(_pass([a], ["b1"]), _pass([a], ["b1"]), lambda: [a])  # later passes: single
    assert type(a) is Wrapper and a.concrete_cudagraph_entries["b1"] == "with op"


def test_a_failing_second_pass_leaves_the_engine_with_its_graphs():
    a = Manager()

    def boom():
        raise RuntimeError("out of memory")

    idle_graphs.capture_twice(_pass([a], ["b8"]), boom, lambda: [a])
    assert type(a) is Manager and a.graphs == {"b8": "with op"}
    assert not idle_graphs.skipping()  # the capture never leaves the op switched off



@pytest.mark.parametrize("value,want", [("1", True), ("on", True), ("0", False), ("false", False)])
def test_the_setting_reads_like_a_switch(monkeypatch, value, want):
    from hotwire.engine_plugin.config import HotwireConfig

    monkeypatch.setenv("HOTWIRE_IDLE_GRAPHS", value)
    assert HotwireConfig.from_env().idle_graphs is want


def test_a_misspelt_setting_is_refused_by_name(monkeypatch):
    from hotwire.engine_plugin.config import HotwireConfig

    monkeypatch.setenv("HOTWIRE_IDLE_GRAPHS", "yes please")
    with pytest.raises(ValueError, match="HOTWIRE_IDLE_GRAPHS"):
        HotwireConfig.from_env()
