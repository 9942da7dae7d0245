"""Real server processes for the end-to-end tests: vLLM's OpenAI server (with the hotwire plugin,
loaded through its entry point) and the ``hotwire control-api``.

Each server runs in its own session, so stopping it signals its whole process group: vLLM's
engine core and worker processes go with the API server. :meth:`ServerProcess.stop` is safe to
call any number of times, also on a process that never started or already died.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from conftest import engine_env

PYTHON = sys.executable
HOTWIRE = str(Path(sys.executable).with_name("hotwire"))
VLLM_SERVER = [PYTHON, "-m", "vllm.entrypoints.openai.api_server"]  # works without the `vllm` CLI


@contextlib.contextmanager
def logs_on_failure(request: Any, *servers: ServerProcess):
    """Around a fixture's life: when its setup fails, or a test fails while it is up, write the
    servers' log tails to the terminal (their logs live in pytest's temp dirs, gone in CI)."""
    failed = request.session.testsfailed
    try:
        yield
    except BaseException:
        _dump_logs(request, servers)
        raise
    if request.session.testsfailed > failed:
        _dump_logs(request, servers)


def _dump_logs(request: Any, servers: tuple[ServerProcess, ...]) -> None:
    plugins = request.config.pluginmanager
    terminal, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for server in servers:
            text = f"\n----- {server.name} log tail ({server.log_path}) -----\n{server.log_tail()}"
            if terminal is not None:
                terminal.write_line(text)
            else:
                print(text, file=sys.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_flags(engine: dict[str, Any]) -> list[str]:
    """``LLM(**engine)`` keyword arguments as OpenAI-server flags (``max_num_seqs=16`` ->
    ``--max-num-seqs 16``, ``enforce_eager=True`` -> ``--enforce-eager``)."""
    flags: list[str] = []
    for key, value in engine.items():
        name = key.replace("_", "-")
        if value is True:
            flags.append(f"--{name}")
        elif value is False:
            flags.append(f"--no-{name}")
        else:
            flags += [f"--{name}", str(value)]
    return flags


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             alive: Callable[[], str | None] | None = None, period: float = 0.1) -> Any:
    """Poll ``predicate`` until truthy; fail early when ``alive()`` reports the process died."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and (why := alive()) is not None:
            raise AssertionError(f"{what}: {why}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(period)


class ServerProcess:
    """One HTTP server command in its own process group, logging into ``log_path``."""

    name = "server"

    def __init__(self, workdir: Path, env: dict[str, str]):
        self.workdir = workdir
        self.env = env
        self.log_path = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.starts = 0
        self._clients: dict[tuple[str, str | None], httpx.Client] = {}

    def argv(self, port: int) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self.port is not None, f"{self.name} is not started"
        return f"http://127.0.0.1:{self.port}"

    def http(self, token: str | None = None) -> httpx.Client:
        """A client of the running server, kept for reuse: making one builds an SSL context,
        which takes seconds on a two-core box whose cores an engine keeps busy."""
        key = (self.url, token)
        client = self._clients.get(key)
        if client is None:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            client = self._clients[key] = httpx.Client(base_url=self.url, headers=headers,
                                                       timeout=300)
        return client

    def _close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def launch(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.port = free_port()
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.starts} on port {self.port} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv(self.port), env=self.env, cwd=self.workdir,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def died(self) -> str | None:
        """Why the process is gone (with its log), or ``None`` while it runs."""
        if self.proc is None:
            return f"{self.name} was never started"
        if self.proc.poll() is None:
            return None
        return f"{self.name} exited with {self.proc.returncode}; log tail:\n{self.log_tail()}"

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def get_ok(self, path: str) -> bool:
        try:
            return self.http().get(path, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def wait_http(self, path: str, timeout: float) -> None:
        wait_for(lambda: self.get_ok(path), timeout, f"{self.name} GET {path} -> 200", self.died,
                 period=0.25)

    def stop(self, sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
        """Signal the process group, wait, then SIGKILL whatever of the group is left."""
        self._close_clients()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        _signal_group(pgid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait(30)
        # vLLM's engine core and worker may outlive the API server leader.
        deadline = time.monotonic() + 30
        while _signal_group(pgid, 0) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.1)

    def kill(self) -> None:
        """Crash it: SIGKILL to the whole group, no shutdown handlers."""
        self.stop(signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pgid reused by someone else's group: not ours to touch
        return False
    return True


class VllmServer(ServerProcess):
    """``python -m vllm.entrypoints.openai.api_server`` on a tiny model, plugin loaded.

    ``engine`` are ``LLM`` keyword arguments (as in ``conftest.CPU_ENGINE``), passed as flags.
    ``env`` adds to the private environment of :func:`conftest.engine_env` (own caches, temp
    dir and ``HOTWIRE_MAILBOX``). The engine runs in vLLM's default multiprocess mode (API
    server, engine core, worker), as in production.
    """

    name = "vllm"

    def __init__(self, workdir: Path, model: Path, engine: dict[str, Any], *,
                 served_name: str = "tiny", **env: str):
        workdir.mkdir(parents=True, exist_ok=True)
        base = engine_env(workdir, **env)
        base.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # serve as in production
        super().__init__(workdir, base)
        self.model, self.engine, self.served_name = model, engine, served_name
        self.mailbox = Path(base["HOTWIRE_MAILBOX"])

    def argv(self, port: int) -> list[str]:
        return [*VLLM_SERVER, "--model", str(self.model), "--served-model-name", self.served_name,
                "--host", "127.0.0.1", "--port", str(port), *engine_flags(self.engine)]

    def start(self, timeout: float = 600) -> VllmServer:
        self.launch()
        return self.ready(timeout)

    def complete(self, prompt: list[int], steer: str | None = None, max_tokens: int = 8,
                 **extra: Any) -> dict[str, Any]:
        """One greedy ``/v1/completions`` choice (``token_ids`` included), steered by ``steer``."""
        body = {"model": self.served_name, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra}
        if steer is not None:
            body["vllm_xargs"] = {"hotwire": steer}
        r = self.http().post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    def ready(self, timeout: float = 600, logprobs: bool = False) -> VllmServer:
        """Wait until a launched server answers, and warm it up.

        ``logprobs``: also compile the sampler's logprobs kernel (vLLM compiles it with
        torch.compile on the first request that asks for logprobs: 15-20 s on two cores).
        """
        self.wait_http("/health", timeout)
        # The first forward of a fresh process pays one-off setup: pay it here, not in a test.
        body = {"model": self.served_name, "prompt": [1, 2, 3], "max_tokens": 2,
                "temperature": 0, "ignore_eos": True, **({"logprobs": 0} if logprobs else {})}
        r = self.http().post("/v1/completions", json=body, timeout=timeout)
        assert r.status_code == 200, f"warm-up request failed: {r.text}\n{self.log_tail()}"
        return self


class ControlApi(ServerProcess):
    """``hotwire control-api`` over one mailbox and one state directory."""

    name = "control-api"

    def __init__(self, workdir: Path, mailbox: Path, *, token: str | None = None, **env: str):
        workdir.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith("HOTWIRE_")}
        if token is not None:
            base["HOTWIRE_TOKEN"] = token
        base.update(env)
        super().__init__(workdir, base)
        self.mailbox, self.state_dir, self.token = mailbox, workdir / "state", token

    def argv(self, port: int) -> list[str]:
        return [HOTWIRE, "control-api", "--host", "127.0.0.1", "--port", str(port),
                "--mailbox", str(self.mailbox), "--state-dir", str(self.state_dir)]

    def start(self, ready: bool = True, timeout: float = 120) -> ControlApi:
        self.launch()
        self.wait_http("/healthz", timeout)
        if ready:
            self.wait_http("/readyz", timeout)
        return self

    def api(self) -> httpx.Client:
        """A client that sends the bearer token."""
        return self.http(self.token)
