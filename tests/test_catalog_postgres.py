"""The PostgreSQL catalog: the SQLite catalog's contract, shared by the control APIs of replicas.

All real: a PostgreSQL server of the test's own (:mod:`pg_cluster`), real engine mailboxes
driven by :class:`EnginePump`, control APIs served over HTTP (in-process uvicorn, and one
``hotwire control-api`` subprocess for the kill -9 test).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pydantic import SecretStr

from hotwire.control_api.catalog import Catalog
from hotwire.control_api.catalog_postgres import PostgresCatalog, ReplicaResidence, Residence
from hotwire.control_api.catalog_store import CatalogStore

from control_harness import FP, TOKEN, EnginePump, Rig, exact_vector, json_body, wait_until
from pg_cluster import PASSWORD, PgCluster, why_unavailable
from servers import ControlApi

H = FP.hidden
pytestmark = pytest.mark.skipif(why_unavailable() is not None, reason=str(why_unavailable()))
_names = itertools.count()


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    cluster = PgCluster()
    yield cluster
    cluster.destroy()


@pytest.fixture
def dsn(pg: PgCluster) -> str:
    """A fresh database of the cluster, so tests share no catalog."""
    return pg.database(f"t{next(_names)}")


@pytest.fixture(params=["sqlite", "postgres"])
def open_catalog(request, tmp_path) -> Iterator[Callable[[], CatalogStore]]:
    """Opens the same catalog again each call, on the backend of the parameter."""
    opened: list[CatalogStore] = []

    def open_one() -> CatalogStore:
        if request.param == "sqlite":
            catalog: CatalogStore = Catalog(tmp_path / "catalog.sqlite3")
        else:
            catalog = PostgresCatalog(request.getfixturevalue("dsn"))
        opened.append(catalog)
        return catalog

    yield open_one
    for catalog in opened:
        catalog.close()


def test_backends_keep_one_contract(open_catalog):
    """The same body over SQLite and PostgreSQL: generations, deletes, adoption, reopening."""
    cat = open_catalog()
    assert cat.records() == {} and cat.get("a") is None and cat.high_water("a") is None
    assert cat.problem() is None
    v = exact_vector(FP.n_layers, H, seed=1)
    first = cat.put("a", v, dtype="bfloat16", layers=(0, 2), pinned=True,
                    metadata={"who": "me", "n": [1, 2]})
    assert (first.generation, first.shape, first.layers, first.pinned) == (
        1, (FP.n_layers, H), (0, 2), True)
    assert first.metadata == {"who": "me", "n": [1, 2]} and first.dtype == "bfloat16"
    assert cat.get("a") == first and cat.records() == {"a": first} and cat.high_water("a") == 1
    np.testing.assert_array_equal(cat.load("a"), v)

    time.sleep(0.01)
    second = cat.put("a", 2 * v, dtype="float32", layers=None, pinned=False, metadata={})
    assert second.generation == 2 and second.layers is None and not second.pinned
    assert second.created_at == first.created_at < second.updated_at
    np.testing.assert_array_equal(cat.load("a"), 2 * v)

    assert cat.delete("a") is True and cat.delete("a") is False
    assert cat.get("a") is None and cat.records() == {} and cat.high_water("a") == 2
    with pytest.raises(KeyError):
        cat.load("a")
    third = cat.put("a", v, dtype="float32", layers=None, pinned=False, metadata={})
    assert third.generation == 3 and third.created_at > second.updated_at  # a new life

    cat.reserve_generation("a", 10)
    cat.reserve_generation("b", 5)
    cat.reserve_generation("b", 3)
    assert (cat.high_water("a"), cat.high_water("b")) == (10, 5)
    assert cat.get("a").generation == 3
    assert cat.put("a", v, dtype="float32", layers=None, pinned=False, metadata={}).generation == 11
    assert cat.put("b", v, dtype="float32", layers=None, pinned=False, metadata={}).generation == 6

    flat = exact_vector(H, seed=2)
    adopted = cat.put("c", flat, dtype="float32", layers=None, pinned=True, metadata={"x": 1},
                      generation=7)
    assert adopted.generation == 7 and cat.high_water("c") == 7
    for stale in (7, 4):
        with pytest.raises(ValueError):
            cat.put("c", flat, dtype="float32", layers=None, pinned=True, metadata={},
                    generation=stale)
    assert cat.get("c") == adopted
    assert cat.put("c", flat, dtype="float32", layers=None, pinned=False,
                   metadata={}).generation == 8
    assert cat.put("c", flat, dtype="float32", layers=None, pinned=False, metadata={},
                   generation=20).generation == 20
    cat.put("d", flat, dtype="float32", layers=None, pinned=False, metadata={})
    cat.delete("d")

    before = cat.records()
    cat.close()
    again = open_catalog()
    assert again.records() == before and sorted(before) == ["a", "b", "c"]
    assert [again.high_water(i) for i in "abcd"] == [11, 6, 20, 1]
    np.testing.assert_array_equal(again.load("c"), flat)
    assert again.put("d", flat, dtype="float32", layers=None, pinned=False,
                     metadata={}).generation == 2


def test_two_catalogs_on_one_database_follow_each_other(dsn, pg):
    """Notifications carry every write to the other catalog; generations stay unique under
    concurrent writers; a missed notification (listener cut) and a write that sent none are
    caught by the catalog-wide poll."""
    a, b = PostgresCatalog(dsn, poll_s=0.5), PostgresCatalog(dsn, poll_s=0.5)
    try:
        v = exact_vector(H, seed=3)
        record = a.put("x", v, dtype="float32", layers=None, pinned=False, metadata={"k": 1})
        wait_until(lambda: b.get("x") == record, 2, "b to see a's put")
        np.testing.assert_array_equal(b.load("x"), v)
        b.delete("x")
        wait_until(lambda: a.get("x") is None, 2, "a to see b's delete")
        assert a.high_water("x") == 1

        generations: list[int] = []

        def writer(cat: PostgresCatalog) -> None:
            for _ in range(15):
                generations.append(cat.put("race", v, dtype="float32", layers=None, pinned=False,
                                           metadata={}).generation)

        threads = [threading.Thread(target=writer, args=(cat,)) for cat in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(generations) == list(range(1, 31))
        wait_until(lambda: a.get("race") == b.get("race") and a.get("race").generation == 30, 2,
                   "both to hold the last write")

        with psycopg.connect(pg.dsn(dsn.rsplit("/", 1)[1]), autocommit=True) as conn:
            cut = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE application_name = 'hotwire-listener'").fetchall()
            assert len(cut) == 2
            a.put("while_cut", v, dtype="float32", layers=None, pinned=False, metadata={})
            wait_until(lambda: b.get("while_cut") is not None, 5, "b to catch up after a cut")
            with conn.transaction():  # a write by something that sends no notification
                (seq,) = conn.execute("UPDATE hotwire_catalog_state SET seq = seq + 1 "
                                      "RETURNING seq").fetchone()
                conn.execute("UPDATE hotwire_vectors SET pinned = true WHERE id = 'while_cut'")
                conn.execute("UPDATE hotwire_generations SET changed_seq = %s "
                             "WHERE id = 'while_cut'", (seq,))
        wait_until(lambda: a.get("while_cut").pinned and b.get("while_cut").pinned, 3,
                   "the poll to find an unnotified write")
    finally:
        a.close()
        b.close()


def test_residency_reports_are_per_replica(dsn):
    """Each replica publishes where the catalog's vectors stand on its engine; any replica reads
    every replica's report of a vector, including the ones that do not hold it."""
    a, b = PostgresCatalog(dsn), PostgresCatalog(dsn)
    try:
        a.publish_residency("a", {"x": Residence(1, "resident"), "y": Residence(2, "resident")})
        b.publish_residency("b", {"x": Residence(1, "not_resident", "no room: 8 of 8 pinned")})
        assert [(r.replica, r.generation, r.state, r.reason) for r in b.residency("x")] == [
            ("a", 1, "resident", None), ("b", 1, "not_resident", "no room: 8 of 8 pinned")]
        assert [(r.replica, r.state) for r in a.residency("y")] == [("a", "resident"), ("b", None)]
        assert all(isinstance(r, ReplicaResidence) and 0 <= r.age_s < 5 for r in a.residency("y"))

        a.publish_residency("a", {"x": Residence(3, "resident")})  # y deleted, x replaced
        b.publish_residency("b", {"x": Residence(3, "resident")})
        assert [(r.replica, r.generation, r.state) for r in b.residency("x")] == [
            ("a", 3, "resident"), ("b", 3, "resident")]
        assert [r.state for r in b.residency("y")] == [None, None]

        time.sleep(0.3)
        b.publish_residency("b", {"x": Residence(3, "resident")}, forget_after_s=0.2)
        assert [r.replica for r in a.residency("x")] == ["b"]  # a went silent: forgotten
        a.publish_residency("a", {"x": Residence(3, "resident")})  # unchanged, but forgotten
        assert [(r.replica, r.state) for r in b.residency("x")] == [("a", "resident"),
                                                                    ("b", "resident")]
    finally:
        a.close()
        b.close()


