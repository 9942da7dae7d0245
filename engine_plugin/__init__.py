"""vLLM engine plugin: per-request steering inside compiled, CUDA-graphed models.

Loaded through the ``vllm.general_plugins`` entry point. ``register()`` is idempotent and cheap:
it only installs import-time patches (see :mod:`.hooks`); the GPU tables are allocated later,
per model runner, right after the model is loaded.
"""

from __future__ import annotations

import logging

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    from . import hooks

    hooks.install()
    _registered = True
    logging.getLogger("vllm.hotwire").debug("hotwire: plugin registered")
