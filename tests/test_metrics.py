"""``/metrics`` (control_api.api.metrics): catalog, slot tables, the engine's counters as
hotwire.shared.engine_counters declares them, and upload results, from a real mailbox.
"""

from __future__ import annotations

from control_harness import FP, exact_vector, wait_until

H = FP.hidden


def test_metrics_expose_catalog_slots_engine_counters_and_uploads(rig):
    assert rig.push("m1", exact_vector(FP.n_layers, H)).status_code == 201
    assert rig.push("m2", exact_vector(H)).status_code == 201
    assert rig.push("m2", exact_vector(H)).status_code == 409
    rig.engine.box.add_counter("unsteered_unknown_id", 3)
    rig.engine.box.add_counter("steered_requests", 7)
    rig.engine.box.set_counter("steps", 40)
    rig.engine.box.set_counter("host_ns", 2_500_000_000)
    for name, ns in (("host_ns_core", 1_000_000_000), ("host_ns_schedule", 500_000_000),
                     ("host_ns_batch", 1_000_000_000), ("host_ns_changed", 2_000_000_000),
                     ("heartbeat_ns", 250_000_000)):
        rig.engine.box.set_counter(name, ns)
    rig.engine.box.set_counter("steps_changed", 4)
    rig.engine.box.flush_counters()  # as the engine's step or heartbeat does
    m = rig.metrics()
    RANK0 = (("dp_rank", "0"),)  # engine metrics are per data-parallel rank
    assert m[("hotwire_catalog_vectors", ())] == 2
    assert m[("hotwire_resident_vectors", RANK0)] == 2
    assert m[("hotwire_slots_used", RANK0)] == FP.n_layers + 1
    assert m[("hotwire_slots_capacity", RANK0)] == rig.engine.n_slots
    unsteered = "hotwire_engine_unsteered_requests_total"
    assert m[(unsteered, (*RANK0, ("reason", "unknown_id")))] == 3
    assert m[(unsteered, (*RANK0, ("reason", "malformed")))] == 0
    assert m[("hotwire_engine_steered_requests_total", RANK0)] == 7
    assert m[("hotwire_engine_steps_total", RANK0)] == 40
    assert m[("hotwire_engine_host_seconds_total", RANK0)] == 2.5
    hook = "hotwire_engine_hook_host_seconds_total"
    assert [m[(hook, (*RANK0, ("hook", h)))] for h in ("core", "schedule", "batch")] == [1.0, 0.5, 1.0]
    assert m[("hotwire_engine_changed_steps_total", RANK0)] == 4
    assert m[("hotwire_engine_changed_host_seconds_total", RANK0)] == 2.0
    assert m[("hotwire_engine_heartbeat_cpu_seconds_total", RANK0)] == 0.25
    assert m[("hotwire_uploads_total", (("code", "201"),))] == 2
    assert m[("hotwire_uploads_total", (("code", "409"),))] == 1
    assert 0 <= m[("hotwire_engine_heartbeat_age_seconds", RANK0)] < 3
    # The engine applies rows on its own clock: the counter must reach every row pushed.
    rows = ("hotwire_engine_mailbox_rows_applied_total", RANK0)
    wait_until(lambda: rig.metrics()[rows] >= FP.n_layers + 1, what="engine rows applied in /metrics")