# Replicas: control APIs with an engine each, on one PostgreSQL ------------------------------

def _replica(tmp_path: Path, name: str, dsn: str) -> Rig:
    rig = Rig(tmp_path / name, catalog_dsn=SecretStr(dsn))
    rig.start_engine(n_slots=32)
    rig.start_api()
    return rig


def _catalog(rig: Rig) -> PostgresCatalog:
    catalog = rig.server.server.config.app.state.services.catalog
    assert isinstance(catalog, PostgresCatalog)
    return catalog


def _applied(engine: EnginePump, vector_id: str, generation: int,
             vector: np.ndarray | None = None) -> bool:
    """The engine has applied ``vector_id`` at ``generation`` (its row, when given, exact)."""
    entries = engine.entries(vector_id)
    if not entries or any(gen != generation for _, gen, _ in entries.values()):
        return False
    if any(engine.bound.get(slot) != vector_id for slot, _, _ in entries.values()):
        return False
    return vector is None or all(np.array_equal(row, vector) for _, _, row in entries.values())


@pytest.fixture
def replicas(tmp_path, dsn) -> Iterator[tuple[Rig, Rig]]:
    a, b = _replica(tmp_path, "a", dsn), _replica(tmp_path, "b", dsn)
    yield a, b
    a.stop()
    b.stop()


