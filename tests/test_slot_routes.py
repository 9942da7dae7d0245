"""``/steer/slots`` (control_api.api.routers.slots): the engine's slot table as its mailbox shows
it, startup vectors included (and left alone).
"""

from __future__ import annotations

import time

import numpy as np

from hotwire.shared.mailbox import ACTIVE, ANY_LAYER

from control_harness import FP, exact_vector, wait_until

H = FP.hidden


def test_slot_table_shows_engine_and_slots(rig):
    assert rig.push("p", exact_vector(H), pin=True).status_code == 201
    wait_until(lambda: rig.engine.bound)
    slots = rig.engine.hold("p")
    table = rig.http.get("/steer/slots").json()
    engine = table["engine"]
    assert (engine["model"], engine["hidden"], engine["n_layers"]) == (FP.model, FP.hidden, FP.n_layers)
    assert engine["epoch"] == f"{rig.engine.box.epoch:x}"
    assert engine["armed_layers"] == [0, 1, 2, 3]
    assert engine["target_generation"] == int(rig.engine.box.header["target_gen"])
    assert (table["n_slots"], table["used"]) == (rig.engine.n_slots, 1)
    [entry] = table["slots"]
    assert (entry["slot"], entry["vector_id"], entry["layer"], entry["state"]) == \
        (slots[0], "p", None, "active")
    assert (entry["inflight"], entry["pinned"], entry["startup"]) == (1, True, False)
    assert entry["last_used"] is not None


def test_startup_vectors_are_listed_and_left_alone(rig):
    row = exact_vector(H, seed=30)
    rig.engine.box.publish_startup(7, "boot", ANY_LAYER, row)
    table = rig.http.get("/steer/slots").json()
    assert [(s["slot"], s["startup"]) for s in table["slots"] if s["vector_id"] == "boot"] == [(7, True)]
    r = rig.push("boot", exact_vector(H))
    assert (r.status_code, r.json()["error"]["code"]) == (409, "startup_vector")
    assert rig.http.delete("/steer/vectors/boot").json()["error"]["code"] == "startup_vector"
    time.sleep(0.3)  # a reconcile pass or two
    assert rig.engine.box.directory["state"][7] == ACTIVE
    np.testing.assert_array_equal(rig.engine.box.row(7), row)
