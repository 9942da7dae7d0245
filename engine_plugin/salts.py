"""Cache keys that must know about hotwire.

* Compile cache (invariant 4): vLLM keys compiled artifacts on its configuration's hash
  (``VllmConfig.compute_hash()``; from vLLM 0.34 the dict ``VllmConfig.compile_factors()``, which
  it hashes). A cache written without the plugin (or with another op, or other table shapes)
  would serve a graph without the current steering op, so the key is salted with the plugin
  version, a digest of the op's source and everything that shapes the tables.
* Prefix cache (invariant 5): block hashes ignore ``extra_args`` but include ``cache_salt``, so a
  steered request's salt is extended with its canonical spec, the versions of the vectors it
  reads (as the engine's mailbox thread acked them) and, where its tokens are chosen relative to the prompt's end, the
  prompt's length: KV blocks are never shared between requests whose tokens there are steered
  differently. It is added where vLLM makes the request (:mod:`.arrival`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

from hotwire.shared.spec import SpecError, cache_salt, parse_spec, spec_from_extra_args

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
    """Salt the compile cache's key with :func:`compile_salt`, in whichever form this vLLM
    computes it (both, where it has both); an error in the log where it has neither."""
    cls = module.VllmConfig
    found = [name for name, wrap in (("compute_hash", _salted_hash), ("compile_factors", _salted_factors))
             if _salt_method(cls, name, wrap)]
    if not found:
        log.error("hotwire: VllmConfig has neither compute_hash nor compile_factors, so vLLM's compile cache is "
                  "NOT keyed on hotwire: a graph compiled without the steering op could be loaded; run with "
                  "VLLM_DISABLE_COMPILE_CACHE=1")


def _salt_method(cls: type, name: str, wrap: Callable[[Callable], Callable]) -> bool:
    """Replace ``cls.name`` by ``wrap`` of it, once; False where the class has no such method."""
    orig = getattr(cls, name, None)
    if not callable(orig):
        return False
    if not getattr(orig, "__hotwire__", False):
        salted = functools.wraps(orig)(wrap(orig))
        salted.__hotwire__ = True
        setattr(cls, name, salted)
    return True


def _salted_hash(orig: Callable) -> Callable:
    def compute_hash(self, *args, **kwargs):  # a hex digest: salted, same length
        h = orig(self, *args, **kwargs)
        return hashlib.sha256(f"{h}|{compile_salt(self)}".encode()).hexdigest()[: len(h)]

    return compute_hash


def _salted_factors(orig: Callable) -> Callable:
    def compile_factors(self, *args, **kwargs):  # a JSON-able dict vLLM hashes: one more entry
        return {**orig(self, *args, **kwargs), "hotwire": compile_salt(self)}

    return compile_factors


_versions: Callable[[], dict[str, str]] = dict  # none known: the spec alone (startup vectors never change)


def use_versions(source: Callable[[], dict[str, str]]) -> None:
    """Salt with the vector versions ``source`` returns: the engine core's own mailbox's
    (:meth:`.core_sync.CoreSync.versions`, kept in memory by its mailbox thread, so a request's
    arrival makes no system call)."""
    global _versions
    _versions = source


def request_salt(sampling_params: Any, prompt_len: int) -> str | None:
    """The prefix-cache salt a request's steering adds, or None when it is not steered."""
    raw = spec_from_extra_args(getattr(sampling_params, "extra_args", None))
    if raw is None:
        return None
    try:
        entries = parse_spec(raw)
    except SpecError:
        return None  # runs unsteered: may share blocks with unsteered requests
    return cache_salt(entries, _versions(), prompt_len) if entries else None
