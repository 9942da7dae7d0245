"""Control API hardening (issue 12, items 5-8): inputs from an attack run, each against a real
control API and a real engine mailbox.

Ids with a trailing newline on every id-bearing path; bodies that used to end in a plain-text
500 (an element count that overflows, JSON nested 100,000 deep, a full disk); large uploads that
stalled the event loop, and how many are received at once; NaN in metadata, OPTIONS, an empty
multipart field, read auth and the default bind.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from hotwire.control_api.api.http_errors import ApiError, install_error_handlers
from hotwire.control_api.api.settings import Settings
from hotwire.control_api.api.uploads import MAX_CONCURRENT_UPLOADS, UploadGate
from hotwire.shared.wire import ModelShape

from control_harness import FP, TOKEN, EnginePump, Rig, exact_vector, free_port, json_body, \
    safetensors_blob, wait_until

H = FP.hidden
NEWLINE_ID = "c" * 64 + "\n"
LEGAL_ID = "c" * 64


@pytest.fixture
def rig(tmp_path):
    with Rig.running(tmp_path, max_upload_bytes=4 * 2**20) as rig:  # room for the 100,000-deep bodies
        yield rig


def upload_file(http: httpx.Client, vector_id: str, blob: bytes, **fields: str) -> httpx.Response:
    return http.post("/steer/vectors", data={"id": vector_id, **fields},
                     files={"file": ("v.safetensors", blob, "application/octet-stream")})


def state(rig: Rig) -> tuple[dict, list[int]]:
    """What a refused request must leave alone: the catalog and the mailbox directory."""
    return rig.catalog(), rig.engine.seqs()


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.headers["content-type"] == "application/json", response.text
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (status, code), response.text
    assert error["message"]


# Item 5: ids are matched whole ---------------------------------------------------------------


def test_an_id_with_a_trailing_newline_is_refused_by_every_upload(rig):
    assert rig.push(LEGAL_ID, exact_vector(H)).status_code == 201
    before = state(rig)
    assert_error(rig.push(NEWLINE_ID, exact_vector(H), replace=True), 422, "bad_id")
    blob = safetensors_blob({"v": ("F32", exact_vector(H))})
    assert_error(upload_file(rig.http, NEWLINE_ID, blob, replace="true"), 422, "bad_id")
    assert state(rig) == before


def test_an_id_with_a_trailing_newline_in_a_path_names_no_vector(rig):
    assert rig.push(LEGAL_ID, exact_vector(H)).status_code == 201
    before = state(rig)
    path = "/steer/vectors/" + LEGAL_ID + "%0A"
    for method in ("GET", "DELETE"):
        assert_error(rig.http.request(method, path), 422, "invalid_request")
    assert state(rig) == before
    assert rig.http.get("/steer/vectors/" + LEGAL_ID).status_code == 200


def test_startup_files_whose_stem_ends_in_a_newline_are_skipped(tmp_path, caplog):
    from hotwire.engine_plugin.startup import load_dir

    blob = safetensors_blob({"v": ("F32", exact_vector(H))})
    (tmp_path / "good.safetensors").write_bytes(blob)
    (tmp_path / f"{NEWLINE_ID}.safetensors").write_bytes(blob)
    with caplog.at_level(logging.ERROR, logger="vllm.hotwire"):
        loaded = load_dir(str(tmp_path), ModelShape(FP.n_layers, H, FP.dtype))
    assert [vector_id for vector_id, _ in loaded] == ["good"]
    assert "not a valid vector id" in caplog.text


# Item 6: every error is the JSON body, with a 4xx where the client is at fault ----------------

DEEP = 100_000


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**31, 2**33], [2**62, 2**62]])
def test_a_shape_whose_element_count_overflows_is_a_422(rig, shape):
    before = state(rig)
    for data in ("", base64.b64encode(b"\0" * 8).decode()):
        body = {"id": "huge", "data": data, "dtype": "float32", "shape": shape}
        assert_error(rig.http.post("/steer/vectors", json=body), 422, "bad_shape")
    assert state(rig) == before


@pytest.mark.parametrize("field,text,code", [
    ("metadata", '{"a":' * DEEP + "1" + "}" * DEEP, "invalid_request"),
    ("metadata", "[" * DEEP + "]" * DEEP, "invalid_request"),
    ("layers", "[" * DEEP + "]" * DEEP, "bad_layers"),
    # Within what json.loads parses, past what the response can serialise: refused up front, or
    # every later listing of the catalog would fail.
    ("metadata", '{"a":' * 300 + "1" + "}" * 300, "invalid_request"),
])
def test_deeply_nested_multipart_fields_are_a_422(rig, field, text, code):
    before = state(rig)
    blob = safetensors_blob({"v": ("F32", exact_vector(FP.n_layers, H))})
    assert_error(upload_file(rig.http, "deep", blob, **{field: text}), 422, code)
    assert state(rig) == before


@pytest.mark.parametrize("depth", [40, 300, DEEP])
def test_deeply_nested_json_metadata_is_a_422(rig, depth):
    before = state(rig)
    body = json.dumps(json_body("deep", exact_vector(H)))[:-1] + ', "metadata": ' + \
        '{"a":' * depth + "1" + "}" * depth + "}"
    r = rig.http.post("/steer/vectors", content=body, headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")
    assert state(rig) == before


def test_metadata_nested_to_the_limit_is_stored_and_served(rig):
    metadata: dict = {"leaf": 1.5}
    for _ in range(31):
        metadata = {"n": metadata}
    assert rig.push("nested", exact_vector(H), metadata=metadata).status_code == 201
    assert rig.catalog()["nested"]["metadata"] == metadata


def test_an_unhandled_exception_is_a_logged_500_with_the_error_body(caplog):
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    with caplog.at_level(logging.ERROR, logger="hotwire.control_api"), \
            TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert_error(r, 500, "internal_error")
    assert "a bug" not in r.text  # details stay in the log
    assert "GET /boom failed" in caplog.text and "RuntimeError: a bug" in caplog.text


class ApiProcess:
    """``hotwire control-api`` in a process of its own (optionally behind a command prefix,
    such as ``unshare``), attached to ``mailbox``."""

    def __init__(self, mailbox: Path, state_dir: Path, prefix: list[str] = (), **env: str):
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [*prefix, sys.executable, "-m", "hotwire.control_api.cli", "control-api",
                   "--port", self.url.rsplit(":", 1)[1], "--mailbox", str(mailbox),
                   "--state-dir", str(state_dir), "--log-level", "warning"]
        self.log = state_dir.parent / "control-api.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(command, env={**os.environ, "HOTWIRE_TOKEN": TOKEN, **env},
                                         stdout=log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=self.url, timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        wait_until(self._up, timeout=30, what="control API process")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"control API exited: {self.log.read_text()}")
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> str:
        self.http.close()
        self.proc.terminate()
        self.proc.wait(10)
        return self.log.read_text()


def _private_tmpfs_prefix(tmp_path: Path) -> Callable[[Path], list[str]]:
    """A command prefix that runs a program with a 1 MiB tmpfs mounted over its argument 0's
    directory in a mount namespace of its own; skips where mounting is not permitted."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    probe = tmp_path / "probe"
    probe.mkdir()
    mount = 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"'
    tried = subprocess.run([*unshare, "sh", "-c", mount, str(probe), "true"], capture_output=True)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {tried.stderr.decode().strip()}")
    return lambda directory: [*unshare, "sh", "-c", mount, str(directory)]


