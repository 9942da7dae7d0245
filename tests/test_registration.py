"""The upload protocol (control_api.slots.registration) against a real mailbox: ids and
generations, replace, eviction through the two-phase protocol (invariant 6), and uploads to
an engine that stopped beating.

Each test runs a real control API (uvicorn on 127.0.0.1) and an engine pump on a real mailbox
file; assertions read the rows back out of the mailbox the engine would apply.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hotwire.shared.mailbox import ANY_LAYER, RETIRING, clock_ns

from control_harness import FP, Rig, exact_vector, wait_until

H = FP.hidden


def test_existing_id_conflicts_unless_replace(rig):
    assert rig.push("dup", exact_vector(H, seed=1)).status_code == 201
    r = rig.push("dup", exact_vector(H, seed=2))
    assert r.status_code == 409 and r.json()["error"]["code"] == "exists"
    np.testing.assert_array_equal(rig.engine.entries("dup")[ANY_LAYER][2], exact_vector(H, seed=1))


def test_generation_never_repeats_for_an_id(rig):
    assert rig.push("again", exact_vector(H)).json()["generation"] == 1
    assert rig.http.delete("/steer/vectors/again").status_code == 204
    r = rig.push("again", exact_vector(H, seed=9))
    assert r.status_code == 201 and r.json()["generation"] == 2
    assert rig.engine.entries("again")[ANY_LAYER][1] == 2


# Replace -----------------------------------------------------------------------------------


def test_replace_writes_fresh_slots_and_never_touches_held_ones(rig):
    old, new = exact_vector(FP.n_layers, H, seed=10), exact_vector(FP.n_layers, H, seed=11)
    assert rig.push("swap", old, layers=[0, 1]).status_code == 201
    wait_until(lambda: len(rig.engine.bound) == 2, what="engine binds swap")
    held = rig.engine.hold("swap")  # a running request reads both slots

    r = rig.push("swap", new, layers=[0, 1], replace=True)
    assert r.status_code == 200, r.text
    assert r.json()["generation"] == 2
    entries = rig.engine.entries("swap")
    assert {layer: gen for layer, (_, gen, _) in entries.items()} == {0: 2, 1: 2}
    assert not set(held) & {slot for slot, _, _ in entries.values()}
    for layer in (0, 1):
        np.testing.assert_array_equal(entries[layer][2], new[layer])
        # The held slots are retired, their rows as the running request left them.
        assert rig.engine.box.directory["state"][held[layer]] == RETIRING
        np.testing.assert_array_equal(rig.engine.box.row(held[layer]), old[layer])

    rig.engine.release(held)
    wait_until(lambda: all(rig.engine.box.engine["applied_seq"][s] == rig.engine.box.directory["seq"][s]
                           for s in held))


def test_replace_in_a_full_table_reuses_own_slots_only_after_the_engine_acks(rig):
    old, new = exact_vector(FP.n_layers, H, seed=12), exact_vector(FP.n_layers, H, seed=13)
    assert rig.push("big", old).status_code == 201  # 4 slots
    assert rig.push("pinned", exact_vector(FP.n_layers, H), pin=True).status_code == 201  # 4 more
    own = sorted(slot for slot, _, _ in rig.engine.entries("big").values())
    wait_until(lambda: len(rig.engine.bound) == 8, what="engine binds everything")

    rig.engine.paused.set()  # the engine is mid-step: nothing is acknowledged
    result = {}
    upload = threading.Thread(target=lambda: result.update(r=rig.push("big", new, replace=True)))
    upload.start()
    wait_until(lambda: all(rig.engine.box.directory["state"][s] == RETIRING for s in own),
               what="own slots retired")
    time.sleep(0.3)
    assert upload.is_alive(), "reused slots before the engine acknowledged"
    for layer, slot in enumerate(own):
        np.testing.assert_array_equal(rig.engine.box.row(slot), old[layer])

    rig.engine.paused.clear()
    upload.join(5)
    assert result["r"].status_code == 200, result["r"].text
    entries = rig.engine.entries("big")
    assert sorted(slot for slot, _, _ in entries.values()) == own
    for layer, (_, gen, row) in entries.items():
        assert gen == 2
        np.testing.assert_array_equal(row, new[layer])


def test_replace_with_a_busy_vector_and_no_room_is_refused(rig):
    old = exact_vector(FP.n_layers, H, seed=14)
    assert rig.push("busy", old).status_code == 201
    assert rig.push("pinned", exact_vector(FP.n_layers, H), pin=True).status_code == 201
    wait_until(lambda: len(rig.engine.bound) == 8)
    rig.engine.hold("busy")
    seqs = rig.engine.seqs()
    r = rig.push("busy", exact_vector(FP.n_layers, H, seed=15), replace=True)
    assert (r.status_code, r.json()["error"]["code"]) == (507, "no_space"), r.text
    assert rig.catalog()["busy"]["generation"] == 1
    assert rig.engine.seqs() == seqs


# Eviction ----------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path):
    """A table of 3 slots, filled by three idle (hidden,) vectors."""
    rig = Rig(tmp_path)
    rig.start_engine(n_slots=3)
    rig.start_api()
    for name in ("v1", "v2", "v3"):
        assert rig.push(name, exact_vector(H)).status_code == 201
    wait_until(lambda: len(rig.engine.bound) == 3)
    yield rig
    rig.stop()


@pytest.mark.parametrize("order", [("v2", "v1", "v3"), ("v3", "v2", "v1")])
def test_eviction_takes_the_least_recently_used_idle_vector(small, order):
    for name in order:
        small.engine.touch(name)
        time.sleep(0.002)
    r = small.push("newcomer", exact_vector(H, seed=20))
    assert r.status_code == 201, r.text
    assert r.json()["resident"]
    catalog = small.catalog()
    assert catalog[order[0]]["state"] == "not_resident"  # evicted, still registered
    assert catalog[order[0]]["slots"] == []
    assert all(catalog[name]["resident"] for name in order[1:])
    assert small.engine.entries(order[0]) == {}


def test_eviction_spares_pinned_and_busy_vectors(small):
    small.engine.touch("v1")  # v1 is the oldest use but a request holds it
    small.engine.touch("v2")
    small.engine.touch("v3")
    small.engine.hold("v1")
    assert small.http.delete("/steer/vectors/v2").status_code == 204
    assert small.push("v2", exact_vector(H), pin=True).status_code == 201  # pinned, oldest
    small.engine.touch("v3")  # v3 is now the most recent, and the only idle unpinned one
    r = small.push("newcomer", exact_vector(H, seed=21))
    assert r.status_code == 201, r.text
    catalog = small.catalog()
    assert catalog["v3"]["state"] == "not_resident"
    assert catalog["v1"]["resident"] and catalog["v2"]["resident"]


def test_nothing_evictable_is_507_and_changes_nothing(small):
    small.engine.hold("v1")
    small.engine.hold("v2")
    small.http.delete("/steer/vectors/v3")
    assert small.push("v3", exact_vector(H), pin=True).status_code == 201
    wait_until(lambda: small.resident("v3"))
    before = small.state()
    r = small.push("newcomer", exact_vector(H))
    assert (r.status_code, r.json()["error"]["code"]) == (507, "no_space")
    assert "pinned" in r.json()["error"]["message"]
    assert small.state() == before


def test_evicted_vector_returns_when_space_frees(small):
    small.engine.touch("v2")
    small.engine.touch("v3")
    assert small.push("v4", exact_vector(H)).status_code == 201
    assert small.catalog()["v1"]["state"] == "not_resident"
    assert small.http.delete("/steer/vectors/v4").status_code == 204
    wait_until(lambda: small.resident("v1"), what="v1 re-made resident")
    np.testing.assert_array_equal(small.engine.entries("v1")[ANY_LAYER][2], exact_vector(H))


def test_eviction_that_the_engine_never_acks_times_out_with_507(tmp_path):
    rig = Rig(tmp_path, evict_timeout_s=0.5)
    rig.start_engine(n_slots=1)
    rig.start_api()
    try:
        assert rig.push("only", exact_vector(H)).status_code == 201
        wait_until(lambda: rig.engine.bound)
        rig.engine.paused.set()
        r = rig.push("second", exact_vector(H))
        assert (r.status_code, r.json()["error"]["code"]) == (507, "evict_timeout")
        assert list(rig.catalog()) == ["only"]
        rig.engine.paused.clear()  # the retired vector is re-made resident by the reconciler
        wait_until(lambda: rig.resident("only"), what="only restored")
    finally:
        rig.stop()


# An engine that stopped beating ------------------------------------------------------------


def test_a_push_to_an_engine_that_stopped_beating_is_queued_not_resident(tmp_path):
    rig = Rig(tmp_path, heartbeat_timeout_s=0.5)
    rig.start_engine()
    rig.start_api()
    try:
        rig.engine.paused.set()  # the engine is stuck or dead; its mailbox file stays
        wait_until(lambda: rig.http.get("/readyz").status_code == 503, what="heartbeat stale")
        r = rig.push("late", exact_vector(H))
        assert r.status_code == 201, r.text
        info = r.json()
        assert (info["resident"], info["state"]) == (False, "queued")
        assert "heartbeat is" in info["reason"]
        assert "will be applied when the engine beats again" in info["reason"]
        assert len(info["slots"]) == 1
        assert rig.metrics()[("hotwire_resident_vectors", (("dp_rank", "0"),))] == 0
        rig.engine.paused.clear()
        wait_until(lambda: rig.resident("late"), what="resident once the engine beats")
        assert rig.engine.bound == {info["slots"][0]["slot"]: "late"}
    finally:
        rig.stop()


def test_a_push_to_a_dead_engine_is_queued_until_a_new_one_takes_it(tmp_path):
    rig = Rig(tmp_path, heartbeat_timeout_s=0.5)
    rig.start_engine()
    rig.start_api()
    try:
        rig.engine.stop()
        time.sleep(0.6)
        info = rig.push("late", exact_vector(H)).json()
        assert (info["resident"], info["state"]) == (False, "queued")
        assert rig.catalog()["late"]["state"] == "queued"
        rig.start_engine()  # a new engine, a new mailbox: the catalog is pushed to it
        wait_until(lambda: rig.resident("late"), what="resident on the new engine")
    finally:
        rig.stop()


def test_a_push_in_the_first_seconds_after_the_engine_stopped_is_not_resident(rig):
    """Within the readiness timeout the heartbeat is not yet stale, but the engine has taken
    nothing in: the rows are written, not applied, and the answer says so."""
    assert rig.push("before", exact_vector(H, seed=1)).json()["resident"]
    rig.engine.paused.set()  # the engine stops: no beat, no ack from here on
    answers = [rig.push("late", exact_vector(H, seed=2)).json()]
    rig.engine.box.beat(at_ns=clock_ns() - 2 * 10**9)  # silent for 2 s, under the 3 s timeout
    answers.append(rig.push("later", exact_vector(H, seed=3)).json())
    for info in answers:
        assert (info["resident"], info["state"]) == (False, "queued"), info
        assert "the engine has not taken it in" in info["reason"]
        assert len(info["slots"]) == 1  # written into the table all the same
    assert rig.catalog()["before"]["resident"]  # taken in before the engine stopped
    rig.engine.paused.clear()
    wait_until(lambda: rig.resident("late") and rig.resident("later"),
               what="resident once the engine takes them in")
