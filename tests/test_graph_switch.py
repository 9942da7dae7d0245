"""The op's kernels inside captured graphs, switched to the step's live layers
(``engine_plugin.graph_switch``): the switching rule on any machine, and (``-m gpu``) on a real
captured graph."""

from __future__ import annotations

import pytest
import torch

from hotwire.engine_plugin import graph_switch, steer_op
from hotwire.engine_plugin.config import HotwireConfig


class Driver:
    """``cuGraphNodeSetEnabled`` as the switch calls it: records each call, fails where told."""

    def __init__(self, fail_on: int | None = None):
        self.calls: list[tuple[int, int, int]] = []
        self.fail_on = fail_on

    def __call__(self, exec_: int, node: int, on: int) -> int:
        self.calls.append((exec_, node, int(on)))
        return 1 if len(self.calls) == self.fail_on else 0


def _switch(step: steer_op.StepState, driver: Driver, layers=(0, 1, 2, 3)) -> graph_switch.Switch:
    return graph_switch.Switch(77, [(100 + pos, step, pos) for pos in layers], driver)


def test_a_graph_switches_off_the_kernels_of_layers_no_request_steers_and_back_on():
    step, driver = steer_op.StepState(None, 4), Driver()
    switch = _switch(step, driver)
    switch.sync()  # every layer live, as captured: no call
    assert driver.calls == []
    step.route_layers([1, 2])
    switch.sync()
    assert driver.calls == [(77, 100, 0), (77, 103, 0)]
    step.route_layers([2, 3])
    driver.calls.clear()
    switch.sync()
    assert driver.calls == [(77, 101, 0), (77, 103, 1)]  # only what changed
    assert switch.on == [False, False, True, True]


def test_an_unchanged_live_set_keeps_its_object_so_a_replay_checks_one_identity():
    step = steer_op.StepState(None, 4)
    step.route_layers([1, 2])
    live = step.live
    step.route_layers((2, 1))
    assert step.live is live
    step.route_layers([2])
    assert step.live is not live and step.live == {2}


def test_a_failed_switch_turns_every_kernel_back_on_for_good():
    step, driver = steer_op.StepState(None, 4), Driver(fail_on=2)
    switch = _switch(step, driver)
    step.route_layers([1])
    switch.sync()  # node 100 off, then node 102 fails
    assert graph_switch.STATS.failed >= 1 and switch.broken
    assert driver.calls[2:] == [(77, n, 1) for n in (100, 101, 102, 103)]
    assert switch.on == [True] * 4
    step.route_layers([3])
    driver.calls.clear()
    switch.sync()
    assert driver.calls == []  # never switched again: the graph runs as captured


def test_nodes_of_another_engines_step_state_are_never_switched_by_this_one():
    mine, other, driver = steer_op.StepState(None, 2), steer_op.StepState(None, 2), Driver()
    switch = graph_switch.Switch(5, [(1, mine, 0), (2, other, 1), (3, mine, 1)], driver)
    mine.route_layers([])
    switch.sync()
    assert driver.calls == [(5, 1, 0), (5, 3, 0)]


@pytest.mark.parametrize("value,want", [("1", True), ("on", True), ("0", False)])
def test_the_switch_is_off_unless_turned_on(monkeypatch, value, want):
    monkeypatch.setenv("HOTWIRE_GRAPH_SWITCH", value)
    assert HotwireConfig.from_env().graph_switch is want
    monkeypatch.delenv("HOTWIRE_GRAPH_SWITCH")
    assert HotwireConfig.from_env().graph_switch is False


def test_captures_outside_a_capture_pass_and_unwanted_ones_make_vllms_own_graphs(monkeypatch):
    monkeypatch.setattr(graph_switch, "wanted", False)
    before = torch.cuda.CUDAGraph
    with graph_switch.capturing():
        assert torch.cuda.CUDAGraph is before
    assert torch.cuda.CUDAGraph is before


# -- on a real captured graph --------------------------------------------------------------------

H, T, LAYERS = 1024, 8, 3


def _layers(step):
    """Three armed layers whose single request row (1) has an add on each, every token on it."""
    g = torch.Generator().manual_seed(0)
    bank = torch.randn(LAYERS + 1, H, generator=g).to("cuda", torch.bfloat16)
    route = torch.zeros(2, LAYERS, 1, 8, dtype=torch.int32)
    for pos in range(LAYERS):  # (bank row, lo, hi, add, scale bits, 0, 0, 0)
        route[1, pos, 0, :5] = torch.tensor([pos + 1, 0, 2**30, 0, 0])
        route[1, pos, 0, 4] = torch.tensor(1.5 + pos, dtype=torch.float32).view(torch.int32)
    route, tok_row = route.cuda(), torch.ones(T, dtype=torch.int32, device="cuda")
    layers = [steer_op.ArmedLayer(bank, route[:, pos], tok_row, step, pos) for pos in range(LAYERS)]
    anchors = [torch.nn.Parameter(torch.empty(1, device="cuda")) for _ in layers]
    for anchor, layer in zip(anchors, layers):
        steer_op.bind(anchor, layer)
    return layers, anchors


