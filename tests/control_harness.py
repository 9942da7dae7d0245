"""Harness for the control API tests: a real engine mailbox, driven the way the engine drives
it, and real control API servers over HTTP.

No mocks: :class:`EnginePump` owns a real :class:`EngineMailbox` and does between steps what the
engine plugin does (apply and ack pending entries, publish per-slot references, beat), on a
thread that the test can pause. Tests decide which vectors running requests hold.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from hotwire.control_api.api.app import create_app
from hotwire.control_api.api.dependencies import Services
from hotwire.control_api.api.settings import Settings
from hotwire.shared.mailbox import ACTIVE, EngineMailbox, Fingerprint

FP = Fingerprint("test/tiny-model", n_layers=4, hidden=16, dtype="bfloat16")
TOKEN = "s3cret-token"


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class _Pause(threading.Event):
    """Set: the pump runs no step from the moment ``set()`` returns (one under way finishes
    first), so a test that then writes the engine's side (a stale heartbeat) is not overwritten."""

    def __init__(self, lock: threading.RLock):
        super().__init__()
        self._step = lock

    def set(self) -> None:
        super().set()
        with self._step:
            pass


class EnginePump:
    """The engine's side of one mailbox: what the plugin does at every step boundary."""

    def __init__(self, path: Path, n_slots: int = 8, fp: Fingerprint = FP,
                 armed: tuple[int, ...] | None = None):
        self.path, self.n_slots, self.fp = path, n_slots, fp
        self.armed = tuple(range(fp.n_layers)) if armed is None else armed
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.paused = _Pause(self._lock)
        self._create()
        self._thread = threading.Thread(target=self._loop, name="engine-pump", daemon=True)
        self._thread.start()

    def _create(self) -> None:
        self.box = EngineMailbox.create(str(self.path), self.fp, self.n_slots)
        self.box.set_armed(list(self.armed), entries=4)
        self.bound: dict[int, str] = {}  # slot -> vector id, as the engine applied it
        self.inflight = np.zeros(self.n_slots, dtype=np.uint32)
        self.last_used = np.zeros(self.n_slots, dtype=np.uint64)

    def step(self) -> None:
        with self._lock:
            target, entries, torn = self.box.pending()
            for entry in entries:
                self.box.ack(entry)
                if entry.state == ACTIVE:
                    self.bound[entry.slot] = entry.vector_id
                    self.box.add_counter("mailbox_rows_applied")
                else:
                    self.bound.pop(entry.slot, None)
            self.box.publish(None if torn else target, self.inflight, self.last_used)
            self.box.beat()

    def _loop(self) -> None:
        while not self._stop.wait(0.005):
            with self._lock:
                if not self.paused.is_set():
                    self.step()

    def hold(self, vector_id: str) -> list[int]:
        """A request starts using ``vector_id``: its bound slots get one more reference."""
        with self._lock:
            slots = sorted(s for s, v in self.bound.items() if v == vector_id)
            assert slots, f"{vector_id} is not bound in the engine"
            self.inflight[slots] += 1
            self.last_used[slots] = time.time_ns()
            self.box.publish(None, self.inflight, self.last_used)
            return slots

    def release(self, slots: list[int]) -> None:
        with self._lock:
            self.inflight[slots] -= 1
            self.last_used[slots] = time.time_ns()
            self.box.publish(None, self.inflight, self.last_used)

    def touch(self, vector_id: str) -> None:
        """One short request used ``vector_id`` just now."""
        self.release(self.hold(vector_id))

    def restart(self, n_slots: int | None = None) -> None:
        """The engine process restarts: a new mailbox file, a new epoch, nothing registered."""
        with self._lock:
            old = self.box
            self.n_slots = n_slots or self.n_slots
            self._create()
            old.close()

    def entries(self, vector_id: str) -> dict[int, tuple[int, int, np.ndarray]]:
        """ACTIVE slots of ``vector_id`` in the directory: layer -> (slot, generation, row)."""
        found = {}
        for slot in range(self.n_slots):
            entry = self.box.read_entry(slot, with_row=True)
            if entry is not None and entry.state == ACTIVE and entry.vector_id == vector_id:
                found[entry.layer] = (slot, entry.gen, entry.row)
        return found

    def seqs(self) -> list[int]:
        return self.box.directory["seq"].tolist()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """``create_app(settings)`` served by uvicorn on 127.0.0.1, lifespan included; ``requests``
    counts the HTTP requests it received, by ``(method, path)``."""

    def __init__(self, settings: Settings):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.app = create_app(settings)
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()

        async def counted(scope, receive, send) -> None:
            if scope["type"] == "http":
                self.requests[scope["method"], scope["path"]] += 1
            await self.app(scope, receive, send)

        config = uvicorn.Config(counted, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        wait_until(lambda: self.server.started or not self._thread.is_alive(), what="server start")
        assert self.server.started, "control API failed to start"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self.sock.close()


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


class Rig:
    """One engine mailbox and one control API over one state directory, each restartable; with
    :meth:`start_rank`, more data-parallel ranks of the engine (``<mailbox>.dpN``)."""

    def __init__(self, tmp_path: Path, **settings: Any):
        defaults = dict(mailbox=tmp_path / "shm" / "engine.mbx", state_dir=tmp_path / "state",
                        token=SecretStr(TOKEN), max_upload_bytes=64 * 1024,
                        heartbeat_timeout_s=3.0, evict_timeout_s=2.0)
        self.settings = Settings(**{**defaults, **settings})
        self.engine: EnginePump | None = None
        self.ranks: dict[int, EnginePump] = {}  # DP ranks > 0
        self.server: ServerThread | None = None
        self.http: httpx.Client | None = None

    @classmethod
    @contextlib.contextmanager
    def running(cls, tmp_path: Path, **settings: Any) -> Iterator["Rig"]:
        """A rig with its engine mailbox and control API started, stopped at exit."""
        rig = cls(tmp_path, **settings)
        try:
            rig.start_engine()
            rig.start_api()
            yield rig
        finally:
            rig.stop()

    def start_engine(self, **kwargs: Any) -> EnginePump:
        self.engine = EnginePump(self.settings.mailbox, **kwargs)
        return self.engine

    def start_rank(self, rank: int, **kwargs: Any) -> EnginePump:
        """Data-parallel rank ``rank`` (> 0) of the engine, at ``<mailbox>.dp<rank>``."""
        path = self.settings.mailbox.with_name(f"{self.settings.mailbox.name}.dp{rank}")
        self.ranks[rank] = EnginePump(path, **kwargs)
        return self.ranks[rank]

    def start_api(self, **changes: Any) -> httpx.Client:
        """Start the control API, with ``changes`` to the settings from here on (another
        ``state_dir``, ``unknown_vectors``, ...)."""
        if changes:
            self.settings = self.settings.model_copy(update=changes)
        self.server = ServerThread(self.settings).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=30,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        return self.http

    def stop_api(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.server is not None:
            self.server.stop()
        self.server = self.http = None

    def stop(self) -> None:
        self.stop_api()
        for engine in [self.engine, *self.ranks.values()]:
            if engine is not None:
                engine.stop()

    def services(self) -> Services:
        """The running control API's services (its real catalog, engines, ...)."""
        return self.server.app.state.services

    # Helpers over HTTP ------------------------------------------------------------------

    def push(self, vector_id: str, vector: np.ndarray, **fields: Any) -> httpx.Response:
        return self.http.post("/steer/vectors", json=json_body(vector_id, vector, **fields))

    def upload(self, vector_id: str, blob: bytes, **fields: Any) -> httpx.Response:
        """A multipart upload of the safetensors file ``blob``, with form ``fields``."""
        return self.http.post("/steer/vectors",
                              data={"id": vector_id, **{k: str(v) for k, v in fields.items()}},
                              files={"file": ("v.safetensors", blob, "application/octet-stream")})

    def catalog(self) -> dict[str, dict]:
        response = self.http.get("/steer/vectors")
        assert response.status_code == 200, response.text
        return {v["id"]: v for v in response.json()["vectors"]}

    def resident(self, vector_id: str) -> bool:
        response = self.http.get(f"/steer/vectors/{vector_id}")
        return response.status_code == 200 and response.json()["resident"]

    def state(self) -> tuple[dict, list[int]]:
        """What a refused request must leave alone: the catalog and the mailbox directory."""
        return self.catalog(), self.engine.seqs()

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """``/metrics`` by sample: ``(name, sorted label pairs) -> value``."""
        text = self.http.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    """``response`` is the error body with ``status`` and ``code``, and a message."""
    assert response.headers["content-type"] == "application/json", response.text
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (status, code), response.text
    assert error["message"]


def json_body(vector_id: str, vector: np.ndarray, **fields: Any) -> dict[str, Any]:
    vector = np.asarray(vector, dtype=np.float32)
    return {"id": vector_id, "data": base64.b64encode(vector.astype("<f4").tobytes()).decode(),
            "dtype": "float32", "shape": list(vector.shape), **fields}


def safetensors_blob(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    """A safetensors file built by hand: ``name -> (dtype code, float32 values)``.

    ``BF16`` keeps the top 16 bits of each float32, so pick values bfloat16 holds exactly.
    """
    header: dict[str, Any] = {}
    payload = b""
    for name, (code, given) in tensors.items():
        values = np.asarray(given, dtype=np.float32)
        if code == "BF16":
            data = (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
        else:
            data = values.astype({"F32": "<f4", "F16": "<f2", "I32": "<i4"}[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(values.shape),
                        "data_offsets": [len(payload), len(payload) + len(data)]}
        payload += data
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + payload


def exact_vector(*shape: int, seed: int = 0) -> np.ndarray:
    """Values every float dtype here holds exactly (multiples of 1/8 in [-4, 4))."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-32, 32, size=shape) / 8).astype(np.float32)

