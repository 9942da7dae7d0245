"""Host-side routing and the mailbox sync, on CPU tables with a real mailbox file."""

import json
import time

import numpy as np
import pytest
import torch

from hotwire.engine_plugin.counters import Counters
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.routing import Router
from hotwire.engine_plugin.steering import ArmedModel, SteeringTables
from hotwire.engine_plugin.sync import MailboxSync
from hotwire.shared.mailbox import ANY_LAYER, ControlMailbox, EngineMailbox, Fingerprint

H, SLOTS, REQUESTS, ENTRIES = 8, 6, 3, 2


def _rig(tmp_path, device: str):
    tables = SteeringTables(slots=SLOTS, hidden=H, armed=2, requests=REQUESTS, entries=ENTRIES,
                            max_tokens=64, dtype=torch.float32, device=torch.device(device))
    registry, counters = Registry(SLOTS), Counters()
    box = EngineMailbox.create(str(tmp_path / "e.mbx"), Fingerprint("m", 4, H, "float32"), SLOTS)
    box.set_armed([1, 3])
    counters.mailbox = box
    sync = MailboxSync(box, tables.bank, registry, counters)
    router = Router(ArmedModel(tables, (1, 3)), registry, REQUESTS, counters)
    control = ControlMailbox.attach(str(tmp_path / "e.mbx"))
    return tables, registry, counters, sync, router, control


@pytest.fixture
def rig(tmp_path):
    return _rig(tmp_path, "cpu")


def _spec(*entries):
    return {"hotwire": json.dumps(list(entries))}


def test_mailbox_rows_land_in_the_bank_and_bind(rig):
    tables, registry, _, sync, _, control = rig
    row = np.arange(H, dtype=np.float32)
    control.write(2, "v", ANY_LAYER, row, gen=5)
    control.write(4, "w", 3, -row, gen=1)
    sync.apply()
    assert torch.equal(tables.bank[3], torch.from_numpy(row)) and torch.equal(tables.bank[5], -torch.from_numpy(row))
    assert registry.resolve("v", 1) == 2 and registry.resolve("w", 3) == 4 and registry.resolve("w", 1) is None
    assert registry.versions == {"v": 5, "w": 1}
    assert control.in_sync() and control.acked(2) and control.acked(4)


def test_admit_writes_one_request_row_and_holds_its_slots(rig):
    tables, registry, counters, sync, router, control = rig
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    sync.apply()
    router.admit("r1", _spec({"id": "v", "layer": 3, "scale": 2.0, "positions": "prompt"},
                             {"id": "v", "layer": 3, "scale": -1.0}), prompt_len=5)
    router.commit()
    row = router.active["r1"].row
    assert tables.route[row, 1, :, :3].tolist() == [[1, 0, 5], [1, 0, 2**31 - 1]]
    assert tables.route[row, 1, :, 3].view(torch.float32).tolist() == [2.0, -1.0]
    assert tables.route[row, 0].abs().sum() == 0  # layer 1 untouched
    assert registry.inflight[0] == 1 and counters.counts["steered_requests"] == 1
    router.finish(["r1"])
    assert registry.inflight[0] == 0 and "r1" not in router.active


@pytest.mark.parametrize("extra,reason", [
    ({"hotwire": "{"}, "unsteered_malformed"),
    (_spec({"id": "nope", "layer": 1}), "unsteered_unknown_id"),
    (_spec({"id": "v", "layer": 2}), "unsteered_unarmed_layer"),
    (_spec(*[{"id": "v", "layer": 1}] * (ENTRIES + 1)), "unsteered_too_many_entries"),
])
def test_refused_specs_run_unsteered_and_are_counted(rig, extra, reason):
    _, registry, counters, sync, router, control = rig
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    sync.apply()
    router.admit("r", extra, prompt_len=3)
    assert "r" not in router.active and registry.inflight.sum() == 0
    assert counters.counts[reason] == 1
    sync.box.beat()
    assert control.counters()[reason] == 1  # mirrored for the control API at the next heartbeat


