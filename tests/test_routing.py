"""Per-step routing on a rank (engine_plugin.routing): tokens mapped to request rows, the layers
a step has entries on, rows reused, pipeline stages writing their own layers (tests/engine_rig.py:
one core, its ranks)."""

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine_rig import H, Rig, Step, make_rank, new_req
from hotwire.engine_plugin import hooks
from hotwire.engine_plugin.state_rows import StateBatch
from hotwire.shared.mailbox import ANY_LAYER


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def _spec(*entries):
    return {"hotwire": json.dumps(list(entries))}


def test_route_maps_tokens_to_rows_and_clears_what_it_no_longer_uses(rig):
    tables, router = rig.tables, rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("s", _spec({"id": "v", "layer": 1}), 3)])  # the vector binds before admission
    router.commit()
    row = router.active["s"].row
    assert row > 0 and tables.route[row].abs().sum() > 0 and tables.route[0].abs().sum() == 0
    router.route(["u", "s", "u2"], np.array([2, 3, 1]))
    assert tables.tok_row[:6].tolist() == [0, 0, row, row, row, 0]
    router.route(["u", "s", "u2"], np.array([1, 1, 1]))  # the step after the prefill: counts only
    assert tables.tok_row[:6].tolist() == [0, row, 0, 0, 0, 0]
    router.route(["s"], np.array([1]))  # decode step: shorter batch, stale tail nulled
    assert tables.tok_row[:6].tolist() == [row, 0, 0, 0, 0, 0]
    router.finish(["s"])
    router.route(["u"], np.array([4]))
    assert tables.tok_row.abs().sum() == 0


def test_a_step_uploads_its_arrivals_and_its_token_map_at_once(rig, monkeypatch):
    """On CUDA each upload is a kernel launch (staging.HostRing), which lets the GIL go: a step
    with arrivals and a changed token map uploads both in one, and an unchanged step nothing."""
    tables, router = rig.tables, rig.router
    uploads = []
    copy = router._ring.copy
    monkeypatch.setattr(router._ring, "copy", lambda spans: (uploads.append(len(spans)), copy(spans)))
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 2.0}), 3), ("b", _spec({"id": "v", "layer": 3}), 2)])
    router.route(["a", "u", "b"], np.array([3, 1, 2]))
    assert uploads == [3]  # two rows and the token map
    router.route(["a", "u", "b"], np.array([3, 1, 2]))
    assert uploads == [3]
    rig.step(new=[("c", _spec({"id": "v", "layer": 1}), 1)])
    router.route(["a", "u", "b"], np.array([1, 1, 1]))  # c not scheduled yet: its row, the changed map
    router.route(["a", "u", "b", "c"], np.array([1, 1, 1, 1]))  # c in: the map only
    assert uploads == [3, 2, 1]
    a, b, c = (router.active[r].row for r in "abc")
    assert tables.tok_row[:5].tolist() == [a, 0, b, c, 0] and tables.route[a, 0, 0, 4].view(torch.float32).item() == 2.0


def test_route_names_the_layers_the_steered_requests_in_flight_have_entries_on(rig):
    """What the op skips the other layers by, in steps run without a CUDA graph (ARMED = (1, 3)):
    counted as steered requests come and go, not gathered per step (a gather over the batch lets
    the GIL go); a step that steers no token names none."""
    tables, router = rig.tables, rig.router
    live = lambda: sorted(i for i in range(len(rig.router.armed.layers))  # noqa: E731
                          if i in tables.step.live)
    assert live() == [0, 1]  # before any step: every layer (capture and warm-up passes)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("one", _spec({"id": "v", "layer": 3}), 3)])
    router.route(["one", "u"], np.array([1, 1]))
    assert live() == [1]
    rig.step(new=[("two", _spec({"id": "v", "layer": 1}), 3)])
    router.route(["one", "two"], np.array([1, 1]))
    assert live() == [0, 1]
    rig.step(finished=["one"], new=[("three", _spec({"id": "v", "layer": 1}), 3)])  # row 'one' reused
    router.route(["three", "two", "u"], np.array([1, 1, 1]))
    assert live() == [0]
    rig.step(finished=["two", "three"])
    router.route(["u"], np.array([2]))
    assert live() == []