def test_push_to_one_replica_reaches_every_engine(replicas):
    """Pushes alternate between the replicas; each is timed from its 2xx to the other engine
    having applied it. Replace and delete travel the same way."""
    a, b = replicas
    waits = []
    for i in range(20):
        source, other = (a, b) if i % 2 == 0 else (b, a)
        vector = exact_vector(H, seed=100 + i)
        response = source.push(f"v{i}", vector)
        done = time.perf_counter()
        assert response.status_code == 201, response.text
        generation = response.json()["generation"]
        wait_until(lambda: _applied(other.engine, f"v{i}", generation, vector), 5,
                   f"v{i} on the other replica's engine")
        waits.append(time.perf_counter() - done)
        assert _applied(source.engine, f"v{i}", generation, vector)
    p50, p99 = np.percentile(waits, 50) * 1e3, np.percentile(waits, 99) * 1e3
    print(f"\nreplica convergence over {len(waits)} pushes: p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
          f"max {max(waits) * 1e3:.0f} ms")

    replaced = exact_vector(H, seed=999)
    response = b.push("v0", replaced, replace=True)
    assert response.status_code == 200 and response.json()["generation"] == 2
    wait_until(lambda: _applied(a.engine, "v0", 2, replaced), 5, "the replace on a's engine")
    assert a.http.delete("/steer/vectors/v1").status_code == 204
    wait_until(lambda: not b.engine.entries("v1"), 5, "the delete to retire b's slots")
    assert b.http.get("/steer/vectors/v1").status_code == 404
    assert a.catalog().keys() == b.catalog().keys() == {f"v{i}" for i in range(20)} - {"v1"}
    assert b.http.get("/readyz").json() == {"ready": True, "reason": None}


