"""The bearer tokens (control_api.api.auth): ``HOTWIRE_TOKEN`` guards writes, and reads when
``HOTWIRE_READ_TOKEN`` is set; the probes stay open.
"""

from __future__ import annotations

import httpx
from pydantic import SecretStr

from control_harness import FP, TOKEN, Rig, assert_error, exact_vector, json_body

H = FP.hidden
VECTOR = exact_vector(H)


def test_writes_need_the_bearer_token_reads_do_not(rig):
    body = json_body("v", VECTOR)
    with httpx.Client(base_url=rig.server.url) as anonymous:
        r = anonymous.post("/steer/vectors", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        r = anonymous.post("/steer/vectors", json=body, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
        assert anonymous.get("/steer/vectors").status_code == 200
        assert rig.catalog() == {}
        assert rig.push("v", VECTOR).status_code == 201
        assert anonymous.delete("/steer/vectors/v").status_code == 401
        assert list(rig.catalog()) == ["v"]


def test_writes_are_open_without_a_token(tmp_path):
    rig = Rig(tmp_path, token=None)
    rig.start_engine()
    rig.start_api()
    try:
        with httpx.Client(base_url=rig.server.url) as anonymous:
            assert anonymous.post("/steer/vectors", json=json_body("v", VECTOR)).status_code == 201
    finally:
        rig.stop()


READ_TOKEN = "r3ad-only"


def test_reads_need_the_read_or_write_token_when_a_read_token_is_set(tmp_path):
    rig = Rig(tmp_path, read_token=SecretStr(READ_TOKEN))
    rig.start_engine()
    rig.start_api()
    try:
        assert rig.push("v", exact_vector(H)).status_code == 201
        reads = ["/steer/vectors", "/steer/vectors/v", "/steer/slots", "/metrics"]
        with httpx.Client(base_url=rig.server.url) as anonymous:
            for path in reads:
                r = anonymous.get(path)
                assert_error(r, 401, "unauthorized")
                assert r.headers["www-authenticate"] == "Bearer"
                assert anonymous.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
                for token in (READ_TOKEN, TOKEN):
                    assert anonymous.get(path, headers={"Authorization": f"Bearer {token}"}
                                         ).status_code == 200, (path, token)
            for probe in ("/healthz", "/readyz"):
                assert anonymous.get(probe).status_code == 200
            reader = {"Authorization": f"Bearer {READ_TOKEN}"}
            r = anonymous.post("/steer/vectors", json=json_body("w", exact_vector(H)), headers=reader)
            assert_error(r, 401, "unauthorized")
            assert_error(anonymous.delete("/steer/vectors/v", headers=reader), 401, "unauthorized")
        assert list(rig.catalog()) == ["v"]
    finally:
        rig.stop()
