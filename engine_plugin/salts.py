"""Cache keys that must know about hotwire.

* Compile cache (invariant 4): vLLM keys compiled artifacts on ``VllmConfig.compute_hash()``.
  A cache written without the plugin (or with another op, or other table shapes) would serve
  a graph without the current steering op, so the hash is salted with the plugin version, a
  digest of the op's source and everything that shapes the tables.
* Prefix cache (invariant 5): block hashes ignore ``extra_args`` but include ``cache_salt``, so a
  steered request's salt is extended with its canonical spec, the versions of the vectors it
  reads (from the mailbox) and, where its tokens are chosen relative to the prompt's end, the
  prompt's length: KV blocks are never shared between requests whose tokens there are steered
  differently.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

from hotwire.shared.mailbox import MailboxError, MailboxView
from hotwire.shared.spec import SpecError, cache_salt, parse_spec, spec_from_extra_args

from .admission import prompt_length
from .config import HotwireConfig

log = logging.getLogger("vllm.hotwire")


def plugin_version() -> str:
    try:
        return version("hotwire")
    except PackageNotFoundError:
        return "dev"


_OP_SOURCES = ("steering.py", "steer_op.py", "steer_triton.py", "interventions.py")


@functools.cache
def op_digest() -> str:
    """Digest of the code compiled graphs embed: the layer wrapper, the op and its kernel."""
    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / f).read_bytes() for f in _OP_SOURCES)).hexdigest()[:16]


def compile_salt(vllm_config: Any) -> str:
    cfg = HotwireConfig.from_env()
    max_seqs = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None)
    return (f"hotwire={plugin_version()};op={op_digest()};slots={cfg.slots};layers={cfg.layers};"
            f"entries={cfg.entries};max_seqs={max_seqs}")


def patch_config_hash(module: ModuleType) -> None:
    cls = module.VllmConfig
    orig = cls.compute_hash
    if getattr(orig, "__hotwire__", False):
        return

    def compute_hash(self, *args, **kwargs):
        h = orig(self, *args, **kwargs)
        return hashlib.sha256(f"{h}|{compile_salt(self)}".encode()).hexdigest()[: len(h)]

    compute_hash.__hotwire__ = True
    compute_hash.__doc__ = orig.__doc__
    cls.compute_hash = compute_hash


class _Versions:
    """Vector versions as this engine's own mailbox holds them (:meth:`MailboxView.versions`;
    one mailbox per data-parallel rank: the engine core names it, :func:`follow_mailbox`; until
    then the configured one, rank 0's), re-read only when the directory changed."""

    def __init__(self) -> None:
        self.path: str | None = None
        self._view: MailboxView | None = None
        self._seen = -1
        self._versions: dict[str, str] = {}

    def get(self) -> dict[str, str]:
        path = self.path if self.path is not None else HotwireConfig.from_env().mailbox
        if not path:
            return {}
        try:
            if self._view is None or os.stat(path).st_ino != self._view.inode:
                self._close()
                self._view, self._seen = MailboxView.open(path), -1
            head = self._view.header
            target = int(head["target_gen"]) ^ int(head["epoch"])
            if target != self._seen:
                self._versions, self._seen = self._view.versions(), target
        except (OSError, MailboxError, ValueError):
            self._close()  # no mailbox, or an unreadable one: salt with the spec alone
            self._versions = {}
        return self._versions

    def _close(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


_versions = _Versions()


def follow_mailbox(path: str) -> None:
    """Salt with the versions of ``path``: the engine core's own mailbox
    (:func:`hotwire.shared.mailbox.dp_mailbox_path` of its rank)."""
    _versions.path = path


def request_salt(sampling_params: Any, prompt_len: int) -> str | None:
    """The prefix-cache salt a request's steering adds, or None when it is not steered."""
    raw = spec_from_extra_args(getattr(sampling_params, "extra_args", None))
    if raw is None:
        return None
    try:
        entries = parse_spec(raw)
    except SpecError:
        return None  # runs unsteered: may share blocks with unsteered requests
    return cache_salt(entries, _versions.get(), prompt_len) if entries else None


def patch_request(module: ModuleType) -> None:
    cls = module.Request
    orig = cls.__init__
    if getattr(orig, "__hotwire__", False):
        return
    sig = inspect.signature(orig)
    if "cache_salt" not in sig.parameters or "sampling_params" not in sig.parameters:
        log.error("hotwire: Request has no cache_salt/sampling_params; prefix caching is NOT "
                  "isolated between steering configs — disable it (--no-enable-prefix-caching)")
        return

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        salt = request_salt(bound.arguments.get("sampling_params"), prompt_length(bound.arguments))
        if salt is not None:
            prior = bound.arguments.get("cache_salt")
            bound.arguments["cache_salt"] = f"{prior}|{salt}" if prior else salt
        orig(*bound.args, **bound.kwargs)

    __init__.__hotwire__ = True
    cls.__init__ = __init__
