"""Data parallelism: one control API feeds every DP rank of an engine (``<mailbox>.dpN``).

Real mailboxes (one :class:`EnginePump` per rank, doing what each rank's engine core does),
the real control API over HTTP (control_api.slots.engines). Also: the single-engine shape keeps
its responses.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from hotwire.control_api.cli.main import main
from hotwire.shared.mailbox import ANY_LAYER, ControlMailbox, clock_ns

from control_harness import FP, TOKEN, EnginePump, Rig, exact_vector, wait_until

H = FP.hidden


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path)
    yield rig
    rig.stop()


def _dp2(rig: Rig, rank1_slots: int = 8) -> tuple[EnginePump, EnginePump]:
    rig.start_engine()
    rig.start_rank(1, n_slots=rank1_slots)
    rig.start_api()
    wait_until(lambda: len(rig.http.get("/steer/slots").json().get("ranks", [])) == 2,
               what="both ranks attached")
    return rig.engine, rig.ranks[1]


def _holds(engine: EnginePump, vector_id: str, vector: np.ndarray, generation: int = 1) -> bool:
    """The engine applied exactly ``vector``'s rows under ``generation``."""
    entries = engine.entries(vector_id)
    if vector.ndim == 1:
        expected = {ANY_LAYER: vector}
    else:
        expected = {layer: vector[layer] for layer in range(FP.n_layers)}
    return (set(entries) == set(expected)
            and all(gen == generation and engine.bound.get(slot) == vector_id
                    and np.array_equal(row, expected[layer])
                    for layer, (slot, gen, row) in entries.items()))


def test_a_push_is_written_to_every_rank(rig):
    rank0, rank1 = _dp2(rig)
    per_layer, flat = exact_vector(FP.n_layers, H, seed=1), exact_vector(H, seed=2)
    for name, vector in (("per_layer", per_layer), ("flat", flat)):
        r = rig.push(name, vector)
        assert r.status_code == 201, r.text
        info = r.json()
        assert [(x["dp_rank"], x["state"]) for x in info["ranks"]] == [(0, "resident"),
                                                                     (1, "resident")]
        assert info["resident"] and info["state"] == "resident"
    for engine in (rank0, rank1):
        wait_until(lambda: _holds(engine, "per_layer", per_layer) and _holds(engine, "flat", flat),
                   what="rows applied on both ranks")

    table = rig.http.get("/steer/slots").json()
    assert table["dp_rank"] == 0 and table["engine"]["epoch"] == f"{rank0.box.epoch:x}"
    assert [(r["dp_rank"], r["attached"], r["problem"], r["used"]) for r in table["ranks"]] == \
        [(0, True, None, FP.n_layers + 1), (1, True, None, FP.n_layers + 1)]
    assert table["ranks"][1]["engine"]["epoch"] == f"{rank1.box.epoch:x}"
    assert table["ranks"][1]["mailbox"] == str(rank1.path)
    assert table["slots"] == table["ranks"][0]["slots"]
    assert rig.http.get("/readyz").json() == {"ready": True, "reason": None}

    rank1.box.add_counter("steered_requests", 5)
    rank1.box.flush_counters()
    m = rig.metrics()
    for rank in ("0", "1"):
        assert m[("hotwire_slots_used", (("dp_rank", rank),))] == FP.n_layers + 1
        assert m[("hotwire_resident_vectors", (("dp_rank", rank),))] == 2
        assert m[("hotwire_engine_attached", (("dp_rank", rank),))] == 1
    assert m[("hotwire_engine_steered_requests_total", (("dp_rank", "1"),))] == 5
    assert m[("hotwire_engine_steered_requests_total", (("dp_rank", "0"),))] == 0
    assert m[("hotwire_catalog_vectors", ())] == 2


def test_ranks_start_in_any_order_and_restart_independently(rig):
    """Rank 1 appearing after the pushes, and restarting later (a new epoch), gets the whole
    catalog; rank 0 is not touched by either."""
    rig.start_engine()
    rig.start_api()
    vectors = {"a": exact_vector(H, seed=3), "b": exact_vector(FP.n_layers, H, seed=4)}
    for name, vector in vectors.items():
        assert rig.push(name, vector).status_code == 201
    wait_until(lambda: all(_holds(rig.engine, n, v) for n, v in vectors.items()))
    seqs = rig.engine.seqs()

    rank1 = rig.start_rank(1)
    wait_until(lambda: all(_holds(rank1, n, v) for n, v in vectors.items()), what="rank 1 fed")
    epoch = rank1.box.epoch
    rank1.restart()
    assert rank1.box.epoch != epoch and not rank1.entries("a")
    wait_until(lambda: all(_holds(rank1, n, v) for n, v in vectors.items()),
               what="restarted rank 1 fed again")
    wait_until(lambda: rig.http.get("/readyz").status_code == 200, what="ready")
    assert rig.engine.seqs() == seqs  # rank 0 kept its slots as they were
    info = rig.http.get("/steer/vectors/b").json()
    assert [(r["dp_rank"], r["resident"]) for r in info["ranks"]] == [(0, True), (1, True)]


