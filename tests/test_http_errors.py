"""Every failure is the JSON error body (control_api.api.http_errors): unknown routes, methods a
path does not serve, a bug (500), storage that runs out under the catalog or another file (507).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from hotwire.control_api.api.http_errors import install_error_handlers

from control_harness import FP, ApiProcess, EnginePump, assert_error, exact_vector, json_body

H = FP.hidden


def test_unknown_route_gets_an_error_body(rig):
    r = rig.http.get("/steer/nothing")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")


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


def _file_size_limit_prefix(tmp_path: Path) -> Callable[[Path], list[str]]:
    """A command prefix that runs a program under ``ulimit -f 1024`` (1 MiB per file)."""
    if shutil.which("bash") is None:
        pytest.skip("needs bash for ulimit -f")
    return lambda directory: ["bash", "-c", 'ulimit -f 1024 && exec "$@"', "bash"]


STORAGE = {  # how the catalog's storage runs out -> the command prefix that makes it so
    "full tmpfs (SQLITE_FULL)": _private_tmpfs_prefix,
    "ulimit -f (EFBIG: SQLITE_IOERR, disk I/O error)": _file_size_limit_prefix,
}


@pytest.mark.parametrize("storage", STORAGE)
def test_storage_that_runs_out_is_a_507_and_changes_nothing(tmp_path, storage):
    """The catalog on real storage that runs out: a 1 MiB file system that fills up, or a file
    size limit of 1 MiB (writes past it fail with EFBIG, which SQLite reports as an I/O error)."""
    prefix = STORAGE[storage](tmp_path)
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
        assert_error(r, 507, "storage_full")
        message = r.json()["error"]["message"]
        assert str(state_dir) in message and "nothing was changed" in message
        assert (api.http.get("/steer/vectors").json(), engine.seqs()) == before
        assert pushed and [v["id"] for v in before[0]["vectors"]] == pushed
        again = api.http.post("/steer/vectors", json=json_body("again", exact_vector(H),
                                                                metadata=padding))
        assert_error(again, 507, "storage_full")
        assert api.http.get("/healthz").status_code == 200
    finally:
        log = api.stop()
        engine.stop()
    assert "failed for want of storage" in log and "Traceback" not in log


def test_a_file_write_refused_for_want_of_space_is_a_507(caplog):
    """Out of space outside the catalog (a file the file system would not let grow): 507, the
    file named, and no traceback."""
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/write")
    async def write() -> None:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), "/dev/shm/hotwire/engine.mbx")

    with caplog.at_level(logging.ERROR, logger="hotwire.control_api"), \
            TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/write")
    assert_error(r, 507, "storage_full")
    assert "/dev/shm/hotwire/engine.mbx" in r.json()["error"]["message"]
    assert "Traceback" not in caplog.text
