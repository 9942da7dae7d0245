"""The reconcile pass (control_api.slots.reconcile), invariant 7: restarts of either side, in any
order, converge to the same registered set; engine vectors the catalog does not know are adopted
(or retired, when chosen), never silently destroyed."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time

import numpy as np
import pytest

from hotwire.control_api.slots.reconcile import RECONCILE_PERIOD_S
from hotwire.shared.mailbox import ACTIVE, ANY_LAYER, RETIRING, ControlMailbox

from control_harness import FP, Rig, exact_vector, wait_until

H = FP.hidden


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path)
    yield rig
    rig.stop()


def _push_two(rig: Rig) -> dict[str, np.ndarray]:
    vectors = {"per_layer": exact_vector(FP.n_layers, H, seed=1), "flat": exact_vector(H, seed=2)}
    for name, vector in vectors.items():
        assert rig.push(name, vector, pin=name == "flat").status_code == 201
    return vectors


def _assert_resident(rig: Rig, vectors: dict[str, np.ndarray]) -> None:
    for name, vector in vectors.items():
        entries = rig.engine.entries(name)
        if vector.ndim == 1:
            assert list(entries) == [ANY_LAYER]
            np.testing.assert_array_equal(entries[ANY_LAYER][2], vector)
        else:
            assert sorted(entries) == list(range(FP.n_layers))
            for layer, (_, _, row) in entries.items():
                np.testing.assert_array_equal(row, vector[layer])


def _restart_engine(rig: Rig, **kwargs) -> None:
    """Restart the engine and wait until the control API has attached to the new mailbox."""
    epoch = rig.http.get("/steer/slots").json()["engine"]["epoch"]
    rig.engine.restart(**kwargs)
    wait_until(lambda: rig.http.get("/steer/slots").json().get("engine", {}).get("epoch")
               not in (None, epoch), what="re-attach to the new mailbox")


def test_control_api_restart_keeps_catalog_and_adopts_slots(rig):
    rig.start_engine()
    rig.start_api()
    vectors = _push_two(rig)
    before = rig.catalog()
    wait_until(lambda: len(rig.engine.bound) == FP.n_layers + 1)
    rig.stop_api()

    # While no control API runs, the table drifts from the catalog: a vector written by some
    # other control API appears, and one of ours goes missing.
    box = ControlMailbox.attach(str(rig.settings.mailbox))
    free = [s for s in range(box.n_slots) if box.directory["state"][s] == 0]
    ghost = exact_vector(H, seed=3)
    box.write(free[0], "ghost", ANY_LAYER, ghost, gen=5)
    flat_slot = rig.engine.entries("flat")[ANY_LAYER][0]
    box.retire(flat_slot)
    box.close()
    kept = {layer: (slot, rig.engine.box.directory["seq"][slot])
            for layer, (slot, _, _) in rig.engine.entries("per_layer").items()}

    rig.start_api()
    after = rig.catalog()
    ghost_info = after.pop("ghost")
    assert {k: (v["generation"], v["metadata"], v["pinned"]) for k, v in after.items()} == \
        {k: (v["generation"], v["metadata"], v["pinned"]) for k, v in before.items()}
    wait_until(lambda: rig.resident("flat"), what="flat pushed again")
    _assert_resident(rig, {**vectors, "ghost": ghost})
    # Slots that matched the catalog were kept as they were, not rewritten.
    assert {layer: (slot, rig.engine.box.directory["seq"][slot]) for layer, (slot, _, _)
            in rig.engine.entries("per_layer").items()} == kept
    # The vector the catalog did not know was adopted in place, under its generation.
    assert (ghost_info["generation"], ghost_info["state"]) == (5, "resident")
    assert rig.engine.entries("ghost")[ANY_LAYER][:2] == (free[0], 5)
    # Its generation is remembered: replacing "ghost" now cannot reuse generation 5.
    assert rig.push("ghost", exact_vector(H), replace=True).json()["generation"] == 6


def test_engine_restart_gets_the_catalog_pushed_again(rig):
    rig.start_engine()
    rig.start_api()
    vectors = _push_two(rig)
    _restart_engine(rig)
    wait_until(lambda: all(rig.resident(name) for name in vectors), what="catalog pushed again")
    _assert_resident(rig, vectors)
    wait_until(lambda: rig.http.get("/readyz").status_code == 200)


def test_engine_restart_with_fewer_slots_keeps_pinned_vectors_first(rig):
    rig.start_engine()
    rig.start_api()
    vectors = _push_two(rig)  # 5 slots: per_layer (4) + flat (1, pinned)
    _restart_engine(rig, n_slots=2)
    wait_until(lambda: rig.resident("flat"), what="pinned vector pushed")
    catalog = rig.catalog()
    assert catalog["per_layer"]["state"] == "not_resident"
    assert "waiting for free slots" in catalog["per_layer"]["reason"]
    np.testing.assert_array_equal(rig.engine.entries("flat")[ANY_LAYER][2], vectors["flat"])


def test_engine_restart_with_another_model_marks_vectors_incompatible(rig):
    rig.start_engine()
    rig.start_api()
    _push_two(rig)
    rig.engine.stop()
    rig.start_engine(fp=type(FP)("other/model", n_layers=FP.n_layers, hidden=2 * H, dtype="float16"))
    wait_until(lambda: rig.catalog()["flat"]["state"] == "incompatible")
    assert "does not match the model" in rig.catalog()["flat"]["reason"]
    assert rig.engine.entries("flat") == {}
    assert all(rig.engine.box.directory["state"] == 0)


def test_control_api_first_then_engine(rig):
    # A catalog from an earlier run, with no engine around.
    rig.start_engine()
    rig.start_api()
    vectors = _push_two(rig)
    rig.stop_api()
    rig.engine.stop()
    rig.settings.mailbox.unlink()

    rig.start_api()
    r = rig.http.get("/readyz")
    assert r.status_code == 503 and "no mailbox" in r.json()["reason"]
    assert {v["state"] for v in rig.catalog().values()} == {"no_engine"}
    r = rig.push("meanwhile", exact_vector(H))
    assert (r.status_code, r.json()["error"]["code"]) == (503, "no_engine")
    assert rig.http.get("/steer/slots").json()["error"]["code"] == "no_engine"

    rig.start_engine()
    wait_until(lambda: rig.http.get("/readyz").status_code == 200, what="ready once the engine is up")
    wait_until(lambda: all(rig.resident(name) for name in vectors))
    _assert_resident(rig, vectors)


def test_engine_that_has_not_armed_yet_is_not_ready(rig):
    rig.start_engine(armed=())
    rig.start_api()
    r = rig.http.get("/readyz")
    assert r.status_code == 503 and "armed" in r.json()["reason"]
    r = rig.push("early", exact_vector(H))
    assert (r.status_code, r.json()["error"]["code"]) == (503, "engine_starting")
    rig.engine.box.set_armed(list(range(FP.n_layers)), entries=4)
    wait_until(lambda: rig.http.get("/readyz").status_code == 200)


def test_a_second_control_api_on_the_same_mailbox_stays_detached(rig, tmp_path):
    rig.start_engine()
    rig.start_api()
    second = Rig(tmp_path / "second", mailbox=rig.settings.mailbox)
    second.start_api()
    try:
        r = second.http.get("/readyz")
        assert r.status_code == 503 and "another control API" in r.json()["reason"]
        assert second.push("x", exact_vector(H)).json()["error"]["code"] == "no_engine"
        rig.stop_api()  # the first one goes away; the second takes over
        wait_until(lambda: second.http.get("/readyz").status_code == 200)
    finally:
        second.stop()


def test_deletes_and_generations_survive_a_restart(rig):
    rig.start_engine()
    rig.start_api()
    _push_two(rig)
    assert rig.push("per_layer", exact_vector(FP.n_layers, H, seed=7), replace=True,
                    metadata={"v": 2}).status_code == 200
    assert rig.http.delete("/steer/vectors/flat").status_code == 204
    rig.stop_api()
    rig.start_api()
    catalog = rig.catalog()
    assert list(catalog) == ["per_layer"]
    assert (catalog["per_layer"]["generation"], catalog["per_layer"]["metadata"]) == (2, {"v": 2})
    assert rig.push("flat", exact_vector(H)).json()["generation"] == 2


# Vectors the catalog does not know (invariant 7: nothing is destroyed without a logged choice)


def _directory(rig: Rig) -> list[tuple[int, int, int, str, int]]:
    """Every slot's (state, seq, generation, id, layer): what a control API wrote."""
    d = rig.engine.box.directory
    return [(int(d["state"][s]), int(d["seq"][s]), int(d["gen"][s]), d["vector_id"][s].decode(),
             int(d["layer"][s])) for s in range(rig.engine.n_slots)]