def test_a_full_disk_is_a_507_and_changes_nothing(tmp_path):
    """The catalog on a real 1 MiB filesystem that fills up (SQLite reports SQLITE_FULL)."""
    prefix = _private_tmpfs_prefix(tmp_path)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    engine = EnginePump(tmp_path / "engine.mbx", n_slots=64)
    api = ApiProcess(tmp_path / "engine.mbx", state_dir, prefix(state_dir))
    try:
        padding = {"notes": "x" * 120_000}
        pushed = []
        for i in range(20):
            before = (api.http.get("/steer/vectors").json(), engine.seqs())
            r = api.http.post("/steer/vectors", json=json_body(f"v{i}", exact_vector(H), metadata=padding))
            if r.status_code != 201:
                break
            pushed.append(f"v{i}")
        else:
            pytest.fail("20 pushes of 120 kB fitted in 1 MiB")
        assert_error(r, 507, "disk_full")
        assert (api.http.get("/steer/vectors").json(), engine.seqs()) == before
        assert pushed and [v["id"] for v in before[0]["vectors"]] == pushed
        again = api.http.post("/steer/vectors", json=json_body("again", exact_vector(H),
                                                                metadata=padding))
        assert_error(again, 507, "disk_full")
        assert api.http.get("/healthz").status_code == 200
    finally:
        log = api.stop()
        engine.stop()
    assert "disk is full" in log


