"""Reading a vector upload (control_api.api.uploads): JSON with base64 values or a multipart
safetensors file, in each float dtype; what is refused, with which code, and that a refusal
changes nothing (catalog and mailbox); how large and how many uploads are received at once.

Each test runs a real control API (uvicorn on 127.0.0.1) on a real engine mailbox. Bodies
from an attack run (docs/robustness.md) are among them: ids with a trailing newline, element
counts that overflow, JSON nested 100,000 deep, NaN in metadata, large uploads that stalled
the event loop.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import numpy as np
import pytest

from hotwire.control_api.api.http_errors import ApiError
from hotwire.control_api.api.uploads import MAX_CONCURRENT_UPLOADS, UploadGate
from hotwire.shared.mailbox import ANY_LAYER

from control_harness import (FP, ApiProcess, EnginePump, Rig, assert_error, exact_vector, json_body,
                             safetensors_blob, wait_until)

H = FP.hidden
NEWLINE_ID = "c" * 64 + "\n"
LEGAL_ID = "c" * 64


@pytest.fixture
def roomy(tmp_path):
    """A control API whose upload limit leaves room for the 100,000-deep bodies."""
    with Rig.running(tmp_path, max_upload_bytes=4 * 2**20) as rig:
        yield rig


# Encodings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code,dtype", [("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16")])
def test_multipart_safetensors_in_each_float_dtype(rig, code, dtype):
    vector = exact_vector(FP.n_layers, H, seed=3)
    r = rig.upload(f"st_{dtype}", safetensors_blob({"steer": (code, vector)}))
    assert r.status_code == 201, r.text
    assert r.json()["dtype"] == dtype
    entries = rig.engine.entries(f"st_{dtype}")
    assert sorted(entries) == list(range(FP.n_layers))
    for layer, (_, _, row) in entries.items():
        np.testing.assert_array_equal(row, vector[layer])


def test_multipart_key_picks_one_tensor_of_several(rig):
    a, b = exact_vector(H, seed=4), exact_vector(H, seed=5)
    blob = safetensors_blob({"a": ("F32", a), "b": ("F32", b)})
    r = rig.upload("two", blob)
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_shape"
    r = rig.upload("two", blob, key="b")
    assert r.status_code == 201, r.text
    np.testing.assert_array_equal(rig.engine.entries("two")[ANY_LAYER][2], b)


@pytest.mark.parametrize("metadata", ["", "  "])
def test_an_empty_multipart_metadata_field_means_no_metadata(rig, metadata):
    r = rig.upload("plain", safetensors_blob({"v": ("F32", exact_vector(H))}),
                    metadata=metadata)
    assert r.status_code == 201, r.text
    assert r.json()["metadata"] == {}


# Refusals, and nothing changes -------------------------------------------------------------


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


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_upload_is_refused_and_changes_nothing(rig, case):
    assert rig.push("keep", exact_vector(H)).status_code == 201
    before = rig.state()
    body, status, code = BAD_JSON[case]
    r = rig.http.post("/steer/vectors", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert r.json()["error"]["message"]
    assert rig.state() == before


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
    before = rig.state()
    blob, fields, status, code = BAD_FILES[case]
    r = rig.upload("v", blob, **fields)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert rig.state() == before


def test_other_content_types_are_refused(rig):
    r = rig.http.post("/steer/vectors", content=b"abc", headers={"content-type": "text/plain"})
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
    assert rig.catalog() == {}


# Ids are matched whole ---------------------------------------------------------------------


def test_an_id_with_a_trailing_newline_is_refused_by_every_upload(rig):
    assert rig.push(LEGAL_ID, exact_vector(H)).status_code == 201
    before = rig.state()
    assert_error(rig.push(NEWLINE_ID, exact_vector(H), replace=True), 422, "bad_id")
    blob = safetensors_blob({"v": ("F32", exact_vector(H))})
    assert_error(rig.upload(NEWLINE_ID, blob, replace="true"), 422, "bad_id")
    assert rig.state() == before


# Bodies that must be a 4xx, not a crash ----------------------------------------------------


DEEP = 100_000


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**31, 2**33], [2**62, 2**62]])
def test_a_shape_whose_element_count_overflows_is_a_422(rig, shape):
    before = rig.state()
    for data in ("", base64.b64encode(b"\0" * 8).decode()):
        body = {"id": "huge", "data": data, "dtype": "float32", "shape": shape}
        assert_error(rig.http.post("/steer/vectors", json=body), 422, "bad_shape")
    assert rig.state() == before


@pytest.mark.parametrize("field,text,code", [
    ("metadata", '{"a":' * DEEP + "1" + "}" * DEEP, "invalid_request"),
    ("metadata", "[" * DEEP + "]" * DEEP, "invalid_request"),
    ("layers", "[" * DEEP + "]" * DEEP, "bad_layers"),
    # Within what json.loads parses, past what the response can serialise: refused up front, or
    # every later listing of the catalog would fail.
    ("metadata", '{"a":' * 300 + "1" + "}" * 300, "invalid_request"),
])
def test_deeply_nested_multipart_fields_are_a_422(roomy, field, text, code):
    before = roomy.state()
    blob = safetensors_blob({"v": ("F32", exact_vector(FP.n_layers, H))})
    assert_error(roomy.upload("deep", blob, **{field: text}), 422, code)
    assert roomy.state() == before


@pytest.mark.parametrize("depth", [40, 300, DEEP])
def test_deeply_nested_json_metadata_is_a_422(roomy, depth):
    before = roomy.state()
    body = json.dumps(json_body("deep", exact_vector(H)))[:-1] + ', "metadata": ' + \
        '{"a":' * depth + "1" + "}" * depth + "}"
    r = roomy.http.post("/steer/vectors", content=body, headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")
    assert roomy.state() == before


def test_metadata_nested_to_the_limit_is_stored_and_served(rig):
    metadata: dict = {"leaf": 1.5}
    for _ in range(31):
        metadata = {"n": metadata}
    assert rig.push("nested", exact_vector(H), metadata=metadata).status_code == 201
    assert rig.catalog()["nested"]["metadata"] == metadata


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_metadata_are_refused(rig, value):
    before = rig.state()
    text = '{"nested": {"list": [1, %s]}}' % value
    body = json.dumps(json_body("nan", exact_vector(H)))[:-1] + ', "metadata": ' + text + "}"
    r = rig.http.post("/steer/vectors", content=body, headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")
    assert "metadata" in r.json()["error"]["message"]
    blob = safetensors_blob({"v": ("F32", exact_vector(H))})
    assert_error(rig.upload("nan", blob, metadata=text), 422, "invalid_request")
    assert rig.state() == before


# Decoded off the event loop, a bounded number at once --------------------------------------


def test_the_event_loop_keeps_answering_while_a_large_upload_is_decoded(tmp_path):
    """/healthz is polled back to back while a 60 MiB JSON upload is decoded. Decoded on the
    event loop, the largest gap between two answers spans nearly the whole decode; off it, a
    small part. The bound is relative to the decode's own time, so a slow machine is slow at
    both."""
    engine = EnginePump(tmp_path / "engine.mbx")
    (tmp_path / "state").mkdir()
    api = ApiProcess(tmp_path / "engine.mbx", tmp_path / "state")
    values = np.random.default_rng(0).random(11 * 2**20, dtype=np.float32)  # 44 MiB, 59 MiB base64
    body = json.dumps({"id": "big", "data": base64.b64encode(values.tobytes()).decode(),
                       "dtype": "float32", "shape": [values.size]}).encode()
    sent: list[float] = []

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 2**20):
            yield body[start:start + 2**20]
        sent.append(time.perf_counter())

    answers: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=api.url, timeout=60) as client:
            while not stop.is_set():
                assert client.get("/healthz").status_code == 200
                answers.append(time.perf_counter())

    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        wait_until(lambda: len(answers) > 5, what="healthz answers")
        r = api.http.post("/steer/vectors", content=chunks(),
                          headers={"content-type": "application/json"})
        done = time.perf_counter()
    finally:
        stop.set()
        poller.join(60)
        api.stop()
        engine.stop()
    assert_error(r, 422, "bad_shape")  # decoded in full, then checked against the model
    times = [sent[0], *(t for t in answers if sent[0] < t < done), done]
    gap = max(b - a for a, b in zip(times, times[1:]))
    assert gap < 0.5 * (done - sent[0]), (f"healthz went unanswered for {gap:.3f}s of the "
                                          f"{done - sent[0]:.3f}s the upload took after its body")


def _held_upload(http: httpx.Client, vector_id: str, release: threading.Event,
                 results: dict[str, httpx.Response]) -> threading.Thread:
    """An upload whose body stops halfway until ``release`` is set."""
    body = json.dumps(json_body(vector_id, exact_vector(H))).encode()

    def chunks() -> Iterator[bytes]:
        yield body[:10]
        release.wait(30)
        yield body[10:]

    def send() -> None:
        results[vector_id] = http.post("/steer/vectors", content=chunks(),
                                       headers={"content-type": "application/json"})

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_uploads_beyond_the_cap_wait_for_a_turn(rig):
    gate: UploadGate = rig.services().uploads
    assert gate.limit == MAX_CONCURRENT_UPLOADS == 2
    results: dict[str, httpx.Response] = {}
    releases = {vector_id: threading.Event() for vector_id in ("held1", "held2")}
    held = {vector_id: _held_upload(rig.http, vector_id, release, results)
            for vector_id, release in releases.items()}
    wait_until(lambda: gate.busy == 2, what="two uploads receiving")
    third = threading.Thread(target=lambda: results.update(third=rig.push("third", exact_vector(H))),
                             daemon=True)
    third.start()
    third.join(1.0)
    assert third.is_alive() and "third" not in results, "a third upload was received at once"
    assert rig.http.get("/steer/vectors").status_code == 200  # reads do not wait
    releases["held1"].set()
    third.join(10)
    assert results["third"].status_code == 201, results["third"].text
    assert held["held2"].is_alive()
    releases["held2"].set()
    for thread in held.values():
        thread.join(10)
    assert [results[v].status_code for v in ("held1", "held2")] == [201, 201]
    assert gate.busy == 0


def test_an_upload_that_waits_too_long_for_its_turn_is_a_503():
    async def main() -> None:
        gate = UploadGate(limit=1, wait_s=0.1)
        async with gate.turn():
            with pytest.raises(ApiError) as err:
                async with gate.turn():
                    pass
        assert (err.value.status, err.value.code) == (503, "busy")
        assert err.value.headers == {"Retry-After": "5"}
        async with gate.turn():
            assert gate.busy == 1

    anyio.run(main)