def test_a_step_after_one_that_steered_nothing_names_the_layers_again(rig):
    """The layers are gathered again only when a layer's count of steered requests crosses zero;
    a step whose batch holds none of the steered requests in flight names none, and the next step
    that holds one must name their layers again though no count changed."""
    tables, router = rig.tables, rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("one", _spec({"id": "v", "layer": 3}), 3), ("two", _spec({"id": "v", "layer": 3}), 3)])
    router.route(["one", "two", "u"], np.array([1, 1, 1]))
    named = tables.step.live
    assert sorted(named) == [1]
    rig.step(finished=["two"])  # layer 3 keeps a user: nothing gathered, the op told nothing new
    router.route(["one", "u"], np.array([1, 1]))
    assert tables.step.live is named
    router.route(["u"], np.array([1]))  # "one" not in this step's batch (preempted, or not yet rescheduled)
    assert tables.step.live == frozenset()
    router.route(["one", "u"], np.array([1, 1]))
    assert sorted(tables.step.live) == [1]


def test_a_gated_requests_row_starts_closed_for_the_next_request(rig):
    """A prompt gate's decision is held per request row; the row's next request must not inherit
    it (it is cleared when the gated request finishes)."""
    tables, router = rig.tables, rig.router
    rig.core.admission.projecting = frozenset({1, 3})  # the probe reads the stream at layer 1
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    gated = {"id": "v", "layer": 3, "gate": {"probe": "v", "layer": 1, "scope": "prompt"}}
    rig.step(new=[("g", _spec(gated), 3)])
    router.route(["g"], np.array([3]))
    row = router.active["g"].row
    tables.gate_decided[row, 0] = 1  # the op decided it open on the prompt's last token
    rig.step(finished=["g"], new=[("next", _spec({"id": "v", "layer": 1}), 3)])
    assert router.active["next"].row == row
    assert tables.gate_decided[row].abs().sum() == 0


def test_tok_row_names_each_tokens_row_with_or_without_gates(rig):
    """The op reads every token's entries through ``tok_row``, and gates count by it: a gated
    request joining a batch routed without one finds it right."""
    tables, router = rig.tables, rig.router
    rig.core.admission.projecting = frozenset({1, 3})
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1}), 3)])
    router.route(["a", "u"], np.array([3, 2]))
    assert tables.tok_row[:5].tolist() == [router.active["a"].row] * 3 + [0, 0]
    gated = {"id": "v", "layer": 3, "gate": {"probe": "v", "layer": 1}}
    rig.step(new=[("g", _spec(gated), 2)])
    router.route(["u", "g", "a"], np.array([1, 2, 1]))
    a, g = router.active["a"].row, router.active["g"].row
    assert tables.tok_row[:4].tolist() == [0, g, g, a]


