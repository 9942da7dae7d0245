"""A steered request's arrival in the engine core: the work done as vLLM makes its ``Request``.

vLLM makes each ``Request`` on the engine core's input thread (``preprocess_add_request``), while
the step thread waits on the model; in the one-process layout, on the step thread before the
step. Two things are done there, once per steered request:

* the prefix-cache salt (invariant 5, :func:`.salts.request_salt`), which vLLM hashes the
  request's blocks with as it makes it;
* the spec's resolution ahead of its first step (:meth:`.core_sync.CoreSync.prepare`), so that
  admission at the step finds it resolved, unless a slot binding changed in between. A new spec's
  resolution cost the step thread 20-30 µs per arrival in a served engine, where at 256 requests in
  flight one or two arrive every step.

An unsteered request costs one look at its ``extra_args``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from hotwire.shared.spec import SPEC_KEY

from . import salts
from .admission import prompt_length

log = logging.getLogger("vllm.hotwire")

_prepare: Callable[[dict[str, Any], int], None] | None = None  # the engine core's, once its sync started


def use_core(prepare: Callable[[dict[str, Any], int], None] | None) -> None:
    """Resolve each steered request's spec ahead of its step with ``prepare(extra_args, prompt_len)``
    (the engine core's :meth:`.core_sync.CoreSync.prepare`); None: leave it to the step."""
    global _prepare
    _prepare = prepare


def _resolve_ahead(extra_args: dict[str, Any], prompt_len: int) -> None:
    """Only a head start: whatever goes wrong here is left to the step's admission, which decides
    (and refuses, counted) as it would without it."""
    global _prepare
    prepare = _prepare
    if prepare is None:
        return
    try:
        prepare(extra_args, prompt_len)
    except Exception:
        _prepare = None
        log.exception("hotwire: resolving a spec as its request arrived failed; specs are resolved at their "
                      "first step from now on")


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
            n = prompt_length(prompt)
            salt = salts.request_salt(sp, n)
            if salt is not None:  # a spec that parsed and steers
                prior = call.get("cache_salt", args, kwargs)
                args = call.set("cache_salt", f"{prior}|{salt}" if prior else salt, args, kwargs)
                if prehashed and call.get("block_hashes", args, kwargs):
                    args = call.set("block_hashes", None, args, kwargs)
                _resolve_ahead(extra, n)
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