def test_full_request_table_runs_the_rest_unsteered(rig):
    _, _, counters, sync, router, control = rig
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    sync.apply()
    for i in range(REQUESTS + 1):
        router.admit(f"r{i}", _spec({"id": "v", "layer": 1}), prompt_len=3)
    assert len(router.active) == REQUESTS and counters.counts["unsteered_table_full"] == 1
    router.finish(["r0"])
    router.admit("late", _spec({"id": "v", "layer": 1}), prompt_len=3)
    assert "late" in router.active


def test_route_maps_tokens_to_rows_and_clears_what_it_no_longer_uses(rig):
    tables, _, _, sync, router, control = rig
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    sync.apply()
    router.admit("s", _spec({"id": "v", "layer": 1}), prompt_len=3)
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


def test_reused_row_with_the_same_token_map_is_copied_again(rig):
    """A request leaves and the next one takes its row: same token map, new row contents."""
    tables, _, _, sync, router, control = rig
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    sync.apply()
    router.admit("a", _spec({"id": "v", "layer": 1, "scale": 1.0}), prompt_len=3)
    router.commit()
    router.route(["a"], np.array([3]))
    row = router.active["a"].row
    router.finish(["a"])
    router.admit("b", _spec({"id": "v", "layer": 1, "scale": -3.0}), prompt_len=3)
    assert router.active["b"].row == row
    router.commit()
    router.route(["b"], np.array([3]))
    assert torch.equal(tables.tok_route[:3], tables.route[row].expand(3, -1, -1, -1))
    assert tables.tok_route[:3, ..., 3].view(torch.float32).min() == -3.0


def test_retirement_is_acked_only_with_current_refs(rig):
    """Invariant 6: the control API may reuse a slot only when acked with no request on it."""
    _, registry, _, sync, router, control = rig
    control.write(0, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    sync.apply()
    router.admit("r", _spec({"id": "v", "layer": 1}), prompt_len=3)
    sync.publish_changed_refs()
    control.retire(0)
    sync.apply()
    assert control.acked(0) and not control.reusable(0)  # acked, but a request still holds it
    assert registry.resolve("v", 1) is None  # no new request can bind it
    router.finish(["r"])
    sync.publish_changed_refs()  # as the engine's step does: a request left, so it publishes
    assert control.reusable(0)


def test_torn_entry_is_skipped_until_the_write_completes(rig):
    tables, registry, counters, sync, _, control = rig
    control.write(1, "v", ANY_LAYER, np.ones(H, np.float32), gen=1)
    seq_at = control._dir_off + 96 * 1  # directory entry 1 starts with its seqlock word
    seq = int(control.directory["seq"][1])
    control._write(seq_at, (seq + 1).to_bytes(8, "little"))  # a writer is mid-way
    control._bump()
    sync.apply()
    assert registry.resolve("v", 1) is None and not control.in_sync()
    assert counters.counts["mailbox_torn_reads"] == 1
    control._write(seq_at, (seq + 2).to_bytes(8, "little"))  # write completes
    sync.apply()
    assert registry.resolve("v", 1) == 1 and control.in_sync()


@pytest.mark.gpu
def test_host_path_only_enqueues_work_behind_a_busy_gpu(tmp_path):
    """vLLM overlaps the next step's host work with the running step, so registering a vector,
    admitting requests and routing a step must not wait for the GPU: with ~1 s of work queued
    ahead they return at once (a copy from pageable memory would block until the queue drains),
    and the tables are right once it has drained."""
    tables, _, _, sync, router, control = _rig(tmp_path, "cuda")
    row = np.arange(H, dtype=np.float32)

    def one_round(tag: str, gen: int) -> None:
        control.write(gen, f"v{gen}", ANY_LAYER, row * gen, gen=gen)
        sync.apply()
        router.admit(tag, _spec({"id": f"v{gen}", "layer": 3, "scale": 2.0}), prompt_len=3)
        router.commit()
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
    assert tables.tok_route[:5, 1, 0, 3].view(torch.float32).tolist() == [0, 0, 2.0, 2.0, 2.0]