class _DeviceCalls(TorchDispatchMode):
    """The torch operations run inside it, views included: slicing releases the GIL too."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_routing_makes_no_torch_call(rig):
    """Each torch call on the step thread releases the GIL, which in a served engine costs a wait
    for vLLM's output thread (staging.HostRing): a step with arrivals, a changed batch and a
    steady one make none (on the CPU the uploads are numpy copies; on CUDA the upload kernel, the GPU
    test)."""
    router = rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    calls, before = [], ()
    for k in range(5):  # round the rings
        a, b = f"a{k}", f"b{k}"
        rig.step(new=[(a, _spec({"id": "v", "layer": 1}), 3), (b, _spec({"id": "v", "layer": 3}), 2)],
                 finished=before)
        before = (a, b)
        calls = []
        for counts in ([3, 2, 1], [1, 1, 1], [1, 1, 1]):
            with _DeviceCalls() as mode:
                router.route([a, b, "u"], np.array(counts))
            calls.append(mode.calls)
        assert router.tables.tok_row[:6].tolist() == [router.active[a].row, router.active[b].row, 0, 0, 0, 0]
    assert router.direct and calls == [[], [], []]


def test_routing_a_changed_batch_of_256_never_lets_the_gil_go(tmp_path):
    """Nor does any numpy operation of the routing, arrivals included (a fancy-index gather, or a
    copy, fill or reduction of more than 500 elements would: the token map of a step with
    prefills, a staged row). Each call admits a request (a row staged, written by route()) and
    routes the batch in another order with other counts."""
    from engine_rig import ENTRIES
    from gil_probe import SLOW_S, longest_call
    from hotwire.engine_plugin.admission import Admitted, Term
    from hotwire.engine_plugin.routing import Router
    from hotwire.engine_plugin.steering import ArmedModel, SteeringTables

    armed = tuple(range(28))
    tables = SteeringTables(slots=8, hidden=H, armed=len(armed), requests=512, entries=ENTRIES, max_tokens=2048,
                            dtype=torch.float32, device=torch.device("cpu"))
    router = Router(ArmedModel(tables, armed))
    ids = [f"r{i}" for i in range(256)]
    terms = (Term(9, 0, 1, 0, 2**31 - 1, 0, 1065353216, 0, 0, 0), Term(18, 0, 2, 0, 2**31 - 1, 0, 1065353216, 0, 0, 0))
    for i, rid in enumerate(ids[::2]):  # half steered, two entries on two layers each
        router.admit(rid, Admitted(i + 1, terms, (1, 2), 0))
    counts = [np.ones(256, np.int32), np.ones(256, np.int32)]
    counts[1][-3:] = 128  # prefills: the token map changes every step
    router.route(ids, counts[0])

    def step(k: int) -> None:
        j = k % 128
        router.admit(ids[1 + 2 * j], Admitted(200 + j, terms, (1, 2), 0))
        router.route(ids[k % 2:] + ids[:k % 2], counts[k % 2])

    took = longest_call(step)
    assert took < SLOW_S, f"a route took {took:.3f} s: it let the GIL go"


def test_a_row_reused_before_its_commit_holds_the_latest_request(rig):
    """A request admitted and gone before its row was written, and the next one on the same row:
    the row written is the second's."""
    tables, router = rig.tables, rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 1.0}), 3)])
    row = router.active["a"].row
    rig.step(finished=["a"], new=[("b", _spec({"id": "v", "layer": 1, "scale": -3.0}), 3)])
    assert router.active["b"].row == row
    router.route(["b"], np.array([3]))
    assert tables.route[row, 0, 0, 4].view(torch.float32).item() == -3.0


def test_reused_row_with_the_same_token_map_is_read_anew(rig):
    """A request leaves and the next one takes its row: same token map, new row contents, which
    the op reads through the map (no upload of the map)."""
    tables, router = rig.tables, rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 1.0}), 3)])
    router.route(["a"], np.array([3]))
    row = router.active["a"].row
    rig.step(finished=["a"], new=[("b", _spec({"id": "v", "layer": 1, "scale": -3.0}), 3)])
    assert router.active["b"].row == row
    router.route(["b"], np.array([3]))
    assert tables.tok_row[:3].tolist() == [row] * 3
    assert tables.route[row, ..., 4].view(torch.float32).min() == -3.0


def test_ranks_of_a_pipeline_write_the_entries_of_their_own_layers(tmp_path):
    """PP: an entry on another stage's layer is valid on every stage (the engine's armed layers
    come with the first delta) and written only by the stage that holds the layer."""
    rig = Rig(tmp_path)
    first, second = make_rank("cpu", armed=(1,)), make_rank("cpu", armed=(3,))
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    out = Step([new_req("r", _spec({"id": "v", "layer": 1, "scale": 2.0}, {"id": "v", "layer": 3, "scale": 3.0}))])
    rig.core.poll()
    rig.core.on_schedule(out)
    for rank in (first, second):
        rank.on_schedule(out)
        rank.router.commit()
        assert "r" in rank.router.active
    row = first.router.active["r"].row
    assert first.tables.route[row, 0, 0, 4].view(torch.float32).item() == 2.0
    assert second.tables.route[row, 0, 0, 4].view(torch.float32).item() == 3.0