@pytest.mark.gpu
def test_a_captured_graph_runs_the_op_only_on_live_layers_and_nothing_else_changes(monkeypatch):
    """Three layers' op launches captured in one graph, between other kernels: each replay runs
    the kernels of the live layers only, steered as an eager call steers, and every other kernel
    of the graph on every replay."""
    monkeypatch.setattr(graph_switch, "wanted", True)
    step = steer_op.StepState(None, LAYERS)
    layers, anchors = _layers(step)
    base = torch.randn(LAYERS, T, H, device="cuda").to(torch.bfloat16)
    pos = torch.arange(T, device="cuda")
    steered = base.clone()
    with torch.inference_mode():
        for i in range(LAYERS):  # eager: compiles the kernel (captures must find it compiled)
            torch.ops.hotwire.steer_(steered[i], None, pos, anchors[i])
    assert all(not torch.equal(steered[i], base[i]) for i in range(LAYERS))
    x, ticks = base.clone(), torch.zeros(1, device="cuda")
    with graph_switch.capturing(), torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(LAYERS):
                ticks.add_(1)  # a kernel that is not the op's: never switched
                torch.ops.hotwire.steer_(x[i], None, pos, anchors[i])
    assert type(graph).__name__ == "SwitchedGraph" and len(graph._switch.nodes) == LAYERS
    assert torch.cuda.CUDAGraph is not type(graph) and not graph_switch.recording
    ticks.zero_()
    for live in ([1], [0, 2], [], [0, 1, 2], [2]):
        step.route_layers(live)
        x.copy_(base)
        graph.replay()
        torch.cuda.synchronize()
        for i in range(LAYERS):
            want = steered[i] if i in live else base[i]
            assert torch.equal(x[i].view(torch.int16), want.view(torch.int16)), (live, i)
    assert ticks.item() == 5 * LAYERS


class _Manager:
    """Stands in for a graph holder of vLLM's whose ``capture`` is one capture pass."""

    def __init__(self):
        self.graphs: dict = {}
        self.passes: list[bool] = []  # per pass: did it run within graph_switch.capturing

    def capture(self, key="b8"):
        self.passes.append(_within[0])
        self.graphs[key] = object()


_within = [False]


@pytest.mark.parametrize("doubled", [True, False])
def test_vllms_own_capture_pass_runs_within_capturing_and_the_idle_pass_does_not(monkeypatch, doubled):
    """The graphs of vLLM's own pass hold the op and are switched; those of the idle pass
    (``idle_graphs``) launch nothing of it and stay plain."""
    import contextlib
    import weakref

    from hotwire.engine_plugin import hooks, idle_graphs

    @contextlib.contextmanager
    def within():
        _within[0] = True
        try:
            yield
        finally:
            _within[0] = False

    monkeypatch.setattr(graph_switch, "capturing", within)
    monkeypatch.setattr(idle_graphs, "wanted", doubled)
    monkeypatch.setattr(idle_graphs, "_off", None)
    monkeypatch.setattr(idle_graphs, "_split_holders", weakref.WeakSet())
    monkeypatch.setattr(idle_graphs, "STATS", idle_graphs.Stats())
    manager = _Manager()
    capture = hooks._doubled(_Manager.capture, holders=lambda m: [m], safe=lambda m: True)
    capture(manager)
    assert manager.passes == ([True, False] if doubled else [True])


def test_a_capture_records_the_kernel_of_every_armed_layer_even_while_requests_steer_fewer(monkeypatch):
    """A capture made while serving (vLLM drops and captures its graphs again) must still hold
    every layer's kernel, switched per step: while a kept graph captures, the op launches on
    layers the step state has not marked live (capture records; it runs nothing)."""
    from test_steering_op import _entry, _tables, steered

    from hotwire.shared.spec import NO_END

    t = _tables(armed=2)
    t.route[1, 0, 0] = _entry(1, 0, NO_END, 2.0)
    t.tok_row[:4] = 1
    x, pos = torch.randn(4, 16), torch.arange(4)
    t.step.route_layers([1])
    assert torch.equal(steered(t, 0, x, None, pos), x)  # not live: the op returns before any launch
    monkeypatch.setattr(graph_switch, "recording", True)
    assert not torch.equal(steered(t, 0, x, None, pos), x)