def test_a_vector_that_fits_one_rank_and_not_another_is_refused_and_changes_nothing(rig):
    """507 names the rank without room; no rank gets a row, the catalog is unchanged, and
    nothing was evicted on the rank that had room."""
    rank0, rank1 = _dp2(rig, rank1_slots=2)
    small = exact_vector(H, seed=5)
    assert rig.push("small", small).status_code == 201
    wait_until(lambda: _holds(rank0, "small", small) and _holds(rank1, "small", small))
    rank1.hold("small")  # busy on rank 1: not evictable there
    seqs = (rank0.seqs(), rank1.seqs())

    r = rig.push("big", exact_vector(FP.n_layers, H, seed=6))
    assert r.status_code == 507, r.text
    error = r.json()["error"]
    assert error["code"] == "no_space"
    assert "dp rank 1: no room for 4 slot(s) of 2" in error["message"]
    assert "dp rank 0" not in error["message"] and "catalog is unchanged" in error["message"]
    assert set(rig.catalog()) == {"small"}
    time.sleep(0.3)  # a reconcile pass or two
    assert (rank0.seqs(), rank1.seqs()) == seqs and not rank0.entries("big")


def test_a_rank_with_a_smaller_budget_after_a_restart_is_reported_per_rank(rig):
    rank0, rank1 = _dp2(rig)
    pinned, other = exact_vector(H, seed=7), exact_vector(FP.n_layers, H, seed=8)
    assert rig.push("pinned", pinned, pin=True).status_code == 201
    assert rig.push("other", other).status_code == 201
    rank1.restart(n_slots=2)
    wait_until(lambda: _holds(rank1, "pinned", pinned), what="pinned vector on rank 1")
    wait_until(lambda: not rig.resident("other"), what="other reported missing")
    info = rig.http.get("/steer/vectors/other").json()
    assert (info["resident"], info["state"]) == (False, "not_resident")
    assert info["reason"].startswith("dp rank 1: waiting for free slots")
    assert [(r["dp_rank"], r["state"]) for r in info["ranks"]] == [(0, "resident"),
                                                                 (1, "not_resident")]
    assert len(info["slots"]) == FP.n_layers and info["ranks"][1]["slots"] == []
    wait_until(lambda: _holds(rank0, "other", other), what="rank 0 applying other")
    assert not rank1.entries("other")
    assert rig.resident("pinned")


def test_a_delete_retires_on_every_rank(rig):
    rank0, rank1 = _dp2(rig)
    vector = exact_vector(FP.n_layers, H, seed=9)
    assert rig.push("gone", vector).status_code == 201
    wait_until(lambda: _holds(rank0, "gone", vector) and _holds(rank1, "gone", vector))
    assert rig.http.delete("/steer/vectors/gone").status_code == 204
    for engine in (rank0, rank1):
        wait_until(lambda: not engine.entries("gone") and "gone" not in engine.bound.values(),
                   what="retired and acked on both ranks")


def test_eviction_and_two_phase_reuse_run_per_rank(rig):
    """A full rank evicts its least recently used idle vector and reuses the slot only once
    its engine acked; the other rank, with room, evicts nothing."""
    rank0, rank1 = _dp2(rig, rank1_slots=1)
    old, new = exact_vector(H, seed=10), exact_vector(H, seed=11)
    assert rig.push("old", old).status_code == 201
    wait_until(lambda: _holds(rank1, "old", old))
    rank1.paused.set()  # rank 1's engine does not ack the eviction yet
    with_ack = []

    def push() -> None:
        with_ack.append(rig.push("new", new))

    upload = threading.Thread(target=push)
    upload.start()
    time.sleep(0.3)
    assert upload.is_alive(), "rank 1's slot reused before its engine acknowledged"
    rank1.paused.clear()
    upload.join(5)
    assert with_ack[0].status_code == 201, with_ack[0].text
    wait_until(lambda: _holds(rank1, "new", new) and not rank1.entries("old"))
    wait_until(lambda: _holds(rank0, "old", old) and _holds(rank0, "new", new),
               what="rank 0 applying both (its engine applies on its own clock)")
    m = rig.metrics()
    assert m[("hotwire_evicted_vectors_total", (("dp_rank", "1"),))] == 1
    assert m[("hotwire_evicted_vectors_total", (("dp_rank", "0"),))] == 0
    info = rig.http.get("/steer/vectors/old").json()
    assert [(r["dp_rank"], r["state"]) for r in info["ranks"]] == [(0, "resident"),
                                                                 (1, "not_resident")]