@pytest.mark.gpu
def test_on_cuda_routing_makes_no_torch_call_and_its_uploads_land(tmp_path):
    """On CUDA the rows and the token map are read from the pinned buffers by the upload kernel
    (staging.HostRing): a step with arrivals and a changed batch makes no torch call, and the
    tables say what the host wrote once the stream has run them."""
    rig = Rig(tmp_path, "cuda")
    router, tables = rig.router, rig.tables
    assert router.direct and router.uploads == "the upload kernel, launched by the driver"
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 2.0}), 3), ("b", _spec({"id": "v", "layer": 3}), 2)])
    with _DeviceCalls() as mode:
        router.route(["a", "u", "b"], np.array([3, 1, 2]))
        router.route(["a", "u", "b"], np.array([1, 1, 1]))
    assert mode.calls == []
    torch.cuda.synchronize()
    a, b = router.active["a"].row, router.active["b"].row
    assert tables.tok_row[:6].tolist() == [a, 0, b, 0, 0, 0]
    assert tables.route[a, 0, 0, 4].view(torch.float32).item() == 2.0 and tables.route[b, 1, 0, 0].item() == 1


@pytest.mark.gpu
def test_buffers_the_driver_cannot_map_are_copied_by_torch(tmp_path, monkeypatch, caplog):
    """A driver that maps no pinned buffer loses no upload: every one goes through torch, said once."""
    from hotwire.engine_plugin import staging

    monkeypatch.setattr(staging, "_device_address", lambda: lambda host: None)
    staging.say_unmapped.cache_clear()
    rig = Rig(tmp_path, "cuda")
    router, tables = rig.router, rig.tables
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 2.0}), 3)])
    router.route(["a", "u"], np.array([3, 1]))
    router.route(["u", "a"], np.array([1, 1]))
    torch.cuda.synchronize()
    a = router.active["a"].row
    assert tables.tok_row[:4].tolist() == [0, a, 0, 0] and tables.route[a, 0, 0, 4].view(torch.float32).item() == 2.0
    assert not router.direct and caplog.text.count("could not map the routing's pinned buffers") == 1


@pytest.mark.gpu
def test_host_path_only_enqueues_work_behind_a_busy_gpu(tmp_path):
    """vLLM overlaps the next step's host work with the running step, so registering a vector,
    admitting requests and routing a step must not wait for the GPU: with ~1 s of work queued
    ahead they return at once (a copy from pageable memory would block until the queue drains),
    and the tables are right once it has drained."""
    rig = Rig(tmp_path, "cuda")
    tables, router, row = rig.tables, rig.router, np.arange(H, dtype=np.float32)

    def one_round(tag: str, gen: int) -> None:
        rig.control.write(gen, f"v{gen}", ANY_LAYER, row * gen, gen=gen)
        rig.step(new=[(tag, _spec({"id": f"v{gen}", "layer": 3, "scale": 2.0}), 3)])
        router.route(["u", tag], np.array([2, 3]))

    one_round("warm", 1)  # first use of each pinned block size allocates it
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of cycles queued ahead of everything below
    t0 = time.perf_counter()
    one_round("r", 2)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    busy = time.perf_counter() - t0
    assert busy > 0.3 and host < busy / 10, (host, busy)
    assert torch.equal(tables.bank[3].cpu(), torch.from_numpy(row * 2))
    r = router.active["r"].row
    assert tables.tok_row[:5].tolist() == [0, 0, r, r, r]
    assert tables.route[r, 1, 0, :3].tolist() == [3, 0, 2**31 - 1]
    assert tables.route[r, 1, 0, 4].view(torch.float32).item() == 2.0


