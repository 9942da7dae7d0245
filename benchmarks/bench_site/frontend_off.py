"""Benchmark only: hotwire's API-server middleware (``engine_plugin/frontend``) left out, for the
server kinds that set ``BENCH_FRONTEND=off`` (``server_kinds.py``); imported by
``sitecustomize.py`` at the start of each of their processes. The API server then forwards a
spec to the engine as vLLM alone would (no parse, no admission decision, no ``x-hotwire``
header); the engine core salts and admits it as deployed. Beside the same server with the
middleware: what the middleware's work on each steered request costs the server.
"""

import os

from hotwire.engine_plugin import hooks

if os.environ.get("BENCH_FRONTEND") != "off":
    raise ValueError(f"BENCH_FRONTEND={os.environ.get('BENCH_FRONTEND')!r}: off or unset")
hooks.TARGETS.pop("fastapi.applications", None)
