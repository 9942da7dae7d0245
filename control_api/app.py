"""The control API application: ``create_app(settings)``.

Services (catalog, engine link, slot manager, metrics) are made in the lifespan, not at import
or construction, so building the app touches no disk and two apps never share state. The
lifespan reconciles once before serving, then every ``RECONCILE_PERIOD_S`` in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib.metadata import version

from fastapi import FastAPI

from .catalog_store import catalog_location, open_catalog
from .dependencies import Services
from .engine_link import EngineLink
from .errors import install_error_handlers
from .metrics import Metrics, count_uploads
from .routers import health, slots, vectors
from .settings import Settings
from .slots import SlotManager

log = logging.getLogger("hotwire.control_api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.token is None:
            log.warning("HOTWIRE_TOKEN is not set: anyone who can reach this API can change vectors")
        catalog = open_catalog(settings)
        log.info("catalog %s: %d vector(s); engine vectors it does not know are %s",
                 catalog_location(settings), len(catalog.records()),
                 "adopted" if settings.unknown_vectors == "adopt" else "retired")
        link = EngineLink(settings.mailbox)
        manager = SlotManager(catalog, link, evict_timeout_s=settings.evict_timeout_s,
                              heartbeat_timeout_s=settings.heartbeat_timeout_s,
                              unknown_vectors=settings.unknown_vectors)
        app.state.services = Services(settings, catalog, manager, Metrics(catalog, manager))
        async with manager.lock:
            manager.reconcile()
        reconciler = asyncio.create_task(manager.run(), name="hotwire-reconcile")
        try:
            yield
        finally:
            reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciler
            link.close()
            catalog.close()

    app = FastAPI(title="hotwire control API", version=version("hotwire"), lifespan=lifespan,
                  description="Register steering vectors and watch the engine's slot table.")
    install_error_handlers(app)
    app.middleware("http")(count_uploads(vectors.PATH))
    for module in (vectors, slots, health):
        app.include_router(module.router)
    return app