def test_v1_hook_routes_a_batch_past_500_requests_keeping_the_gil():
    """V1's token counts come from query_start_loc (staging.diff: np.diff lets the GIL go past 500
    elements), as np.diff would give them. The probe's batch is larger than any engine's, so that a
    release lasts long enough for the spinner to be seen taking the GIL."""
    from types import SimpleNamespace

    from engine_rig import make_rank
    from gil_probe import SLOW_S, longest_call
    from hotwire.engine_plugin import hooks, idle_graphs, staging

    starts = [np.cumsum(np.r_[0, np.arange(n) % 7 + 1]).astype(np.int32) for n in (1, 499, 500, 501, 1024, 20000)]
    for a in starts:
        assert staging.diff(a).tolist() == np.diff(a).tolist()
    n = len(starts[-1]) - 1
    runner = SimpleNamespace(_hotwire=make_rank("cpu"), query_start_loc=SimpleNamespace(np=starts[-1]),
                             input_batch=SimpleNamespace(num_reqs=n, req_ids=[f"r{i}" for i in range(n)]))
    try:
        took = longest_call(lambda k: hooks._after_v1_prepare(runner, None, (), {}))
    finally:
        idle_graphs.select(False)  # the batch steers nothing: the hook chose idle steps, process-wide
    assert took < SLOW_S, f"a step's hook took {took:.3f} s: it let the GIL go"


def test_buffer_fills_write_exactly_their_span():
    """staging.put and staging.clear (the routing's GIL-keeping fills), past the zeros they start with."""
    from hotwire.engine_plugin import staging

    n = 3 * len(staging._ZEROS) + 5
    buf = np.arange(n + 4, dtype=np.int32)
    staging.clear(buf, 2, n + 2)
    assert buf[:2].tolist() == [0, 1] and not buf[2: n + 2].any() and buf[n + 2:].tolist() == [n + 2, n + 3]
    staging.put(buf, 1, np.array([7, 8, 9], dtype=np.int32))
    assert buf[:5].tolist() == [0, 7, 8, 9, 0]


def test_a_batch_that_lost_a_request_before_its_finish_was_reported_is_a_changed_step(rig):
    """Under async scheduling a request at its ``max_tokens`` leaves the batch a step before the
    scheduler reports it finished: that step rebuilds the routing, so its host time is a changed
    step's (``steps_changed``, ``host_ns_changed``), not a steady one's."""
    c = rig.rank.counters = rig.counters  # one process: the core's and the rank's counters are one
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)

    def step(batch, counts, **changes):
        rig.step(**changes)
        rig.rank.on_batch(batch, np.array(counts))
        return c.steps_changed, c.host_ns - c.host_ns_changed  # changed steps, steady host time

    step(["a", "b"], [3, 2], new=[("a", _spec({"id": "v", "layer": 1}), 3), ("b", None, 2)])
    step(["a", "b"], [1, 1])  # the step after the prefills: counts only
    changed, steady = step(["a", "b"], [1, 1])  # steady
    assert (changed, c.steps) == (1, 3)
    assert step(["a"], [1]) == (2, steady)  # b left unreported: the whole step is a changed one
    assert step(["a"], [1], finished={"b"})[0] == 3  # reported a step later
    assert step(["a"], [1])[0] == 3


class RunnerStates:
    """The V2 runner's request state rows as vLLM 0.25.1 keeps them (``vllm/v1/worker/gpu/states.py``):
    finished and preempted requests free theirs first, then each new request (a resumed one too)
    takes the last freed."""

    def __init__(self, rows: int):
        self.free, self.index = list(range(rows)), {}

    def step(self, out: Step, preempted=()) -> None:
        for req_id in [*out.finished_req_ids, *preempted]:
            if req_id in self.index:
                self.free.append(self.index.pop(req_id))
        for req in out.scheduled_new_reqs:
            self.index[req.req_id] = self.free.pop()

    def batch(self, *entries: tuple[str, int]) -> StateBatch:
        """The settled batch of ``(request, tokens)`` entries (no device: the map is expanded on the host)."""
        counts = np.array([n for _, n in entries], np.int32)
        return StateBatch(np.array([self.index[r] for r, _ in entries], np.int32), counts, int(counts.sum()), 0, 0)


