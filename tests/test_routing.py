"""Host-side routing and the engine core's mailbox sync (tests/engine_rig.py: one core, its ranks)."""

import json
import time

import numpy as np
import pytest
import torch

from engine_rig import ENTRIES, REQUESTS, SLOTS, H, Rig, Step, make_rank, new_req
from hotwire.shared.mailbox import ANY_LAYER


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)

def _spec(*entries):
    return {"hotwire": json.dumps(list(entries))}


def test_mailbox_rows_land_in_the_bank_and_bind(rig):
    row = np.arange(H, dtype=np.float32)
    rig.control.write(2, "v", ANY_LAYER, row, gen=5)
    rig.control.write(4, "w", 3, -row, gen=1)
    rig.idle()
    assert rig.control.in_sync() and rig.control.acked(2) and rig.control.acked(4)  # acked at once
    assert rig.registry.resolve("v", 1) is None and rig.tables.bank.abs().sum() == 0  # both change with a step
    rig.step()
    tables, registry = rig.tables, rig.registry
    assert torch.equal(tables.bank[3], torch.from_numpy(row)) and torch.equal(tables.bank[5], -torch.from_numpy(row))
    assert registry.resolve("v", 1) == 2 and registry.resolve("w", 3) == 4 and registry.resolve("w", 1) is None
    assert registry.versions == {"v": 5, "w": 1}


def test_admit_writes_one_request_row_and_holds_its_slots(rig):
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step()
    rig.step(new=[("r1", _spec({"id": "v", "layer": 3, "scale": 2.0, "positions": "prompt"},
                               {"id": "v", "layer": 3, "scale": -1.0}), 5)])
    rig.router.commit()
    tables, row = rig.tables, rig.router.active["r1"].row
    assert tables.route[row, 1, :, :3].tolist() == [[1, 0, 5], [1, 0, 2**31 - 1]]
    assert tables.route[row, 1, :, 4].view(torch.float32).tolist() == [2.0, -1.0]
    assert tables.route[row, 0].abs().sum() == 0  # layer 1 untouched
    assert rig.registry.inflight[0] == 1 and rig.core.registry.inflight[0] == 1
    rig.idle()  # the mailbox thread publishes the references
    assert rig.counters.counts["steered_requests"] == 1 and int(rig.control.engine["inflight"][0]) == 1
    rig.step(finished=["r1"])
    assert rig.registry.inflight[0] == 0 and "r1" not in rig.router.active
    rig.idle()
    assert int(rig.control.engine["inflight"][0]) == 0


@pytest.mark.parametrize("extra,reason", [
    ({"hotwire": "{"}, "unsteered_malformed"),
    (_spec({"id": "nope", "layer": 1}), "unsteered_unknown_id"),
    (_spec({"id": "v", "layer": 2}), "unsteered_unarmed_layer"),
    (_spec(*[{"id": "v", "layer": 1}] * (ENTRIES + 1)), "unsteered_too_many_entries"),
    (_spec({"id": "v", "layer": 1, "scale": 1e38}), "unsteered_out_of_range"),
])
def test_refused_specs_run_unsteered_and_are_counted(rig, extra, reason):
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step()
    rig.step(new=[("r", extra, 3)])
    assert "r" not in rig.router.active and rig.registry.inflight.sum() == 0
    assert rig.counters.counts[reason] == 1 and rig.rank.counters.counts[reason] == 0  # said once
    rig.core.box.beat()
    assert rig.control.counters()[reason] == 1  # mirrored for the control API at the next heartbeat


def test_full_request_table_runs_the_rest_unsteered(rig):
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step()
    rig.step(new=[(f"r{i}", _spec({"id": "v", "layer": 1}), 3) for i in range(REQUESTS + 1)])
    assert len(rig.router.active) == REQUESTS and rig.counters.counts["unsteered_table_full"] == 1
    assert rig.core.admission.active.keys() == rig.router.active.keys()
    rig.step(finished=["r0"], new=[("late", _spec({"id": "v", "layer": 1}), 3)])
    assert "late" in rig.router.active and "late" in rig.core.admission.active