def _messages(caplog, level: int, *words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == level and all(w in r.getMessage() for w in words)]


def _wait_applied(rig: Rig) -> None:
    wait_until(lambda: rig.engine.box.header["applied_gen"] == rig.engine.box.header["target_gen"],
               what="the engine to apply every write")


def test_an_empty_catalog_adopts_every_live_vector_as_it_is(rig, tmp_path, caplog):
    rig.start_engine(n_slots=12)
    rig.start_api()
    vectors = _push_two(rig)
    some = exact_vector(FP.n_layers, H, seed=4)
    assert rig.push("some_layers", some, layers=[1, 3]).status_code == 201
    vectors["flat"] = exact_vector(H, seed=5)
    assert rig.push("flat", vectors["flat"], replace=True, pin=True).status_code == 200
    before = rig.catalog()
    _wait_applied(rig)
    table = _directory(rig)
    rig.stop_api()

    empty = tmp_path / "elsewhere" / "state"
    with caplog.at_level(logging.INFO, logger="hotwire.control_api"):
        rig.start_api(state_dir=empty)
        adopted = rig.catalog()
        time.sleep(5 * RECONCILE_PERIOD_S)
    assert _messages(caplog, logging.INFO, f"catalog {empty / 'catalog.sqlite3'}")
    epoch = rig.http.get("/steer/slots").json()["engine"]["epoch"]
    assert set(adopted) == set(before)
    for vector_id, info in adopted.items():
        assert (info["generation"], info["pinned"], info["state"]) == \
            (before[vector_id]["generation"], before[vector_id]["pinned"], "resident")
        note = info["metadata"]["adopted"]
        assert (note["mailbox"], note["epoch"]) == (str(rig.settings.mailbox), epoch)
        slots = sorted(s["slot"] for s in info["slots"])
        assert note["slots"] == slots
        assert _messages(caplog, logging.WARNING, f"adopted {vector_id} generation "
                         f"{info['generation']} from slots {slots}")
    assert adopted["flat"]["generation"] == 2
    assert (adopted["flat"]["shape"], adopted["flat"]["layers"]) == ([H], None)
    assert (adopted["per_layer"]["shape"], adopted["per_layer"]["layers"]) == \
        ([FP.n_layers, H], list(range(FP.n_layers)))
    assert adopted["some_layers"]["layers"] == [1, 3]
    assert _directory(rig) == table  # nothing retired, nothing rewritten
    assert not _messages(caplog, logging.INFO, "retired")
    assert 'hotwire_adopted_vectors_total{dp_rank="0"} 3.0' in rig.http.get("/metrics").text

    # The catalog now holds the rows themselves: a new engine gets exactly them back.
    _restart_engine(rig)
    wait_until(lambda: all(rig.resident(name) for name in adopted), what="adopted vectors pushed")
    _assert_resident(rig, vectors)
    entries = rig.engine.entries("some_layers")
    assert sorted(entries) == [1, 3]
    for layer, (_, generation, row) in entries.items():
        assert generation == 1
        np.testing.assert_array_equal(row, some[layer])