def test_by_state_rows_a_state_row_reused_in_the_same_step_routes_its_new_request(tmp_path):
    """V2 routing (Router.route_states): a steered request finishes and an unsteered one takes its
    state row in the same step, while another steered request stays; the new one's tokens must not
    read the finished request's row."""
    rig, runner = Rig(tmp_path, states=4), RunnerStates(4)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    runner.step(rig.step(new=[("s", _spec({"id": "v", "layer": 1}), 2), ("t", _spec({"id": "v", "layer": 3}), 1),
                              ("u", None, 1)]))
    rig.rank.on_states(runner.batch(("s", 2), ("u", 1), ("t", 1)), runner.index)
    s, t = rig.router.active["s"].row, rig.router.active["t"].row
    assert rig.tables.tok_row[:5].tolist() == [s, s, 0, t, 0] and rig.router.steering
    taken = runner.index["s"]
    runner.step(rig.step(new=[("n", None, 1)], finished=["s"]))
    assert runner.index["n"] == taken
    rig.rank.on_states(runner.batch(("u", 1), ("n", 1), ("t", 1)), runner.index)
    assert rig.tables.tok_row[:5].tolist() == [0, 0, t, 0, 0]
    runner.step(rig.step(finished=["t"]))
    rig.rank.on_states(runner.batch(("u", 1), ("n", 1)), runner.index)
    assert rig.tables.tok_row[:5].tolist() == [0, 0, 0, 0, 0] and not rig.router.steering


def test_by_state_rows_a_preempted_request_is_steered_again_from_its_new_state_row(tmp_path):
    """A preempted steered request frees its state row (an unsteered arrival takes it, unsteered);
    resumed, it comes back as a new request with another state row, steered as before."""
    rig, runner = Rig(tmp_path, states=4), RunnerStates(4)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    spec = _spec({"id": "v", "layer": 1})
    runner.step(rig.step(new=[("s", spec, 1), ("u", None, 1)]))
    rig.rank.on_states(runner.batch(("s", 1), ("u", 1)), runner.index)
    runner.step(rig.step(new=[("n", None, 1)]), preempted=["s"])
    rig.rank.on_states(runner.batch(("u", 1), ("n", 1)), runner.index)
    assert rig.tables.tok_row[:3].tolist() == [0, 0, 0]
    runner.step(rig.step(new=[("s", spec, 1)]))  # resumed: re-sent, admitted again
    rig.rank.on_states(runner.batch(("u", 1), ("n", 1), ("s", 1)), runner.index)
    assert rig.tables.tok_row[:4].tolist() == [0, 0, rig.router.active["s"].row, 0]


def test_by_state_rows_a_steady_batch_routes_nothing_and_a_new_order_is_a_changed_step(tmp_path):
    rig, runner = Rig(tmp_path, states=4), RunnerStates(4)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    runner.step(rig.step(new=[("s", _spec({"id": "v", "layer": 3}), 3), ("u", None, 1)]))
    router = rig.router
    assert router.route_states(runner.batch(("s", 3), ("u", 1)), runner.index)
    assert not router.route_states(runner.batch(("s", 3), ("u", 1)), runner.index)
    assert not router.route_states(runner.batch(("s", 1), ("u", 1)), runner.index)  # counts only: routed again
    assert rig.tables.tok_row[:4].tolist() == [router.active["s"].row, 0, 0, 0]
    assert router.route_states(runner.batch(("u", 1), ("s", 1)), runner.index)
    assert rig.tables.tok_row[:3].tolist() == [0, router.active["s"].row, 0]
    assert rig.tables.step.live == frozenset({1})  # table position of layer 3


