"""Control API settings: environment variables, overridden by command-line flags.

Every setting has one environment variable (``Settings.ENV``) so a container is configured the
same way whether it runs ``hotwire control-api`` or ``create_app`` directly. The bearer tokens are
read from the environment only: a secret on the command line leaks into ``ps``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from hotwire.shared.mailbox import DEFAULT_MAILBOX


def default_state_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """Where the catalog lives unless told: never relative to the working directory, so starting
    the control API from another folder cannot open an empty catalog by accident.

    ``$XDG_STATE_HOME/hotwire`` if that is an absolute path (the XDG spec ignores relative
    ones), else ``/var/lib/hotwire`` for root, else ``~/.local/state/hotwire``.
    """
    environ = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    xdg = environ.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "hotwire"
    if euid == 0:
        return Path("/var/lib/hotwire")
    return Path.home() / ".local" / "state" / "hotwire"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    mailbox: Path = Field(Path(DEFAULT_MAILBOX), description="engine mailbox file to attach to")
    state_dir: Path = Field(default_factory=default_state_dir,
                            description="directory of the SQLite catalog (default "
                            "$XDG_STATE_HOME/hotwire, /var/lib/hotwire as root, else "
                            "~/.local/state/hotwire)")
    unknown_vectors: Literal["adopt", "retire"] = Field(
        "adopt", description="what to do with engine vectors the catalog does not know")
    token: SecretStr | None = Field(None, description="bearer token for writes; unset = open")
    read_token: SecretStr | None = Field(None, description="bearer token for reads (the write "
                                         "token works too); unset = reads open")
    catalog_dsn: SecretStr | None = Field(
        None, description="postgresql:// DSN of a catalog shared by replicas; unset = SQLite in "
        "the state directory")
    replica: str = Field(default_factory=socket.gethostname, min_length=1,
                         description="this replica's name in the residency reports replicas share "
                         "(default: the hostname; Kubernetes: the pod name)")
    max_upload_bytes: int = Field(64 * 2**20, gt=0, description="largest accepted request body")
    heartbeat_timeout_s: float = Field(10.0, gt=0, description="engine heartbeat age that fails /readyz")
    evict_timeout_s: float = Field(5.0, ge=0, description="how long an upload waits for evicted slots")
    host: str = Field("127.0.0.1", description="interface to listen on; containers say 0.0.0.0")
    port: int = Field(8001, ge=1, le=65535, description="port to listen on")

    ENV: ClassVar[dict[str, str]] = {
        "mailbox": "HOTWIRE_MAILBOX",
        "state_dir": "HOTWIRE_STATE_DIR",
        "unknown_vectors": "HOTWIRE_UNKNOWN_VECTORS",
        "token": "HOTWIRE_TOKEN",
        "read_token": "HOTWIRE_READ_TOKEN",
        "catalog_dsn": "HOTWIRE_CATALOG_DSN",
        "replica": "HOTWIRE_REPLICA",
        "max_upload_bytes": "HOTWIRE_MAX_UPLOAD_BYTES",
        "heartbeat_timeout_s": "HOTWIRE_HEARTBEAT_TIMEOUT_S",
        "evict_timeout_s": "HOTWIRE_EVICT_TIMEOUT_S",
        "host": "HOTWIRE_HOST",
        "port": "HOTWIRE_PORT",
    }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``environ`` (default ``os.environ``); ``None`` overrides are ignored.

        An empty variable counts as unset, so ``HOTWIRE_TOKEN=`` leaves writes open.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {f: environ[v] for f, v in cls.ENV.items() if environ.get(v)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        values.setdefault("state_dir", default_state_dir(environ))
        return cls.model_validate(values)

    @property
    def catalog_path(self) -> Path:
        return self.state_dir / "catalog.sqlite3"