def test_readyz_considers_every_rank_and_a_removed_rank_is_forgotten(rig):
    _, rank1 = _dp2(rig)
    rank1.paused.set()
    rank1.box.beat(at_ns=clock_ns() - 60 * 10**9)
    r = rig.http.get("/readyz")
    assert r.status_code == 503 and r.json()["reason"].startswith("dp rank 1: engine heartbeat")
    rank1.stop()
    rank1.path.unlink()  # the operator removes the mailbox of a rank that is gone
    wait_until(lambda: rig.http.get("/readyz").status_code == 200, what="rank 1 forgotten")
    assert [r["dp_rank"] for r in rig.http.get("/steer/slots").json()["ranks"]] == [0]
    assert ("hotwire_engine_attached", (("dp_rank", "1"),)) not in rig.metrics()


def test_a_vector_adopted_from_one_rank_reaches_the_others(rig, caplog):
    """Adoption runs per engine: a vector only rank 1 holds (a catalog that lost it) enters the
    catalog once, under rank 1's generation, and is pushed to rank 0."""
    rig.start_engine()
    rank1 = rig.start_rank(1)
    ghost = exact_vector(H, seed=12)
    box = ControlMailbox.attach(str(rank1.path))
    box.write(3, "ghost", ANY_LAYER, ghost, gen=4)
    box.close()
    with caplog.at_level(logging.WARNING, logger="hotwire.control_api"):
        rig.start_api()
        wait_until(lambda: _holds(rig.engine, "ghost", ghost, generation=4), what="on rank 0")
    info = rig.catalog()["ghost"]
    assert info["generation"] == 4 and info["metadata"]["adopted"]["mailbox"] == str(rank1.path)
    assert rank1.entries("ghost")[ANY_LAYER][:2] == (3, 4)  # kept in place on rank 1
    adopted = [r for r in caplog.records if r.getMessage().startswith("adopted ghost")]
    assert len(adopted) == 1 and "(dp rank 1)" in adopted[0].getMessage()


def test_uploads_wait_for_a_starting_rank_only_through_the_reconciler(rig):
    """A rank that has not armed yet takes no upload (the others do, 201) and gets the vector
    when it arms; until then the vector is not resident there, and said so."""
    rig.start_engine()
    rank1 = rig.start_rank(1, armed=())
    rig.start_api()
    vector = exact_vector(H, seed=13)
    r = rig.push("v", vector)
    assert r.status_code == 201, r.text
    assert [(x["dp_rank"], x["state"]) for x in r.json()["ranks"]] == [(0, "resident"),
                                                                     (1, "not_resident")]
    assert "dp rank 1: the engine has not armed" in r.json()["reason"]
    assert rig.http.get("/readyz").status_code == 503
    rank1.box.set_armed(list(range(FP.n_layers)), entries=4)
    wait_until(lambda: _holds(rank1, "v", vector), what="pushed once rank 1 armed")
    assert rig.resident("v")


def test_without_dp_responses_keep_their_fields_and_add_one_rank(rig):
    rig.start_engine()
    rig.start_api(replica="replica-7")
    r = rig.push("x", exact_vector(H, seed=14))
    assert r.status_code == 201
    assert r.json()["reason"] is None and r.json()["replicas"] is None
    info = rig.http.get("/steer/vectors/x").json()
    assert [(x["dp_rank"], x["state"]) for x in info["ranks"]] == [(0, "resident")]
    assert info["ranks"][0]["slots"] == info["slots"]
    assert info["replicas"] == [{"replica": "replica-7", "generation": 1, "state": "resident",
                                 "reason": None, "age_s": 0.0, "stale": False}]
    table = rig.http.get("/steer/slots").json()
    assert table["dp_rank"] == 0 and [r["dp_rank"] for r in table["ranks"]] == [0]
    rig.engine.stop()
    rig.settings.mailbox.unlink()
    r = wait_until(lambda: (x := rig.http.get("/steer/slots")).status_code == 503 and x)
    assert r.json()["error"]["code"] == "no_engine" and "no mailbox" in r.json()["error"]["message"]
    assert "dp rank" not in rig.http.get("/readyz").json()["reason"]


def test_hotwire_slots_prints_each_rank(rig, capsys):
    _, rank1 = _dp2(rig)
    assert rig.push("x", exact_vector(H, seed=15)).status_code == 201
    wait_until(lambda: rank1.entries("x"))
    capsys.readouterr()
    assert main(["slots", "--url", rig.server.url, "--token", TOKEN]) == 0
    out = capsys.readouterr().out
    assert out.count(FP.model) == 2 and out.count("slots 1/8 used") == 2
    assert f"dp rank 1  {rank1.path}" in out and f"dp rank 0  {rig.settings.mailbox}" in out