@pytest.mark.gpu
def test_on_cuda_by_state_rows_the_upload_kernel_expands_the_map_without_a_torch_call(tmp_path):
    """V2 routing on CUDA: the token map is expanded on the device from the runner's own batch
    (its state rows and token starts as device tensors) and hotwire's rows by state; the host makes
    no torch call, a shorter batch nulls the last one's tail, and a reused state row reads its new
    request's row."""
    rig, runner = Rig(tmp_path, "cuda", states=4), RunnerStates(4)
    router, tables = rig.router, rig.tables
    assert router.expands
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)

    def on_device(*entries):
        batch = runner.batch(*entries)
        starts = np.concatenate([[0], np.cumsum(batch.num_tokens)]).astype(np.int32)
        kept.append((torch.from_numpy(batch.states).cuda(), torch.from_numpy(starts).cuda()))  # live until synchronised
        return batch._replace(states_at=kept[-1][0].data_ptr(), starts_at=kept[-1][1].data_ptr())

    kept = []
    runner.step(rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 2.0}), 3), ("u", None, 1)]))
    first, second = on_device(("u", 1), ("a", 3)), on_device(("u", 1), ("a", 1))
    with _DeviceCalls() as mode:
        router.route_states(first, runner.index)
        router.route_states(second, runner.index)
    assert mode.calls == []
    torch.cuda.synchronize()
    a = router.active["a"].row
    assert tables.tok_row[:5].tolist() == [0, a, 0, 0, 0] and tables.route[a, 0, 0, 4].view(torch.float32).item() == 2.0
    runner.step(rig.step(new=[("n", None, 2)], finished=["a"]))
    router.route_states(on_device(("u", 1), ("n", 2)), runner.index)
    torch.cuda.synchronize()
    assert tables.tok_row[:5].tolist() == [0, 0, 0, 0, 0] and not router.steering
    # switched to routing by request id (hooks: a batch without state rows): the map the device
    # expanded is rewritten, its steered tokens nulled though the host never wrote them
    runner.step(rig.step(new=[("b", _spec({"id": "v", "layer": 1}), 2)]))
    router.route_states(on_device(("u", 1), ("n", 1), ("b", 2)), runner.index)
    router.by_request_id()
    router.route(["u", "n"], np.array([1, 1]))
    torch.cuda.synchronize()
    assert tables.tok_row[:5].tolist() == [0, 0, 0, 0, 0]


def _v2_runner(rank, states: RunnerStates) -> SimpleNamespace:
    """A V2 runner as hooks._after_v2_prepare reads it: its steerer and its request state rows."""
    return SimpleNamespace(_hotwire=rank, req_states=SimpleNamespace(req_id_to_index=states.index))


def _v2_batch(states: RunnerStates, *entries: tuple[str, int], fields: bool = True) -> SimpleNamespace:
    """vLLM's InputBatch as the hook reads it; without ``fields``, one whose runner has state rows
    but whose batch does not name them."""
    b = states.batch(*entries)
    batch = SimpleNamespace(req_ids=[r for r, _ in entries], num_scheduled_tokens=b.num_tokens, num_tokens=b.tokens)
    if fields:
        batch.idx_mapping_np, batch.idx_mapping = b.states, torch.from_numpy(b.states)
        batch.query_start_loc = torch.from_numpy(np.concatenate([[0], np.cumsum(b.num_tokens)]).astype(np.int32))
    return batch


def test_the_v2_hook_routes_by_state_rows_and_by_request_id_where_the_batch_lacks_them(tmp_path, caplog):
    """hooks._after_v2_prepare: a batch naming its state rows goes through Steerer.on_states; one that
    does not (a runner of V2's interface with less in its batch) is routed by request id, said
    once, and the engine keeps serving steered."""
    rig, runner = Rig(tmp_path, states=4), RunnerStates(4)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    runner.step(rig.step(new=[("s", _spec({"id": "v", "layer": 1}), 2), ("u", None, 1)]))
    fake = _v2_runner(rig.rank, runner)
    calls = []
    on_states = rig.rank.on_states
    rig.rank.on_states = lambda *a: (calls.append("states"), on_states(*a))
    hooks._after_v2_prepare(fake, _v2_batch(runner, ("u", 1), ("s", 2)), (), {})
    row = rig.router.active["s"].row
    assert calls == ["states"] and rig.tables.tok_row[:4].tolist() == [0, row, row, 0]
    hooks._after_v2_prepare(fake, _v2_batch(runner, ("s", 1), ("u", 1), fields=False), (), {})
    hooks._after_v2_prepare(fake, _v2_batch(runner, ("u", 1), ("s", 1), fields=False), (), {})
    assert calls == ["states"] and rig.router.states is None
    assert rig.tables.tok_row[:4].tolist() == [0, row, 0, 0]
    assert caplog.text.count("routing it by request id from now on") == 1