def test_a_vector_deleted_while_detached_is_retired_not_resurrected(rig):
    rig.start_engine()
    rig.start_api()
    vectors = _push_two(rig)
    wait_until(lambda: len(rig.engine.bound) == FP.n_layers + 1)
    flat_slot = rig.engine.entries("flat")[ANY_LAYER][0]
    rig.stop_api()

    # Something else holds the mailbox (an old control API on its way out): this one starts
    # detached, and the delete reaches only the catalog.
    fd = os.open(rig.settings.mailbox, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rig.start_api()
        assert "another control API" in rig.http.get("/readyz").json()["reason"]
        assert rig.http.delete("/steer/vectors/flat").status_code == 204
    finally:
        os.close(fd)
    wait_until(lambda: rig.http.get("/readyz").status_code == 200, what="attached")
    wait_until(lambda: rig.engine.box.directory["state"][flat_slot] == RETIRING,
               what="the deleted vector retired")
    assert list(rig.catalog()) == ["per_layer"]
    _assert_resident(rig, {"per_layer": vectors["per_layer"]})
    assert rig.push("flat", exact_vector(H)).json()["generation"] == 2


def test_unknown_vectors_retire_retires_them_and_says_so(rig, caplog):
    rig.start_engine()
    box = ControlMailbox.attach(str(rig.settings.mailbox))
    box.write(0, "ghost", ANY_LAYER, exact_vector(H, seed=3), gen=5)
    box.close()
    with caplog.at_level(logging.INFO, logger="hotwire.control_api"):
        rig.start_api(unknown_vectors="retire")
        wait_until(lambda: rig.engine.box.directory["state"][0] == RETIRING, what="ghost retired")
    assert "ghost" not in rig.catalog()
    said = _messages(caplog, logging.WARNING, "slot 0", "ghost", "generation 5",
                     "unknown_vectors=retire")
    assert said and "not in the catalog" in said[0]
    assert _messages(caplog, logging.INFO, "are retired")  # the start-up line says the choice
    # Its generation is remembered: registering "ghost" cannot reuse generation 5.
    assert rig.push("ghost", exact_vector(H)).json()["generation"] == 6


def test_a_wrong_catalog_adopts_newer_engine_writes_and_replaces_older_ones(rig, tmp_path, caplog):
    first, second = exact_vector(H, seed=1), exact_vector(H, seed=2)
    rig.start_engine()
    rig.start_api()
    assert rig.push("v", first).status_code == 201
    rig.stop_api()
    state = rig.settings.state_dir
    old_a, old_b = tmp_path / "old_a", tmp_path / "old_b"  # catalogs from before the replace
    shutil.copytree(state, old_a)
    shutil.copytree(state, old_b)
    rig.start_api()
    assert rig.push("v", second, replace=True, metadata={"v": 2}).json()["generation"] == 2
    _wait_applied(rig)
    rig.stop_api()

    # The engine holds a later write (generation 2) than the catalog (1): adopted, in place.
    table = _directory(rig)
    with caplog.at_level(logging.WARNING, logger="hotwire.control_api"):
        rig.start_api(state_dir=old_a)
        info = rig.catalog()["v"]
        time.sleep(5 * RECONCILE_PERIOD_S)
    assert (info["generation"], info["state"]) == (2, "resident")
    assert info["metadata"]["adopted"]["replaced_generation"] == 1
    assert _directory(rig) == table
    np.testing.assert_array_equal(rig.engine.entries("v")[ANY_LAYER][2], second)
    assert _messages(caplog, logging.WARNING, "adopted v generation 2", "later write",
                     "generation 1")
    rig.stop_api()

    # The engine holds an older write (1) than the catalog (2): the catalog's replaces it.
    rig.engine.restart()
    rig.start_api(state_dir=old_b)
    wait_until(lambda: rig.resident("v"), what="generation 1 pushed")
    rig.stop_api()
    old_slot = rig.engine.entries("v")[ANY_LAYER][0]
    rig.start_api(state_dir=state)
    wait_until(lambda: rig.engine.entries("v")[ANY_LAYER][1] == 2, what="generation 2 pushed")
    np.testing.assert_array_equal(rig.engine.entries("v")[ANY_LAYER][2], second)
    assert rig.engine.box.directory["state"][old_slot] == RETIRING
    info = rig.catalog()["v"]
    assert (info["generation"], info["metadata"], info["state"]) == (2, {"v": 2}, "resident")


def test_slots_that_cannot_be_rebuilt_are_left_alone(rig, caplog):
    rig.start_engine()
    box = ControlMailbox.attach(str(rig.settings.mailbox))
    box.write(0, "odd", ANY_LAYER, exact_vector(H, seed=1), gen=3)
    box.write(1, "odd", 2, exact_vector(H, seed=2), gen=3)
    box.close()
    with caplog.at_level(logging.WARNING, logger="hotwire.control_api"):
        rig.start_api()
        time.sleep(5 * RECONCILE_PERIOD_S)
    assert "odd" not in rig.catalog()
    assert [rig.engine.box.directory["state"][s] for s in (0, 1)] == [ACTIVE, ACTIVE]
    assert len(_messages(caplog, logging.WARNING, "left the engine's slots of odd alone")) == 1
