"""What the engine counts, declared once.

Each :class:`EngineCounter` is one slot of the mailbox's counter array (its index is its place
in :data:`ENGINE_COUNTERS`, so counters are only ever appended), one count of the engine
(``engine_plugin.counters``) and, where ``metric`` is set, one series of the control API's
``/metrics`` (``control_api.api.metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineCounter:
    name: str
    help: str
    metric: str | None = None  # the control API's counter family; None: in the mailbox only
    label: str | None = None  # this counter's value of the family's label (see LABELLED)
    seconds: bool = False  # counted in nanoseconds, exposed in seconds
    step_time: bool = False  # counted on the step thread, copied to the mailbox by the heartbeat


UNSTEERED = "hotwire_engine_unsteered_requests"
HOOK_HOST = "hotwire_engine_hook_host_seconds"
# Families that hold several counters, told apart by one label: family -> (label, help).
LABELLED = {
    UNSTEERED: ("reason", "Requests run unsteered, by reason"),
    HOOK_HOST: ("hook", "hotwire_engine_host_seconds by per-step hook: core (the engine core's "
                "schedule hook), schedule and batch (the rank's, where it shares the core's "
                "process)"),
}


def _unsteered(reason: str, why: str) -> EngineCounter:
    return EngineCounter(f"unsteered_{reason}", why, UNSTEERED, reason)


def _hook(hook: str, where: str) -> EngineCounter:
    return EngineCounter(f"host_ns_{hook}", f"host_ns in {where}", HOOK_HOST, hook, seconds=True,
                         step_time=True)


ENGINE_COUNTERS = (
    EngineCounter("steered_requests", "Requests that arrived with a valid, resolvable spec",
                  "hotwire_engine_steered_requests"),
    _unsteered("malformed", "the spec did not parse"),
    _unsteered("unknown_id", "an entry named an id/layer that holds no vector"),
    _unsteered("unarmed_layer", "an entry named a layer the engine did not arm"),
    _unsteered("too_many_entries", "more entries on one layer than the routing table holds"),
    _unsteered("table_full", "no free request row (more steered requests than the table holds)"),
    EngineCounter("mailbox_rows_applied", "Mailbox rows the engine copied into its bank",
                  "hotwire_engine_mailbox_rows_applied"),
    EngineCounter("mailbox_torn_reads", "Mailbox entries the engine skipped mid-write",
                  "hotwire_engine_mailbox_torn_reads"),
    EngineCounter("steps", "Engine steps hotwire routed", "hotwire_engine_steps", step_time=True),
    EngineCounter("host_ns", "Time hotwire's per-step work held the engine's step thread",
                  "hotwire_engine_host_seconds", seconds=True, step_time=True),
    _unsteered("out_of_range", "the spec could overflow the stream (engine_plugin.stream_bound)"),
    EngineCounter("mailbox_rejected", "directory entries refused as corrupt (bad state, id, "
                  "layer or row)"),
    EngineCounter("mailbox_errors", "the mailbox file became unreadable (truncated, removed); "
                  "sync stopped"),
    _unsteered("too_large", "the spec's text is longer than a spec may be"),
    _unsteered("bad_params", "a mode's parameters contradict each other (a clamp with lo > hi)"),
    _unsteered("zero_vector", "a projecting mode (norm, ablate, clamp) named a zero vector"),
    _unsteered("preset_unresolved", "a {\"preset\": ...} item reached the engine unexpanded"),
    _unsteered("unarmed_projection", "a projecting mode or probe on a layer not in "
               "HOTWIRE_PROJECTION_LAYERS"),
    EngineCounter("gate_opened_tokens", "Tokens for which a gated entry's gate opened",
                  "hotwire_engine_gate_opened_tokens"),
    _hook("core", "the engine core's schedule hook (mailbox, step delta, admissions)"),
    _hook("schedule", "the rank's on_schedule (delta into the bank, admissions), where it "
          "shares the core's process"),
    _hook("batch", "the rank's on_batch (routing, graph choice), where it shares the core's "
          "process"),
    EngineCounter("steps_changed", "Engine steps in which requests arrived or left, or the batch's "
                  "requests changed",
                  "hotwire_engine_changed_steps", step_time=True),
    EngineCounter("host_ns_changed", "The part of hotwire_engine_host_seconds spent in those steps",
                  "hotwire_engine_changed_host_seconds", seconds=True, step_time=True),
    EngineCounter("heartbeat_ns", "CPU time of the engine's hotwire heartbeat thread",
                  "hotwire_engine_heartbeat_cpu_seconds", seconds=True, step_time=True),
)
STEP_TIME = tuple(c.name for c in ENGINE_COUNTERS if c.step_time)
