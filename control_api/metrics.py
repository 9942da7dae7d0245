"""Prometheus metrics: read from the catalog and the mailbox at scrape time, plus upload results.

Each app has its own registry, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .catalog_store import CatalogStore
from .slots import SlotManager

UNSTEERED = "unsteered_"


class StateCollector(Collector):
    """Catalog, slot table and engine counters, as they are when scraped."""

    def __init__(self, catalog: CatalogStore, slots: SlotManager):
        self.catalog, self.slots = catalog, slots

    def collect(self) -> Iterator[Metric]:
        view = self.slots.view()
        records = self.catalog.records().values()
        yield GaugeMetricFamily("hotwire_catalog_vectors", "Vectors in the catalog",
                                value=len(records))
        yield GaugeMetricFamily("hotwire_catalog_writable",
                                "0 when the catalog cannot persist writes (e.g. its file was "
                                "removed or replaced while running)",
                                value=int(self.catalog.problem() is None))
        yield GaugeMetricFamily("hotwire_engine_attached", "1 when an engine mailbox is attached",
                                value=int(view is not None))
        resident = GaugeMetricFamily("hotwire_resident_vectors",
                                     "Catalog vectors fully written into the engine's slots")
        used = GaugeMetricFamily("hotwire_slots_used", "Engine slots not reusable")
        total = GaugeMetricFamily("hotwire_slots_total", "Engine slot budget")
        heartbeat = GaugeMetricFamily("hotwire_engine_heartbeat_age_seconds",
                                      "Age of the engine's last heartbeat")
        lag = GaugeMetricFamily("hotwire_mailbox_unapplied_generations",
                                "Mailbox generations written but not yet applied by the engine")
        steered = CounterMetricFamily("hotwire_engine_steered_requests",
                                      "Requests that arrived with a valid, resolvable spec")
        unsteered = CounterMetricFamily("hotwire_engine_unsteered_requests",
                                        "Requests run unsteered, by reason", labels=["reason"])
        applied = CounterMetricFamily("hotwire_engine_mailbox_rows_applied",
                                      "Mailbox rows the engine copied into its bank")
        torn = CounterMetricFamily("hotwire_engine_mailbox_torn_reads",
                                   "Mailbox entries the engine skipped mid-write")
        steps = CounterMetricFamily("hotwire_engine_steps", "Engine steps hotwire routed")
        host = CounterMetricFamily("hotwire_engine_host_seconds",
                                   "Time hotwire's per-step work held the engine's step thread")
        if view is not None:
            resident.add_metric([], sum(self.slots.residency(r, view).resident for r in records))
            used.add_metric([], view.table.used)
            total.add_metric([], view.table.n_slots)
            heartbeat.add_metric([], view.heartbeat_age_s)
            lag.add_metric([], max(0, view.target_gen - view.applied_gen))
            by_name = {"steered_requests": steered, "mailbox_rows_applied": applied,
                       "mailbox_torn_reads": torn}
            counters = view.counters
            for name, value in counters.items():
                if name.startswith(UNSTEERED):
                    unsteered.add_metric([name[len(UNSTEERED):]], value)
                elif name in by_name:
                    by_name[name].add_metric([], value)
            steps.add_metric([], counters["steps"])
            host.add_metric([], counters["host_ns"] / 1e9)
        yield from (resident, used, total, heartbeat, lag, steered, unsteered, applied, torn, steps, host)
        yield CounterMetricFamily("hotwire_evicted_vectors", "Vectors evicted to make room",
                                  value=self.slots.evicted_total)
        yield CounterMetricFamily("hotwire_adopted_vectors",
                                  "Engine vectors the catalog did not know, adopted into it",
                                  value=self.slots.adopted_total)


class Metrics:
    def __init__(self, catalog: CatalogStore, slots: SlotManager):
        self.registry = CollectorRegistry()
        self.uploads = Counter("hotwire_uploads", "Vector uploads by HTTP status", ["status"],
                               registry=self.registry)
        self.registry.register(StateCollector(catalog, slots))

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
