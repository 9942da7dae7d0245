"""Control API against a real mailbox: registration, validation, replace, eviction, probes.

Each test runs a real control API (uvicorn on 127.0.0.1) and an engine pump on a real mailbox
file; assertions read the rows back out of the mailbox the engine would apply.
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hotwire.shared.mailbox import ACTIVE, ANY_LAYER, RETIRING

from control_harness import FP, Rig, exact_vector, json_body, safetensors_blob, wait_until

H = FP.hidden


@pytest.fixture
def rig(tmp_path):
    with Rig.running(tmp_path) as rig:
        yield rig


def upload_file(rig: Rig, vector_id: str, blob: bytes, **fields) -> httpx.Response:
    data = {"id": vector_id, **{k: str(v) for k, v in fields.items()}}
    return rig.http.post("/steer/vectors", data=data,
                         files={"file": ("v.safetensors", blob, "application/octet-stream")})


# Registration ------------------------------------------------------------------------------


def test_json_upload_of_per_layer_vector_fills_one_slot_per_armed_layer(rig):
    vector = exact_vector(FP.n_layers, H, seed=1)
    r = rig.push("per_layer", vector, metadata={"source": "test"})
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["generation"], info["shape"], info["dtype"]) == (1, [FP.n_layers, H], "float32")
    assert info["resident"] and info["state"] == "resident"
    assert info["metadata"] == {"source": "test"} and info["layers"] is None

    entries = rig.engine.entries("per_layer")
    assert sorted(entries) == list(range(FP.n_layers))
    for layer, (_, gen, row) in entries.items():
        assert gen == 1
        np.testing.assert_array_equal(row, vector[layer])
    assert sorted((s["slot"], s["layer"]) for s in info["slots"]) == \
        sorted((slot, layer) for layer, (slot, _, _) in entries.items())


def test_one_dim_vector_takes_a_single_any_layer_slot(rig):
    vector = exact_vector(H, seed=2)
    r = rig.push("anywhere", vector)
    assert r.status_code == 201, r.text
    entries = rig.engine.entries("anywhere")
    assert list(entries) == [ANY_LAYER]
    np.testing.assert_array_equal(entries[ANY_LAYER][2], vector)
    assert [s["layer"] for s in r.json()["slots"]] == [None]


@pytest.mark.parametrize("code,dtype", [("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16")])
def test_multipart_safetensors_in_each_float_dtype(rig, code, dtype):
    vector = exact_vector(FP.n_layers, H, seed=3)
    r = upload_file(rig, f"st_{dtype}", safetensors_blob({"steer": (code, vector)}))
    assert r.status_code == 201, r.text
    assert r.json()["dtype"] == dtype
    entries = rig.engine.entries(f"st_{dtype}")
    assert sorted(entries) == list(range(FP.n_layers))
    for layer, (_, _, row) in entries.items():
        np.testing.assert_array_equal(row, vector[layer])


def test_multipart_key_picks_one_tensor_of_several(rig):
    a, b = exact_vector(H, seed=4), exact_vector(H, seed=5)
    blob = safetensors_blob({"a": ("F32", a), "b": ("F32", b)})
    r = upload_file(rig, "two", blob)
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_shape"
    r = upload_file(rig, "two", blob, key="b")
    assert r.status_code == 201, r.text
    np.testing.assert_array_equal(rig.engine.entries("two")[ANY_LAYER][2], b)


@pytest.mark.parametrize("layers_field", ["[1, 3]", "3,1"])
def test_layers_subset_materialises_only_those_rows(rig, layers_field):
    vector = exact_vector(FP.n_layers, H, seed=6)
    r = upload_file(rig, "subset", safetensors_blob({"v": ("F32", vector)}), layers=layers_field)
    assert r.status_code == 201, r.text
    assert r.json()["layers"] == [1, 3]
    entries = rig.engine.entries("subset")
    assert sorted(entries) == [1, 3]
    for layer in (1, 3):
        np.testing.assert_array_equal(entries[layer][2], vector[layer])


def test_default_layers_follow_what_the_engine_armed(tmp_path):
    rig = Rig(tmp_path)
    rig.start_engine(armed=(0, 2))
    rig.start_api()
    try:
        vector = exact_vector(FP.n_layers, H, seed=7)
        assert rig.push("armed_only", vector).status_code == 201
        assert sorted(rig.engine.entries("armed_only")) == [0, 2]
        r = rig.push("unarmed", vector, layers=[1])
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_layers"
        assert "not armed" in r.json()["error"]["message"]
    finally:
        rig.stop()


def test_list_get_and_delete(rig):
    for name in ("b_vec", "a_vec"):
        assert rig.push(name, exact_vector(H)).status_code == 201
    listing = rig.http.get("/steer/vectors").json()["vectors"]
    assert [v["id"] for v in listing] == ["a_vec", "b_vec"]
    assert rig.http.get("/steer/vectors/a_vec").json()["id"] == "a_vec"

    slot = rig.engine.entries("a_vec")[ANY_LAYER][0]
    r = rig.http.delete("/steer/vectors/a_vec")
    assert r.status_code == 204
    assert rig.engine.box.directory["state"][slot] == RETIRING
    assert rig.http.get("/steer/vectors/a_vec").status_code == 404
    assert rig.http.delete("/steer/vectors/a_vec").json()["error"]["code"] == "not_found"
    assert list(rig.catalog()) == ["b_vec"]
    # The engine acks the retirement; the slot is then reused by the next upload.
    wait_until(lambda: rig.engine.box.engine["applied_seq"][slot] == rig.engine.box.directory["seq"][slot])
    assert rig.push("c_vec", exact_vector(H)).status_code == 201
    assert rig.engine.entries("c_vec")[ANY_LAYER][0] == slot


def test_pinned_vector_can_be_deleted_explicitly(rig):
    assert rig.push("pinned", exact_vector(H), pin=True).json()["pinned"] is True
    assert rig.http.delete("/steer/vectors/pinned").status_code == 204
    assert rig.engine.entries("pinned") == {}


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


# Validation --------------------------------------------------------------------------------

BAD = exact_vector(H)


def _with(values: np.ndarray, index: int, value: float) -> np.ndarray:
    values = values.copy()
    values[index] = value
    return values


BAD_JSON = {
    "nan": (json_body("v", _with(BAD, 3, np.nan)), 422, "not_finite"),
    "inf": (json_body("v", _with(BAD, 0, -np.inf)), 422, "not_finite"),
    "bf16_overflow": (json_body("v", _with(BAD, 0, 3.4e38)), 422, "not_finite"),
    "wrong_hidden": (json_body("v", exact_vector(H + 1)), 422, "bad_shape"),
    "wrong_layers": (json_body("v", exact_vector(FP.n_layers + 1, H)), 422, "bad_shape"),
    "int32": ({**json_body("v", BAD), "dtype": "int32"}, 422, "bad_dtype"),
    "bad_id": (json_body("bad id!", BAD), 422, "bad_id"),
    "truncated_base64": ({**json_body("v", BAD), "data": json_body("v", BAD)["data"][:-3]},
                         422, "bad_encoding"),
    "short_data": ({**json_body("v", BAD), "shape": [H + 4]}, 422, "bad_shape"),
    "unknown_layer": (json_body("v", exact_vector(FP.n_layers, H), layers=[FP.n_layers]),
                      422, "bad_layers"),
    "layers_on_1d": (json_body("v", BAD, layers=[0]), 422, "bad_layers"),
    "unknown_field": ({**json_body("v", BAD), "layer": 3}, 422, "invalid_request"),
    "missing_data": ({"id": "v", "dtype": "float32", "shape": [H]}, 422, "invalid_request"),
    "oversize": (json_body("v", exact_vector(FP.n_layers, 4096)), 413, "too_large"),
}


def _state(rig: Rig) -> tuple[dict, list[int]]:
    return rig.catalog(), rig.engine.seqs()


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_upload_is_refused_and_changes_nothing(rig, case):
    assert rig.push("keep", exact_vector(H)).status_code == 201
    before = _state(rig)
    body, status, code = BAD_JSON[case]
    r = rig.http.post("/steer/vectors", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert r.json()["error"]["message"]
    assert _state(rig) == before


BAD_FILES = {
    "not_safetensors": (b"this is not a safetensors file at all", {}, 422, "bad_encoding"),
    "int32_tensor": (safetensors_blob({"v": ("I32", BAD)}), {}, 422, "bad_dtype"),
    "nan_tensor": (safetensors_blob({"v": ("F16", _with(BAD, 1, np.nan))}), {}, 422, "not_finite"),
    "missing_key": (safetensors_blob({"v": ("F32", BAD)}), {"key": "w"}, 422, "bad_shape"),
    "bad_layers": (safetensors_blob({"v": ("F32", exact_vector(FP.n_layers, H))}),
                   {"layers": "0,x"}, 422, "bad_layers"),
    "bad_metadata": (safetensors_blob({"v": ("F32", BAD)}), {"metadata": "[1]"}, 422,
                     "invalid_request"),
    "bad_pin": (safetensors_blob({"v": ("F32", BAD)}), {"pin": "maybe"}, 422, "invalid_request"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_upload_is_refused_and_changes_nothing(rig, case):
    assert rig.push("keep", exact_vector(H)).status_code == 201
    before = _state(rig)
    blob, fields, status, code = BAD_FILES[case]
    r = upload_file(rig, "v", blob, **fields)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert _state(rig) == before


def test_other_content_types_are_refused(rig):
    r = rig.http.post("/steer/vectors", content=b"abc", headers={"content-type": "text/plain"})
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
    assert rig.catalog() == {}


def test_writes_need_the_bearer_token_reads_do_not(rig):
    body = json_body("v", BAD)
    with httpx.Client(base_url=rig.server.url) as anonymous:
        r = anonymous.post("/steer/vectors", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        r = anonymous.post("/steer/vectors", json=body, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
        assert anonymous.get("/steer/vectors").status_code == 200
        assert rig.catalog() == {}
        assert rig.push("v", BAD).status_code == 201
        assert anonymous.delete("/steer/vectors/v").status_code == 401
        assert list(rig.catalog()) == ["v"]


def test_writes_are_open_without_a_token(tmp_path):
    rig = Rig(tmp_path, token=None)
    rig.start_engine()
    rig.start_api()
    try:
        with httpx.Client(base_url=rig.server.url) as anonymous:
            assert anonymous.post("/steer/vectors", json=json_body("v", BAD)).status_code == 201
    finally:
        rig.stop()


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
    before = _state(small)
    r = small.push("newcomer", exact_vector(H))
    assert (r.status_code, r.json()["error"]["code"]) == (507, "no_space")
    assert "pinned" in r.json()["error"]["message"]
    assert _state(small) == before


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


# Probes and metrics ------------------------------------------------------------------------


def test_readyz_fails_on_a_stale_heartbeat(rig):
    assert rig.http.get("/readyz").status_code == 200
    assert rig.http.get("/healthz").json() == {"status": "ok"}
    rig.engine.paused.set()
    rig.engine.box.beat(at_ns=time.time_ns() - 60 * 10**9)
    r = rig.http.get("/readyz")
    assert r.status_code == 503 and "heartbeat" in r.json()["reason"]
    assert rig.http.get("/healthz").status_code == 200
    rig.engine.paused.clear()
    wait_until(lambda: rig.http.get("/readyz").status_code == 200, what="ready again")


def test_readyz_fails_when_the_engine_stops_applying(tmp_path):
    rig = Rig(tmp_path, heartbeat_timeout_s=0.5)
    rig.start_engine()
    rig.start_api()
    rig.engine.paused.set()  # from here the engine beats (below) but runs no step
    stop_beating = threading.Event()

    def beat_only():
        while not stop_beating.wait(0.05):
            rig.engine.box.beat()

    beater = threading.Thread(target=beat_only)
    beater.start()
    try:
        # A fresh engine applies at its first step: waiting for that is not "out of sync".
        assert rig.push("early", exact_vector(H)).status_code == 201
        time.sleep(1.0)
        assert rig.http.get("/readyz").status_code == 200
        rig.engine.step()
        assert rig.push("late", exact_vector(H)).status_code == 201
        r = wait_until(lambda: (x := rig.http.get("/readyz")).status_code == 503 and x)
        assert "not applied" in r.json()["reason"]
        stop_beating.set()
        beater.join()
        rig.engine.paused.clear()
        wait_until(lambda: rig.http.get("/readyz").status_code == 200)
    finally:
        stop_beating.set()
        rig.stop()


def _metrics(rig: Rig) -> dict[tuple[str, tuple], float]:
    text = rig.http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_expose_catalog_slots_engine_counters_and_uploads(rig):
    assert rig.push("m1", exact_vector(FP.n_layers, H)).status_code == 201
    assert rig.push("m2", exact_vector(H)).status_code == 201
    assert rig.push("m2", exact_vector(H)).status_code == 409
    rig.engine.box.add_counter("unsteered_unknown_id", 3)
    rig.engine.box.add_counter("steered_requests", 7)
    rig.engine.box.set_counter("steps", 40)
    rig.engine.box.set_counter("host_ns", 2_500_000_000)
    for name, ns in (("host_ns_core", 1_000_000_000), ("host_ns_schedule", 500_000_000),
                     ("host_ns_batch", 1_000_000_000), ("host_ns_changed", 2_000_000_000),
                     ("heartbeat_ns", 250_000_000)):
        rig.engine.box.set_counter(name, ns)
    rig.engine.box.set_counter("steps_changed", 4)
    rig.engine.box.flush_counters()  # as the engine's step or heartbeat does
    m = _metrics(rig)
    RANK0 = (("dp_rank", "0"),)  # engine metrics are per data-parallel rank
    assert m[("hotwire_catalog_vectors", ())] == 2
    assert m[("hotwire_resident_vectors", RANK0)] == 2
    assert m[("hotwire_slots_used", RANK0)] == FP.n_layers + 1
    assert m[("hotwire_slots_capacity", RANK0)] == rig.engine.n_slots
    unsteered = "hotwire_engine_unsteered_requests_total"
    assert m[(unsteered, (*RANK0, ("reason", "unknown_id")))] == 3
    assert m[(unsteered, (*RANK0, ("reason", "malformed")))] == 0
    assert m[("hotwire_engine_steered_requests_total", RANK0)] == 7
    assert m[("hotwire_engine_steps_total", RANK0)] == 40
    assert m[("hotwire_engine_host_seconds_total", RANK0)] == 2.5
    hook = "hotwire_engine_hook_host_seconds_total"
    assert [m[(hook, (*RANK0, ("hook", h)))] for h in ("core", "schedule", "batch")] == [1.0, 0.5, 1.0]
    assert m[("hotwire_engine_changed_steps_total", RANK0)] == 4
    assert m[("hotwire_engine_changed_host_seconds_total", RANK0)] == 2.0
    assert m[("hotwire_engine_heartbeat_cpu_seconds_total", RANK0)] == 0.25
    assert m[("hotwire_uploads_total", (("code", "201"),))] == 2
    assert m[("hotwire_uploads_total", (("code", "409"),))] == 1
    assert 0 <= m[("hotwire_engine_heartbeat_age_seconds", RANK0)] < 3
    # The engine applies rows on its own clock: the counter must reach every row pushed.
    rows = ("hotwire_engine_mailbox_rows_applied_total", RANK0)
    wait_until(lambda: _metrics(rig)[rows] >= FP.n_layers + 1, what="engine rows applied in /metrics")


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


def test_openapi_documents_both_upload_encodings(rig):
    spec = rig.http.get("/openapi.json").json()
    body = spec["paths"]["/steer/vectors"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert rig.http.get("/docs").status_code == 200


def test_unknown_route_gets_an_error_body(rig):
    r = rig.http.get("/steer/nothing")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
