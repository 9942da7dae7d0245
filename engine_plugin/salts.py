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
  differently.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

from hotwire.shared.spec import SPEC_KEY, SpecError, cache_salt, parse_spec, spec_from_extra_args

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
    call = _Arguments(sig)
    # block hashes a frontend computed before the engine (vLLM 0.34+) ignore the salt added here:
    # a salted request's are dropped, and the engine hashes its blocks again, salt included
    prehashed = "block_hashes" in sig.parameters

    def __init__(self, *args, **kwargs):
        args = (self, *args)
        sp = call.get("sampling_params", args, kwargs)
        extra = getattr(sp, "extra_args", None)
        if extra and SPEC_KEY in extra:  # an unsteered request costs this look only
            prompt = {name: call.get(name, args, kwargs) for name in ("prompt_token_ids", "prompt_embeds")}
            salt = request_salt(sp, prompt_length(prompt))
            if salt is not None:
                prior = call.get("cache_salt", args, kwargs)
                args = call.set("cache_salt", f"{prior}|{salt}" if prior else salt, args, kwargs)
                if prehashed and call.get("block_hashes", args, kwargs):
                    args = call.set("block_hashes", None, args, kwargs)
        orig(*args, **kwargs)

    __init__.__hotwire__ = True
    cls.__init__ = __init__


class _Arguments:
    """A function's named arguments, read and set in ``(args, kwargs)`` as the caller passed them:
    ``Signature.bind`` on every request cost tens of microseconds on the engine core's input
    thread, which shares the step thread's GIL."""

    def __init__(self, sig: inspect.Signature):
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._index = {name: i for i, (name, p) in enumerate(sig.parameters.items()) if p.kind in positional}
        self._default = {name: None if p.default is p.empty else p.default for name, p in sig.parameters.items()}

    def get(self, name: str, args: tuple, kwargs: dict) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self._index.get(name)
        return args[i] if i is not None and i < len(args) else self._default.get(name)

    def set(self, name: str, value: Any, args: tuple, kwargs: dict) -> tuple:
        """``args`` with ``name`` set to ``value`` (or ``kwargs`` changed, where it goes there)."""
        i = self._index.get(name)
        if i is not None and i < len(args):
            return (*args[:i], value, *args[i + 1:])
        kwargs[name] = value
        return args
