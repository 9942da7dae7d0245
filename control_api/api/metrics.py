"""Prometheus metrics: read from the catalog and the mailboxes at scrape time, plus upload results.

Engine metrics carry a ``dp_rank`` label (``"0"`` for an engine without data parallelism), one
series per rank the control API feeds; catalog metrics and upload counts have none. Each app has
its own registry, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .catalog_store import CatalogStore
from .engines import Engines

UNSTEERED = "unsteered_"
HOOKS = ("core", "schedule", "batch")  # hotwire's per-step hooks (engine_plugin.counters)


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
        steered = CounterMetricFamily("hotwire_engine_steered_requests",
                                      "Requests that arrived with a valid, resolvable spec",
                                      labels=rank)
        unsteered = CounterMetricFamily("hotwire_engine_unsteered_requests",
                                        "Requests run unsteered, by reason",
                                        labels=[*rank, "reason"])
        applied = CounterMetricFamily("hotwire_engine_mailbox_rows_applied",
                                      "Mailbox rows the engine copied into its bank", labels=rank)
        torn = CounterMetricFamily("hotwire_engine_mailbox_torn_reads",
                                   "Mailbox entries the engine skipped mid-write", labels=rank)
        steps = CounterMetricFamily("hotwire_engine_steps", "Engine steps hotwire routed",
                                    labels=rank)
        host = CounterMetricFamily("hotwire_engine_host_seconds",
                                   "Time hotwire's per-step work held the engine's step thread",
                                   labels=rank)
        hooks = CounterMetricFamily("hotwire_engine_hook_host_seconds",
                                    "hotwire_engine_host_seconds by per-step hook: core (the engine core's "
                                    "schedule hook), schedule and batch (the rank's, where it shares the "
                                    "core's process)", labels=[*rank, "hook"])
        changed = CounterMetricFamily("hotwire_engine_changed_steps",
                                      "Engine steps in which requests arrived or left", labels=rank)
        changed_host = CounterMetricFamily("hotwire_engine_changed_host_seconds",
                                           "The part of hotwire_engine_host_seconds spent in those steps",
                                           labels=rank)
        heartbeat_cpu = CounterMetricFamily("hotwire_engine_heartbeat_cpu_seconds",
                                            "CPU time of the engine's hotwire heartbeat thread", labels=rank)
        gates = CounterMetricFamily("hotwire_engine_gate_opened_tokens",
                                    "Tokens for which a gated entry's gate opened", labels=rank)
        evicted = CounterMetricFamily("hotwire_evicted_vectors", "Vectors evicted to make room",
                                      labels=rank)
        adopted = CounterMetricFamily("hotwire_adopted_vectors",
                                      "Engine vectors the catalog did not know, adopted into it",
                                      labels=rank)
        by_name = {"steered_requests": steered, "mailbox_rows_applied": applied,
                   "mailbox_torn_reads": torn, "gate_opened_tokens": gates}
        for manager in self.engines:
            label = [str(manager.rank)]
            view = manager.view()
            attached.add_metric(label, int(view is not None))
            evicted.add_metric(label, manager.evicted_total)
            adopted.add_metric(label, manager.adopted_total)
            if view is None:
                continue
            resident.add_metric(label, sum(manager.residency(r, view).resident for r in records))
            used.add_metric(label, view.table.used)
            total.add_metric(label, view.table.n_slots)
            heartbeat.add_metric(label, view.heartbeat_age_s)
            lag.add_metric(label, max(0, view.target_gen - view.applied_gen))
            counters = view.counters
            for name, value in counters.items():
                if name.startswith(UNSTEERED):
                    unsteered.add_metric([*label, name[len(UNSTEERED):]], value)
                elif name in by_name:
                    by_name[name].add_metric(label, value)
            steps.add_metric(label, counters["steps"])
            host.add_metric(label, counters["host_ns"] / 1e9)
            for hook in HOOKS:
                hooks.add_metric([*label, hook], counters[f"host_ns_{hook}"] / 1e9)
            changed.add_metric(label, counters["steps_changed"])
            changed_host.add_metric(label, counters["host_ns_changed"] / 1e9)
            heartbeat_cpu.add_metric(label, counters["heartbeat_ns"] / 1e9)
        yield from (attached, resident, used, total, heartbeat, lag, steered, unsteered, applied,
                    torn, steps, host, hooks, changed, changed_host, heartbeat_cpu, gates, evicted, adopted)


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