# Item 7: large uploads are decoded off the event loop, a bounded number at once ---------------


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
    gate: UploadGate = rig.server.server.config.app.state.services.uploads
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


# Item 8 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_metadata_are_refused(rig, value):
    before = state(rig)
    text = '{"nested": {"list": [1, %s]}}' % value
    body = json.dumps(json_body("nan", exact_vector(H)))[:-1] + ', "metadata": ' + text + "}"
    r = rig.http.post("/steer/vectors", content=body, headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")
    assert "metadata" in r.json()["error"]["message"]
    blob = safetensors_blob({"v": ("F32", exact_vector(H))})
    assert_error(upload_file(rig.http, "nan", blob, metadata=text), 422, "invalid_request")
    assert state(rig) == before


def test_options_and_405_name_every_method_of_the_path(rig):
    cases = {"/steer/vectors": "GET, OPTIONS, POST", "/steer/vectors/some_id": "DELETE, GET, OPTIONS",
             "/healthz": "GET, OPTIONS"}
    for path, allow in cases.items():
        r = rig.http.options(path)
        assert (r.status_code, r.headers["allow"]) == (204, allow)
        r = rig.http.put(path)
        assert_error(r, 405, "method_not_allowed")
        assert r.headers["allow"] == allow
    assert_error(rig.http.options("/steer/nothing"), 404, "not_found")


@pytest.mark.parametrize("metadata", ["", "  "])
def test_an_empty_multipart_metadata_field_means_no_metadata(rig, metadata):
    r = upload_file(rig.http, "plain", safetensors_blob({"v": ("F32", exact_vector(H))}),
                    metadata=metadata)
    assert r.status_code == 201, r.text
    assert r.json()["metadata"] == {}


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


def test_the_read_token_is_read_from_the_environment():
    settings = Settings.from_env({"HOTWIRE_READ_TOKEN": READ_TOKEN})
    assert settings.read_token.get_secret_value() == READ_TOKEN
    assert Settings.from_env({"HOTWIRE_READ_TOKEN": ""}).read_token is None


def test_the_control_api_listens_on_localhost_unless_told():
    assert Settings().host == "127.0.0.1"
    assert Settings.from_env({"HOTWIRE_HOST": "0.0.0.0"}).host == "0.0.0.0"
    help_text = " ".join(subprocess.run([sys.executable, "-m", "hotwire.control_api.cli",
                                         "control-api", "--help"], capture_output=True, text=True,
                                        check=True).stdout.split())
    assert "default 127.0.0.1" in help_text and "0.0.0.0" in help_text
    assert "HOTWIRE_READ_TOKEN" in help_text and "HOTWIRE_TOKEN" in help_text
