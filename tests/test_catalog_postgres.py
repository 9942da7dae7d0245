"""The PostgreSQL catalog: the SQLite catalog's contract, shared by the control APIs of replicas.

All real: a PostgreSQL server of the test's own (:mod:`pg_cluster`), real engine mailboxes
driven by :class:`EnginePump`, control APIs served over HTTP (in-process uvicorn, and one
``hotwire control-api`` subprocess for the kill -9 test).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pydantic import SecretStr

from hotwire.control_api.store.records import CatalogFull, StaleGeneration, VectorExists
from hotwire.control_api.store.sqlite import Catalog
from hotwire.control_api.store.postgres import PostgresCatalog
from hotwire.control_api.store.replica_board import ReplicaResidence, Residence
from hotwire.control_api.store.catalog import CatalogStore
from hotwire.shared.mailbox import ANY_LAYER, ControlMailbox
from hotwire.shared.wire import encode_safetensors

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
    # Adopting what the catalog holds at that generation is a no-op; an older one is refused.
    assert cat.put("c", flat, dtype="float32", layers=None, pinned=False, metadata={"y": 2},
                   generation=7) == adopted
    with pytest.raises(StaleGeneration):
        cat.put("c", flat, dtype="float32", layers=None, pinned=True, metadata={}, generation=4)
    assert cat.get("c") == adopted and cat.high_water("c") == 7
    # A create (replace=False) of an id with a record is refused and changes nothing.
    with pytest.raises(VectorExists) as exists:
        cat.put("c", v, dtype="float32", layers=None, pinned=False, metadata={}, replace=False)
    assert exists.value.generation == 7 and cat.get("c") == adopted and cat.high_water("c") == 7
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


def test_a_full_disk_on_the_database_server_is_storage_full_and_changes_nothing(dsn):
    """The server refuses a write for want of space with SQLSTATE 53100 (``disk_full``, "could not
    extend file"; raised here by a trigger, as the server raises it): that is 507 storage_full with
    nothing changed, not 503 catalog_unavailable, and the next write goes through."""
    catalog = PostgresCatalog(dsn)
    try:
        v = exact_vector(H, seed=5)
        before = catalog.put("a", v, dtype="float32", layers=None, pinned=False, metadata={})
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "RAISE EXCEPTION 'could not extend file: No space left on device' "
                         "USING ERRCODE = 'disk_full'; END $$")
            conn.execute("CREATE TRIGGER full_disk BEFORE INSERT OR UPDATE ON hotwire_vectors "
                         "FOR EACH ROW EXECUTE FUNCTION full_disk()")
            for vector_id in ("a", "b"):
                with pytest.raises(CatalogFull) as raised:
                    catalog.put(vector_id, 2 * v, dtype="float32", layers=None, pinned=False, metadata={})
                assert raised.value.code == "storage_full" and "No space left" in raised.value.message
            conn.execute("DROP TRIGGER full_disk ON hotwire_vectors")
        assert catalog.records() == {"a": before} and catalog.high_water("b") is None
        assert catalog.put("b", v, dtype="float32", layers=None, pinned=False, metadata={}).generation == 1
    finally:
        catalog.close()


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
    first, second = PostgresCatalog(dsn), PostgresCatalog(dsn)
    a, b = first.replica_board, second.replica_board
    try:
        a.publish("a", {"x": Residence(1, "resident"), "y": Residence(2, "resident")})
        b.publish("b", {"x": Residence(1, "not_resident", "no room: 8 of 8 pinned")})
        assert [(r.replica, r.generation, r.state, r.reason) for r in b.reports("x")] == [
            ("a", 1, "resident", None), ("b", 1, "not_resident", "no room: 8 of 8 pinned")]
        assert [(r.replica, r.state) for r in a.reports("y")] == [("a", "resident"), ("b", None)]
        assert all(isinstance(r, ReplicaResidence) and 0 <= r.age_s < 5 for r in a.reports("y"))

        a.publish("a", {"x": Residence(3, "resident")})  # y deleted, x replaced
        b.publish("b", {"x": Residence(3, "resident")})
        assert [(r.replica, r.generation, r.state) for r in b.reports("x")] == [
            ("a", 3, "resident"), ("b", 3, "resident")]
        assert [r.state for r in b.reports("y")] == [None, None]

        time.sleep(0.3)
        b.publish("b", {"x": Residence(3, "resident")}, forget_after_s=0.2)
        assert [r.replica for r in a.reports("x")] == ["b"]  # a went silent: forgotten
        a.publish("a", {"x": Residence(3, "resident")})  # unchanged, but forgotten
        assert [(r.replica, r.state) for r in b.reports("x")] == [("a", "resident"),
                                                                    ("b", "resident")]
    finally:
        first.close()
        second.close()


# Replicas: control APIs with an engine each, on one PostgreSQL ------------------------------

def _replica(tmp_path: Path, name: str, dsn: str, n_slots: int = 32) -> Rig:
    rig = Rig(tmp_path / name, catalog_dsn=SecretStr(dsn), replica=name)
    rig.start_engine(n_slots=n_slots)
    rig.start_api()
    return rig


def _catalog(rig: Rig) -> PostgresCatalog:
    catalog = rig.services().catalog
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
        for refused in (a.push("three", three), b.http.delete("/steer/vectors/one")):
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "catalog_unavailable"  # not lost: nothing to put back
            assert "unreachable" in error["message"] and "state directory" not in error["message"]
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
    # The residency publishers outlived the outage: b's report of three reaches a, fresh.
    wait_until(lambda: _report(a, "three")["b"]["state"] == "resident", 5, "b's report again")
    assert not _report(a, "three")["b"]["stale"]
    assert any("cannot publish the residency report of replica" in r.getMessage()
               for r in caplog.records)
    assert any("unreachable" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    assert not [r for r in caplog.records if PASSWORD in r.getMessage()]


# Residency across replicas, and races between replicas ---------------------------------------

def _report(rig: Rig, vector_id: str) -> dict[str, dict]:
    """``GET /steer/vectors/{id}``'s ``replicas``, by replica name."""
    response = rig.http.get(f"/steer/vectors/{vector_id}")
    assert response.status_code == 200, response.text
    return {r["replica"]: r for r in response.json()["replicas"]}


def _quiet_write(pg: PgCluster, dsn: str, vector_id: str, vector: np.ndarray, generation: int,
                 metadata: str = "{}") -> None:
    """Another replica's write whose notification (and catalog-wide seq) has not reached this
    one yet: the row and its generation, nothing else."""
    with psycopg.connect(pg.dsn(dsn.rsplit("/", 1)[1]), autocommit=True) as conn:
        now = time.time()
        conn.execute("INSERT INTO hotwire_generations (id, last, changed_seq) "
                     "VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET last = excluded.last",
                     (vector_id, generation))
        conn.execute("INSERT INTO hotwire_vectors (id, generation, dtype, shape, layers, pinned, "
                     "metadata, data, created_at, updated_at) VALUES (%s, %s, 'float32', %s, "
                     "NULL, false, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                     "generation = excluded.generation, data = excluded.data",
                     (vector_id, generation, json.dumps(list(vector.shape)), metadata,
                      encode_safetensors(vector), now, now))


def test_get_vector_says_on_which_replicas_it_is_resident(tmp_path, dsn):
    """A vector that fits one replica's engine and not the other's is reported per replica;
    a replica that stopped publishing keeps its last report, marked stale once it is about an
    older generation."""
    a, b = _replica(tmp_path, "a", dsn), _replica(tmp_path, "b", dsn, n_slots=2)
    try:
        big, small = exact_vector(FP.n_layers, H, seed=21), exact_vector(H, seed=22)
        assert a.push("big", big).status_code == 201
        assert b.push("small", small).status_code == 201
        wait_until(lambda: set(_report(a, "big")) == {"a", "b"}
                   and _report(a, "big")["b"]["state"] is not None, 5, "b's report on a")
        on_a = _report(a, "big")
        assert on_a["a"] == {"replica": "a", "generation": 1, "state": "resident", "reason": None,
                             "age_s": 0.0, "stale": False}
        assert (on_a["b"]["generation"], on_a["b"]["state"], on_a["b"]["stale"]) == (
            1, "not_resident", False)
        assert "waiting for free slots" in on_a["b"]["reason"] and on_a["b"]["age_s"] < 3
        wait_until(lambda: _report(b, "small").get("a", {}).get("state") == "resident", 5,
                   "a's report of small on b")
        assert _report(b, "small")["b"]["state"] == "resident"

        b.stop_api()
        assert a.push("small", exact_vector(H, seed=23), replace=True).status_code == 200
        on_a = _report(a, "small")
        assert (on_a["b"]["generation"], on_a["b"]["stale"]) == (1, True)
        assert (on_a["a"]["generation"], on_a["a"]["stale"]) == (2, False)
    finally:
        a.stop()
        b.stop()


def test_a_create_racing_another_replicas_is_409_not_a_silent_replace(replicas, pg, dsn):
    a, b = replicas
    theirs, mine = exact_vector(H, seed=31), exact_vector(H, seed=32)
    _quiet_write(pg, dsn, "same", theirs, 1, metadata='{"by": "a"}')
    assert _catalog(b).get("same") is None  # b has not heard of it
    response = b.push("same", mine)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "exists"
    assert "generation 1" in response.json()["error"]["message"]
    np.testing.assert_array_equal(_catalog(b).load("same"), theirs)  # theirs, untouched
    assert b.push("same", mine, replace=True).status_code in (200, 201)  # asked for: replaced


def test_a_push_whose_vector_another_replica_just_replaced_skips_a_pass_quietly(
        replicas, pg, dsn, caplog):
    """The reconciler reads bytes of a newer generation than its memory holds: that vector
    waits for the next pass (no failed pass, no traceback), then goes out under the new one."""
    a, _ = replicas
    old, new = exact_vector(H, seed=41), exact_vector(H, seed=42)
    assert a.push("v", old).status_code == 201
    _quiet_write(pg, dsn, "v", new, 2)
    with caplog.at_level(logging.ERROR, logger="hotwire.control_api"):
        a.engine.restart()  # a new engine: every vector is pushed again, "v" read from disk
        wait_until(lambda: _applied(a.engine, "v", 2, new), 5, "v at generation 2")
    assert not [r for r in caplog.records if "reconcile failed" in r.getMessage()]
    assert a.http.get("/readyz").status_code == 200


def test_replicas_adopting_the_same_engine_vector_both_succeed(replicas, pg, dsn, caplog):
    """Replica a adopted ``ghost`` generation 5 a moment ago; b's engine holds the same write
    and b has not heard: b's adoption is a no-op, not a failed pass."""
    _, b = replicas
    ghost = exact_vector(H, seed=51)
    _quiet_write(pg, dsn, "ghost", ghost, 5, metadata='{"adopted": {"by": "a"}}')
    box = ControlMailbox.attach(str(b.settings.mailbox))
    with caplog.at_level(logging.INFO, logger="hotwire.control_api"):
        box.write(30, "ghost", ANY_LAYER, ghost, gen=5)
        box.close()
        wait_until(lambda: (_catalog(b).get("ghost") or None) is not None, 5, "b knows ghost")
        time.sleep(0.5)  # a few reconcile passes
    record = _catalog(b).get("ghost")
    assert (record.generation, record.metadata) == (5, {"adopted": {"by": "a"}})
    assert not [r for r in caplog.records if "reconcile failed" in r.getMessage()]
    assert any("already adopted by another writer" in r.getMessage() for r in caplog.records)
    assert b.engine.entries("ghost")[ANY_LAYER][:2] == (30, 5)
    assert b.http.get("/readyz").status_code == 200
