"""Invariant 7: restarts of either side, in any order, converge to the same registered set."""

from __future__ import annotations

import numpy as np
import pytest

from hotwire.shared.mailbox import ANY_LAYER, RETIRING, ControlMailbox

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

    # While no control API runs, the table drifts from the catalog: a leftover of some other
    # control API appears, and one of ours goes missing.
    box = ControlMailbox.attach(str(rig.settings.mailbox))
    free = [s for s in range(box.n_slots) if box.directory["state"][s] == 0]
    box.write(free[0], "ghost", ANY_LAYER, exact_vector(H, seed=3), gen=5)
    flat_slot = rig.engine.entries("flat")[ANY_LAYER][0]
    box.retire(flat_slot)
    box.close()
    kept = {layer: (slot, rig.engine.box.directory["seq"][slot])
            for layer, (slot, _, _) in rig.engine.entries("per_layer").items()}

    rig.start_api()
    after = rig.catalog()
    assert {k: (v["generation"], v["metadata"], v["pinned"]) for k, v in after.items()} == \
        {k: (v["generation"], v["metadata"], v["pinned"]) for k, v in before.items()}
    wait_until(lambda: rig.resident("flat"), what="flat pushed again")
    _assert_resident(rig, vectors)
    # Slots that matched the catalog were adopted as they were, not rewritten.
    assert {layer: (slot, rig.engine.box.directory["seq"][slot]) for layer, (slot, _, _)
            in rig.engine.entries("per_layer").items()} == kept
    assert rig.engine.box.directory["state"][free[0]] == RETIRING  # the ghost
    # Its generation is remembered: registering "ghost" now cannot reuse generation 5.
    assert rig.push("ghost", exact_vector(H)).json()["generation"] == 6


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
    rig.engine.box.set_armed(list(range(FP.n_layers)))
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
