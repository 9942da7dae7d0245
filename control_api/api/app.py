"""The control API application: ``create_app(settings)``.

Services (catalog, engines, replica reports, metrics) are made in the lifespan, not at import
or construction, so building the app touches no disk and two apps never share state. The
lifespan reconciles every rank once before serving, then every ``RECONCILE_PERIOD_S`` in the
background; with a catalog shared by replicas (PostgreSQL) it also publishes this replica's
residency report about every second (see :mod:`..slots.replicas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib.metadata import version

from fastapi import FastAPI

from ..slots.engines import Engines
from ..slots.replicas import ReplicaReports
from ..store.catalog import catalog_location, open_catalog
from .dependencies import Services
from .http_errors import install_error_handlers
from .metrics import Metrics, count_uploads
from .routers import health, presets, slots, vectors
from .settings import Settings

log = logging.getLogger("hotwire.control_api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.token is None:
            log.warning("HOTWIRE_TOKEN is not set: anyone who can reach this API can change vectors")
        dsn = None if settings.catalog_dsn is None else settings.catalog_dsn.get_secret_value()
        catalog = open_catalog(dsn, settings.catalog_path)
        log.info("catalog %s: %d vector(s); engine vectors it does not know are %s",
                 catalog_location(dsn, settings.catalog_path), len(catalog.records()),
                 "adopted" if settings.unknown_vectors == "adopt" else "retired")
        engines = Engines(catalog, settings.mailbox, evict_timeout_s=settings.evict_timeout_s,
                          heartbeat_timeout_s=settings.heartbeat_timeout_s,
                          unknown_vectors=settings.unknown_vectors)
        replicas = ReplicaReports(settings.replica, engines, catalog.replica_board)
        app.state.services = Services(settings, catalog, engines, replicas,
                                      Metrics(catalog, engines))
        async with engines.lock:
            engines.reconcile()
        tasks = [asyncio.create_task(engines.run(), name="hotwire-reconcile")]
        if replicas.shared:
            tasks.append(asyncio.create_task(replicas.run(), name="hotwire-residency"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            engines.close()
            catalog.close()

    app = FastAPI(title="hotwire control API", version=version("hotwire"), lifespan=lifespan,
                  description="Register steering vectors and presets, and watch the engine's slot "
                  "table.")
    install_error_handlers(app)
    app.middleware("http")(count_uploads(vectors.PATH))
    for module in (vectors, presets, slots, health):
        app.include_router(module.router)
    return app