def test_killed_replica_leaves_the_other_serving_and_converges_on_restart(tmp_path, dsn):
    """kill -9 one control API (a process of its own); the other keeps accepting pushes; the
    restarted one brings its still-running engine to the shared catalog."""
    a = _replica(tmp_path, "a", dsn)
    engine_b = EnginePump(tmp_path / "b" / "shm" / "engine.mbx", n_slots=32)
    api_b = ControlApi(tmp_path / "b", engine_b.path, token=TOKEN, HOTWIRE_CATALOG_DSN=dsn,
                       HOTWIRE_HEARTBEAT_TIMEOUT_S="3")
    try:
        api_b.start(timeout=60)
        kept, gone = exact_vector(H, seed=1), exact_vector(H, seed=2)
        for name, vector in (("kept", kept), ("gone", gone)):
            assert a.push(name, vector).status_code == 201
            wait_until(lambda: _applied(engine_b, name, 1, vector), 5, f"{name} on b")

        api_b.kill()
        late = exact_vector(H, seed=3)
        assert a.push("late", late).status_code == 201
        assert a.http.delete("/steer/vectors/gone").status_code == 204
        assert a.http.get("/readyz").status_code == 200
        assert set(a.catalog()) == {"kept", "late"}
        assert _applied(engine_b, "gone", 1) and not engine_b.entries("late")  # nobody feeds b

        api_b.start(timeout=60)
        wait_until(lambda: _applied(engine_b, "late", 1, late) and not engine_b.entries("gone"), 5,
                   "the restarted replica to converge")
        assert _applied(engine_b, "kept", 1, kept)
        after = exact_vector(H, seed=4)
        response = api_b.api().post("/steer/vectors", json=json_body("after", after))
        assert response.status_code == 201, response.text
        wait_until(lambda: _applied(a.engine, "after", 1, after), 5, "b's push on a's engine")
    finally:
        api_b.stop()
        engine_b.stop()
        a.stop()


def test_postgres_restart_and_outage_lose_nothing(replicas, pg, caplog):
    """pg_ctl restart: both replicas reconnect, every vector stays, the next push reaches both.
    While the server is down: unready, writes 503, reads from memory, engines keep their
    vectors; once it is back, pushes flow again. The DSN's password is never logged."""
    caplog.set_level(logging.INFO, logger="hotwire")
    a, b = replicas
    one, two, three = (exact_vector(H, seed=s) for s in (11, 12, 13))
    assert a.push("one", one).status_code == 201
    wait_until(lambda: _applied(b.engine, "one", 1, one), 5, "one on b")

    pg.restart()
    for rig in (a, b):
        wait_until(lambda: _catalog(rig).problem() is None, 10, "the listener to reconnect")
    response = b.push("two", two)  # its writer connection was cut: retried on a new one
    assert response.status_code == 201, response.text
    for rig in (a, b):
        wait_until(lambda: _applied(rig.engine, "two", 1, two), 5, "two on both engines")
        assert _applied(rig.engine, "one", 1, one) and set(rig.catalog()) == {"one", "two"}

    pg.stop()
    try:
        for rig in (a, b):
            wait_until(lambda: _catalog(rig).problem() is not None, 10, "the outage to be seen")
            ready = rig.http.get("/readyz")
            assert ready.status_code == 503 and "unreachable" in ready.json()["reason"]
        refused = a.push("three", three)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] in ("catalog_unavailable", "catalog_lost")
        assert set(b.catalog()) == {"one", "two"}
        time.sleep(0.5)  # a few reconcile passes: nothing may be retired for want of a catalog
        for rig in (a, b):
            assert _applied(rig.engine, "one", 1, one) and _applied(rig.engine, "two", 1, two)
    finally:
        pg.start()
    for rig in (a, b):
        wait_until(lambda: rig.http.get("/readyz").status_code == 200, 15, "readiness again")
    assert a.push("three", three).status_code == 201
    wait_until(lambda: _applied(b.engine, "three", 1, three), 5, "three on b")
    assert set(a.catalog()) == set(b.catalog()) == {"one", "two", "three"}
    assert any("unreachable" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    assert not [r for r in caplog.records if PASSWORD in r.getMessage()]