def test_route_maps_tokens_to_rows_and_clears_what_it_no_longer_uses(rig):
    tables, router = rig.tables, rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("s", _spec({"id": "v", "layer": 1}), 3)])  # the vector binds before admission
    router.commit()
    row = router.active["s"].row

    def token_rows() -> list[int]:
        """The request row each token's per-token copy matches (0 = the null row)."""
        out = []
        for t in range(6):
            hits = [r for r in range(REQUESTS + 1) if torch.equal(tables.tok_route[t], tables.route[r])]
            out.append(0 if 0 in hits else hits[0])
        return out

    router.route(["u", "s", "u2"], np.array([2, 3, 1]))
    assert token_rows() == [0, 0, row, row, row, 0]
    router.route(["s"], np.array([1]))  # decode step: shorter batch, stale tail nulled
    assert token_rows() == [row, 0, 0, 0, 0, 0]
    router.finish(["s"])
    router.route(["u"], np.array([4]))
    assert tables.tok_route.abs().sum() == 0


def test_route_names_the_layers_the_steps_requests_have_entries_on(rig):
    """What the op skips the other layers by, in steps run without a CUDA graph (ARMED = (1, 3))."""
    tables, router = rig.tables, rig.router
    live = lambda: sorted(i for i in range(len(rig.router.armed.layers))  # noqa: E731
                          if tables.layer(i).data_ptr() in tables.step.live)
    assert live() == [0, 1]  # before any step: every layer (capture and warm-up passes)
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("one", _spec({"id": "v", "layer": 3}), 3), ("two", _spec({"id": "v", "layer": 1}), 3)])
    router.route(["one", "u"], np.array([1, 1]))
    assert live() == [1]
    router.route(["one", "two"], np.array([1, 1]))
    assert live() == [0, 1]
    rig.step(finished=["one"], new=[("three", _spec({"id": "v", "layer": 1}), 3)])  # row 'one' reused
    router.route(["three", "u"], np.array([1, 1]))
    assert live() == [0]
    router.route(["u"], np.array([2]))
    assert live() == []


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


def test_reused_row_with_the_same_token_map_is_copied_again(rig):
    """A request leaves and the next one takes its row: same token map, new row contents."""
    tables, router = rig.tables, rig.router
    rig.control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("a", _spec({"id": "v", "layer": 1, "scale": 1.0}), 3)])
    router.route(["a"], np.array([3]))
    row = router.active["a"].row
    rig.step(finished=["a"], new=[("b", _spec({"id": "v", "layer": 1, "scale": -3.0}), 3)])
    assert router.active["b"].row == row
    router.route(["b"], np.array([3]))
    assert torch.equal(tables.tok_route[:3], tables.route[row].expand(3, -1, -1, -1))
    assert tables.tok_route[:3, ..., 4].view(torch.float32).min() == -3.0


def test_retirement_is_acked_only_with_current_refs(rig):
    """Invariant 6: the control API may reuse a slot only when acked with no request on it."""
    control = rig.control
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("r", _spec({"id": "v", "layer": 1}), 3)])
    control.retire(0)
    rig.idle()
    assert control.acked(0) and not control.reusable(0)  # acked, but a request still holds it
    rig.step()
    assert rig.registry.resolve("v", 1) is None  # no new request can bind it
    rig.step(finished=["r"])
    assert not control.reusable(0)  # until the mailbox thread publishes the references
    rig.idle()
    assert control.reusable(0)


