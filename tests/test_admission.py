"""Admission on the engine core (engine_plugin.admission): a spec resolved to a request row and its
slots, and every refusal counted once, by reason (tests/engine_rig.py: one core, its ranks)."""

import gc
import json
import time

import numpy as np
import pytest
import torch

from engine_rig import ENTRIES, REQUESTS, H, Rig
from hotwire.engine_plugin.admission import Admission, Refused
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.stream_bound import StreamBudget
from hotwire.shared.mailbox import ANY_LAYER


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def _spec(*entries):
    return {"hotwire": json.dumps(list(entries))}


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


@pytest.mark.parametrize("entry", [
    {"id": "unit", "layers": "all", "mode": "ablate"},
    {"id": "nope", "layers": "all", "mode": "ablate"},
    {"id": "unit", "layers": "all", "mode": "clamp", "lo": 0.0},
    {"id": "unit", "layers": "all", "mode": "norm", "scale": 0.1},
])
def test_a_projecting_entry_on_all_layers_without_projection_layers_is_refused(entry):
    """It would steer nothing, so it must never be reported as applied (strict mode passes
    what admission admits)."""
    registry = Registry(4)
    registry.bind(0, "unit", ANY_LAYER, 1, 1.0, 4.0)
    admission = Admission(registry, armed=range(12), entries=4, requests=8,
                          budget=StreamBudget.of(torch.float32), counters=None)
    result = admission.admit("r", {"hotwire": json.dumps(entry)}, 8)
    assert isinstance(result, Refused) and result.reason == "unarmed_projection", result


def test_refusals_are_each_counted_but_logged_once_per_reason_per_period(caplog, monkeypatch):
    """A client sending refused specs at a high rate must not put a log line per request on the
    step thread: one line per reason per period, then how many went unlogged (all counted)."""
    from hotwire.engine_plugin import counters as counters_mod

    clock = [1000.0]
    monkeypatch.setattr(counters_mod.time, "monotonic", lambda: clock[0])
    c = counters_mod.Counters()
    with caplog.at_level("WARNING", logger="vllm.hotwire"):
        for i in range(50):
            c.unsteered(f"r{i}", "unknown_id", "no vector 'x' for layer 1")
        c.unsteered("m0", "malformed", "not JSON")  # another reason has its own line
        clock[0] += counters_mod.REFUSAL_LOG_PERIOD_S
        c.unsteered("r50", "unknown_id", "no vector 'x' for layer 1")
    lines = [r.getMessage() for r in caplog.records]
    assert c.counts["unsteered_unknown_id"] == 51 and c.counts["unsteered_malformed"] == 1
    assert lines == ["hotwire: request r0 runs unsteered (unknown_id): no vector 'x' for layer 1",
                     "hotwire: request m0 runs unsteered (malformed): not JSON",
                     "hotwire: request r50 runs unsteered (unknown_id): no vector 'x' for layer 1 "
                     "(49 more since the last such line, counted in unsteered_unknown_id)"]


def test_kept_resolutions_leave_few_objects_for_the_collector():
    """A new spec with every request: the resolutions kept for specs seen again are bounded in
    number, and so are the objects every full collection of the engine core walks for them."""
    registry = Registry(256)
    for slot in range(256):
        registry.bind(slot, f"v{slot}", ANY_LAYER, 1, 1.0, 4.0)
    admission = Admission(registry, armed=range(28), entries=4, requests=8,
                          budget=StreamBudget.of(torch.bfloat16), counters=None)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(3000):
        spec = _spec({"id": f"v{i % 256}", "layer": 9, "scale": 0.5 + i / 64},
                     {"id": f"v{(i + 7) % 256}", "layer": 18, "scale": -0.25 - i / 64})
        assert admission.admit(f"r{i}", spec, 128).slots
        admission.finish((f"r{i}",))
    gc.collect()
    kept = len(gc.get_objects()) - before
    # the spec cache's share (below 2,500, tests/test_spec.py) plus about 5 objects a resolution
    assert kept < 4000, f"{kept} objects kept"


def test_a_spec_seen_before_resolves_against_the_bindings_of_now():
    """Resolutions are kept per spec (Admission._resolve_seen), but never past a change of binding:
    after a replace (new slot bound, old one retired) the same spec text holds the new slot, and
    after the vector is gone it is refused; a spec whose window ends with the prompt gets each
    prompt's window."""
    registry = Registry(4)
    registry.bind(0, "v", ANY_LAYER, 1, 1.0, 1.0)
    admission = Admission(registry, armed=range(4), entries=4, requests=8,
                          budget=StreamBudget.of(torch.float32), counters=None)
    add = _spec({"id": "v", "layer": 1, "scale": 2.0})
    assert admission.admit("a", add, 8).slots == (0,)
    registry.bind(1, "v", ANY_LAYER, 2, 1.0, 1.0)  # the replace: newest wins
    registry.unbind(0)
    assert admission.admit("b", add, 8).slots == (1,)
    registry.unbind(1)
    refused = admission.admit("c", add, 8)
    assert isinstance(refused, Refused) and refused.reason == "unknown_id"
    registry.bind(2, "v", ANY_LAYER, 3, 1.0, 1.0)
    prompt = _spec({"id": "v", "layer": 1, "positions": "prompt"})
    windows = [admission.admit(f"p{n}", prompt, n).terms[0][3:5] for n in (5, 9, 5)]
    assert windows == [(0, 5), (0, 9), (0, 5)]


def test_references_count_each_hold_and_release_when_read():
    """Holds and releases are recorded on the step thread and counted where the references are
    read (engine_plugin/registry.py): a read sees every one of them, stamped when it was made."""
    registry = Registry(8)
    start = time.time_ns()
    registry.hold((1, 2))
    before = registry.refs_changed
    registry.hold((2,))
    registry.release((1, 2))
    made = time.time_ns()
    time.sleep(0.01)  # a count stamped when it was made, not when it was read, stays at or before `made`
    inflight, last_used = registry.refs_to_publish()
    assert before and not registry.refs_changed
    assert inflight.tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    assert start <= int(last_used[1]) == int(last_used[2]) <= made and last_used[0] == 0


def test_references_nobody_reads_are_counted_before_they_pile_up():
    """An engine core with no mailbox thread never reads its references: the step thread counts
    them itself once MOVES_KEPT are waiting, so they never grow without bound."""
    from hotwire.engine_plugin.registry import MOVES_KEPT

    registry = Registry(4)
    for _ in range(3 * MOVES_KEPT):
        registry.hold((3,))
    assert len(registry._moves) < MOVES_KEPT
    assert registry.inflight[3] == 3 * MOVES_KEPT


def test_a_slot_bound_anew_starts_unused_after_earlier_holds():
    registry = Registry(4)
    registry.bind(0, "old", ANY_LAYER, gen=1, absmax=1.0, norm=1.0)
    registry.hold((0,))
    registry.release((0,))
    registry.bind(0, "new", ANY_LAYER, gen=2, absmax=1.0, norm=1.0)  # retired and reused
    assert registry.inflight[0] == 0 and registry.last_used_ns[0] == 0
