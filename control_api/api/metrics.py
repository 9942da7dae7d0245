"""Prometheus metrics: read from the catalog and the mailboxes at scrape time, plus upload results.

Engine metrics carry a ``dp_rank`` label (``"0"`` for an engine without data parallelism), one
series per rank the control API feeds; catalog metrics and upload counts have none. The
engine's counters are exposed as :data:`hotwire.shared.engine_counters.ENGINE_COUNTERS` declares
them. Each app has its own registry, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hotwire.shared.engine_counters import ENGINE_COUNTERS, LABELLED

from ..slots.engines import Engines
from ..store.catalog import CatalogStore

EXPOSED = [c for c in ENGINE_COUNTERS if c.metric is not None]


class StateCollector(Collector):
    """Catalog, slot tables and engine counters, as they are when scraped."""

    def __init__(self, catalog: CatalogStore, engines: Engines):
        self.catalog, self.engines = catalog, engines

    def collect(self) -> Iterator[Metric]:
        records = self.catalog.records().values()
        yield GaugeMetricFamily("hotwire_catalog_vectors", "Vectors in the catalog",
                                value=len(records))
        yield GaugeMetricFamily("hotwire_catalog_writable",
                                "0 when the catalog cannot persist writes (e.g. its file was "
                                "removed or replaced while running)",
                                value=int(self.catalog.problem() is None))
        rank = ["dp_rank"]
        attached = GaugeMetricFamily("hotwire_engine_attached",
                                     "1 when the engine's mailbox is attached", labels=rank)
        resident = GaugeMetricFamily("hotwire_resident_vectors",
                                     "Catalog vectors fully written into the engine's slots",
                                     labels=rank)
        used = GaugeMetricFamily("hotwire_slots_used", "Engine slots not reusable", labels=rank)
        total = GaugeMetricFamily("hotwire_slots_capacity", "Engine slot budget", labels=rank)
        heartbeat = GaugeMetricFamily("hotwire_engine_heartbeat_age_seconds",
                                      "Age of the engine's last heartbeat", labels=rank)
        lag = GaugeMetricFamily("hotwire_mailbox_unapplied_generations",
                                "Mailbox generations written but not yet applied by the engine",
                                labels=rank)
        counted: dict[str, CounterMetricFamily] = {}
        for c in EXPOSED:
            if c.metric not in counted:
                label, about = LABELLED.get(c.metric, (None, c.help))
                counted[c.metric] = CounterMetricFamily(c.metric, about, labels=[
                    *rank, *([label] if label else [])])
        evicted = CounterMetricFamily("hotwire_evicted_vectors", "Vectors evicted to make room",
                                      labels=rank)
        adopted = CounterMetricFamily("hotwire_adopted_vectors",
                                      "Engine vectors the catalog did not know, adopted into it",
                                      labels=rank)
        for engine in self.engines:
            label = [str(engine.rank)]
            view = engine.view()
            attached.add_metric(label, int(view is not None))
            evicted.add_metric(label, engine.evicted_total)
            adopted.add_metric(label, engine.adopted_total)
            if view is None:
                continue
            resident.add_metric(label, sum(engine.residency(r, view).resident for r in records))
            used.add_metric(label, view.table.used)
            total.add_metric(label, view.table.n_slots)
            heartbeat.add_metric(label, view.heartbeat_age_s)
            lag.add_metric(label, max(0, view.target_gen - view.applied_gen))
            for c in EXPOSED:
                value = view.counters[c.name]
                counted[c.metric].add_metric([*label, *([c.label] if c.label else [])],
                                             value / 1e9 if c.seconds else value)
        yield from (attached, resident, used, total, heartbeat, lag, *counted.values(), evicted,
                    adopted)


class Metrics:
    def __init__(self, catalog: CatalogStore, engines: Engines):
        self.registry = CollectorRegistry()
        self.uploads = Counter("hotwire_uploads", "Vector uploads by HTTP status code", ["code"],
                               registry=self.registry)
        self.registry.register(StateCollector(catalog, engines))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def count_uploads(path: str) -> Callable[[Request, Callable[[Request], Awaitable[Response]]],
                                         Awaitable[Response]]:
    """HTTP middleware counting ``POST path`` responses by status, failures included."""

    async def middleware(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if request.method == "POST" and request.url.path == path:
            request.app.state.services.metrics.uploads.labels(str(response.status_code)).inc()
        return response

    return middleware
