"""``/steer/vectors`` (control_api.api.routers.vectors): list, get and delete, ids matched whole,
and the OpenAPI description of uploads.
"""

from __future__ import annotations

from hotwire.shared.mailbox import ANY_LAYER, RETIRING

from control_harness import FP, assert_error, exact_vector, wait_until

H = FP.hidden
LEGAL_ID = "c" * 64


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


def test_an_id_with_a_trailing_newline_in_a_path_names_no_vector(rig):
    assert rig.push(LEGAL_ID, exact_vector(H)).status_code == 201
    before = rig.state()
    path = "/steer/vectors/" + LEGAL_ID + "%0A"
    for method in ("GET", "DELETE"):
        assert_error(rig.http.request(method, path), 422, "invalid_request")
    assert rig.state() == before
    assert rig.http.get("/steer/vectors/" + LEGAL_ID).status_code == 200


def test_openapi_documents_both_upload_encodings(rig):
    spec = rig.http.get("/openapi.json").json()
    body = spec["paths"]["/steer/vectors"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert rig.http.get("/docs").status_code == 200