def test_a_slot_reused_at_once_is_rebound_with_the_next_step(rig):
    """Retired, acked with no reference, rewritten before any step ran: the rank sees only the
    new vector, and its row, at the next step."""
    control = rig.control
    control.write(0, "old", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step()
    control.retire(0)
    rig.idle()
    assert control.reusable(0)
    control.write(0, "new", ANY_LAYER, np.full(H, 2.0, np.float32), gen=1)
    rig.idle()
    rig.step()
    assert rig.registry.bound() == {("new", ANY_LAYER): 0} == rig.core.registry.bound()
    assert torch.equal(rig.tables.bank[1], torch.full((H,), 2.0))


def test_a_reused_slot_does_not_show_its_previous_occupants_last_use(rig):
    control = rig.control
    control.write(0, "old", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.step(new=[("r", _spec({"id": "old", "layer": 1}), 3)])
    rig.step(finished=["r"])
    rig.idle()
    assert int(control.engine["last_used_ns"][0]) > 0
    control.retire(0)
    rig.idle()
    control.write(0, "new", ANY_LAYER, np.ones(H, np.float32), gen=1)
    rig.idle()
    rig.step()
    rig.idle()
    assert int(control.engine["last_used_ns"][0]) == 0  # "new" has not been used yet


def test_torn_entry_is_skipped_until_the_write_completes(rig):
    control = rig.control
    control.write(1, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    seq_at = control._dir_off + 96 * 1  # directory entry 1 starts with its seqlock word
    seq = int(control.directory["seq"][1])
    control._write(seq_at, (seq + 1).to_bytes(8, "little"))  # a writer is mid-way
    control._bump()
    rig.step()
    assert rig.registry.resolve("v", 1) is None and not control.in_sync()
    assert rig.counters.counts["mailbox_torn_reads"] == 1
    control._write(seq_at, (seq + 2).to_bytes(8, "little"))  # write completes
    rig.step()
    assert rig.registry.resolve("v", 1) == 1 and control.in_sync()


def _churn(rig: Rig, step: int, rng: np.random.Generator) -> Step:
    """One step of mailbox changes (writes, replaces, retirements) and request traffic."""
    slot = step % SLOTS
    if step % 3 == 2:
        rig.control.retire(slot)
    else:
        rig.control.write(slot, f"v{step % 4}", ANY_LAYER, rng.standard_normal(H).astype(np.float32), gen=step + 1)
    return Step([new_req(f"r{step}", _spec({"id": f"v{step % 4}", "layer": 1}))],
                {f"r{step - 2}"} if step >= 2 else set())


def _same(a, b) -> bool:
    ra, rb = a.router, b.router
    return (ra.active == rb.active
            and torch.equal(a.tables.bank, b.tables.bank) and torch.equal(a.tables.route, b.tables.route))


def test_every_rank_changes_at_the_same_step(tmp_path):
    """Invariant 9: two ranks fed the same steps hold the same bindings, rows and routes after
    every step, while the mailbox changes between and during them."""
    rig, other, rng = Rig(tmp_path), make_rank("cpu"), np.random.default_rng(0)
    for step in range(12):
        out = _churn(rig, step, rng)
        rig.core.poll()
        rig.core.on_schedule(out)
        for rank in (rig.rank, other):
            rank.on_schedule(out)
            rank.router.commit()
        assert _same(rig.rank, other), step
        assert rig.core.registry.inflight.tolist() == rig.registry.inflight.tolist()


def test_a_rank_a_step_late_is_caught(tmp_path):
    """The check above can fail: with the ordering broken on purpose (one rank applies each
    step's change a step late, as a rank reading the mailbox on its own clock could), the ranks
    disagree after some step."""
    rig, late, rng = Rig(tmp_path), make_rank("cpu"), np.random.default_rng(0)
    held, agreed = None, []
    for step in range(12):
        out = _churn(rig, step, rng)
        rig.core.poll()
        rig.core.on_schedule(out)
        rig.rank.on_schedule(out)
        skewed = Step(out.scheduled_new_reqs, out.finished_req_ids)
        skewed.hotwire, held = held, out.hotwire
        late.on_schedule(skewed)
        for rank in (rig.rank, late):
            rank.router.commit()
        agreed.append(_same(rig.rank, late))
    assert not all(agreed)


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
    assert tables.tok_route[:5, 1, 0, :3].tolist() == [[0, 0, 0], [0, 0, 0], *[[3, 0, 2**31 - 1]] * 3]
    assert tables.tok_route[:5, 1, 0, 4].view(torch.float32).tolist() == [0, 0, 2.0, 2.0, 2.0]
