"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` in a temp dir, stopped after.

The server listens on 127.0.0.1 on a free port (password auth, so a DSN carries a secret the way
production's does) and on a unix socket inside the temp dir. PostgreSQL refuses to run as root,
so under root the server runs as the ``postgres`` OS user that Debian's package creates; the temp
dir is made outside pytest's root-only tree and handed to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER, PASSWORD = "hotwire", "pg-test-pw-7f3a"


def find_bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: on PATH, or Debian's newest
    /usr/lib/postgresql/<version>/bin; ``None`` when PostgreSQL is not installed."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def why_unavailable() -> str | None:
    """Why no cluster can be started here, or ``None``."""
    if find_bindir() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` OS user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """One PostgreSQL server of its own; :meth:`database` makes an empty database per test."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        assert self.bindir is not None, why_unavailable()
        self.root = Path(tempfile.mkdtemp(prefix="hotwire-pg-"))
        self.data, self.sockets = self.root / "data", self.root / "run"
        self.log = self.root / "pg.log"
        self.port = _free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            os.chown(self.root, pwd.getpwnam("postgres").pw_uid, pwd.getpwnam("postgres").pw_gid)
        self._pg(["mkdir", str(self.sockets)])
        pwfile = self.root / "pw"
        self._pg(["sh", "-c", f"umask 077 && echo '{PASSWORD}' > {pwfile}"])
        self._pg([str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER,
                  f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C",
                  "--no-sync"])
        # In the config file, not on pg_ctl's command line, so every later start keeps them.
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.port}\nunix_socket_directories = '{self.sockets}'\n"
                       "listen_addresses = '127.0.0.1'\nfsync = off\nsynchronous_commit = off\n"
                       "full_page_writes = off\n")
        self.start()

    def _pg(self, argv: list[str]) -> None:
        """Run ``argv`` as the server's user; fail with its output."""
        done = subprocess.run([*self._as_user, *argv], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=self.root, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}\n{self.log_tail()}")

    def _ctl(self, *args: str) -> None:
        self._pg([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args])

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{dbname}"

    def database(self, name: str) -> str:
        """A new empty database; its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every client connection is cut, the data stays."""
        self._ctl("-l", str(self.log), "-m", "fast", "restart")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def start(self) -> None:
        self._ctl("-l", str(self.log), "start")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"

    def destroy(self) -> None:
        """Stop the server (immediate) and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self._as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data),
                            "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
