"""The SQLite catalog (control_api.store.sqlite) under failures that must never lose or fake an
acknowledged write: its file removed or replaced while the control API runs, a full disk.

Real SQLite files, real mailbox files, the real control API over HTTP (tests/control_harness.py).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from hotwire.control_api.slots.reconcile import RECONCILE_PERIOD_S
from hotwire.control_api.store.records import CatalogFull
from hotwire.control_api.store.sqlite import Catalog, CatalogLost
from hotwire.shared.mailbox import ANY_LAYER

from control_harness import FP, Rig, exact_vector, wait_until

H = FP.hidden


def _directory(rig: Rig) -> list[tuple[int, int, int, str]]:
    d = rig.engine.box.directory
    return [(int(d["state"][s]), int(d["seq"][s]), int(d["gen"][s]), d["vector_id"][s].decode())
            for s in range(rig.engine.n_slots)]


def _push_some(rig: Rig) -> dict[str, np.ndarray]:
    vectors = {"a": exact_vector(H, seed=1), "b": exact_vector(FP.n_layers, H, seed=2)}
    for name, vector in vectors.items():
        assert rig.push(name, vector).status_code == 201
    wait_until(lambda: len(rig.engine.bound) == 1 + FP.n_layers, what="rows applied")
    return vectors


def _restart_engine(rig: Rig) -> None:
    epoch = rig.http.get("/steer/slots").json()["engine"]["epoch"]
    rig.engine.restart()
    wait_until(lambda: rig.http.get("/steer/slots").json().get("engine", {}).get("epoch")
               not in (None, epoch), what="attached to the new engine")


# The catalog's file removed or replaced while running ---------------------------------------


def _lose_by_rmtree(rig: Rig) -> None:
    shutil.rmtree(rig.settings.state_dir)


def _lose_by_replace(rig: Rig) -> None:
    path = rig.settings.catalog_path
    copy = path.with_name("copy.sqlite3")
    shutil.copyfile(path, copy)
    copy.replace(path)


@pytest.mark.parametrize("lose,what", [(_lose_by_rmtree, "removed"),
                                       (_lose_by_replace, "replaced")])
def test_a_lost_catalog_goes_unready_refuses_writes_and_keeps_the_engine(rig, caplog, lose, what):
    vectors = _push_some(rig)
    listed = rig.catalog()
    table = _directory(rig)
    with caplog.at_level(logging.ERROR, logger="hotwire.control_api"):
        lose(rig)
        r = wait_until(lambda: (x := rig.http.get("/readyz")).status_code == 503 and x,
                       what="unready")
        assert what in r.json()["reason"] and str(rig.settings.catalog_path) in r.json()["reason"]
        for response in (rig.push("c", exact_vector(H)),
                         rig.push("a", exact_vector(H, seed=9), replace=True),
                         rig.http.delete("/steer/vectors/b")):
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "catalog_lost" and what in error["message"]
        time.sleep(5 * RECONCILE_PERIOD_S)
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and what in r.getMessage()]
    assert len(logged) == 1 and "refusing writes" in logged[0].getMessage()
    assert rig.catalog() == listed  # reads answer from memory
    assert _directory(rig) == table  # nothing retired, nothing written
    assert rig.metrics()[("hotwire_catalog_writable", ())] == 0
    # An engine restarting meanwhile still gets the vectors (read from the file still open).
    _restart_engine(rig)
    wait_until(lambda: all(rig.resident(name) for name in vectors), what="pushed while lost")

    # Restarted over what is left, the control API adopts what the engine kept: nothing lost.
    rig.stop_api()
    rig.start_api()
    catalog = rig.catalog()
    assert {k: (v["generation"], v["state"]) for k, v in catalog.items()} == \
        {"a": (1, "resident"), "b": (1, "resident")}
    assert rig.http.get("/readyz").status_code == 200
    _restart_engine(rig)
    wait_until(lambda: all(rig.resident(name) for name in vectors), what="pushed to a new engine")
    np.testing.assert_array_equal(rig.engine.entries("a")[ANY_LAYER][2], vectors["a"])
    for layer, (_, _, row) in rig.engine.entries("b").items():
        np.testing.assert_array_equal(row, vectors["b"][layer])


def test_a_write_racing_the_removal_is_not_acknowledged(tmp_path):
    """The check runs on every write, not only on the reconcile loop's period."""
    catalog = Catalog(tmp_path / "state" / "catalog.sqlite3")
    catalog.put("a", exact_vector(H), dtype="float32", layers=None, pinned=False, metadata={})
    shutil.rmtree(tmp_path / "state")
    with pytest.raises(CatalogLost, match="removed"):
        catalog.put("b", exact_vector(H), dtype="float32", layers=None, pinned=False, metadata={})
    with pytest.raises(CatalogLost, match="removed"):
        catalog.delete("a")
    assert list(catalog.records()) == ["a"]
    catalog.close()


# A full disk during a catalog write -------------------------------------------------------


@contextmanager
def _full_disk(catalog: Catalog) -> Iterator[None]:
    """SQLite's own size limit, at the current size: every write that needs a new page fails
    with SQLITE_FULL ("database or disk is full"), as on a full disk."""
    with catalog._lock:
        pages = catalog._db.execute("PRAGMA page_count").fetchone()[0]
        catalog._db.execute(f"PRAGMA max_page_count = {pages}")
    try:
        yield
    finally:
        with catalog._lock:
            catalog._db.execute("PRAGMA max_page_count = 1073741823")


def test_a_full_disk_leaves_the_catalog_as_it_was(tmp_path):
    path = tmp_path / "state" / "catalog.sqlite3"
    catalog = Catalog(path)
    before = catalog.put("a", exact_vector(H), dtype="float32", layers=None, pinned=False,
                         metadata={})
    big = {"note": "x" * 20_000}  # needs pages the full disk does not have
    with _full_disk(catalog):
        with pytest.raises(CatalogFull) as raised:
            catalog.put("b", exact_vector(H), dtype="float32", layers=None, pinned=False,
                        metadata=big)
        assert raised.value.code == "storage_full"
        assert raised.value.__cause__.sqlite_errorname == "SQLITE_FULL"  # not a failed ROLLBACK
        with pytest.raises(CatalogFull):
            catalog.put("a", exact_vector(H, seed=3), dtype="float32", layers=None, pinned=True,
                        metadata=big)
    assert catalog.records() == {"a": before}
    assert catalog.high_water("b") is None and catalog.high_water("a") == 1
    again = catalog.put("b", exact_vector(H), dtype="float32", layers=None, pinned=False,
                        metadata=big)
    assert again.generation == 1  # the failed write used up no generation
    catalog.close()
    reopened = Catalog(path)
    assert set(reopened.records()) == {"a", "b"} and reopened.get("a") == before
    reopened.close()


def test_a_push_on_a_full_disk_writes_no_row_and_changes_nothing(rig):
    _push_some(rig)
    listed = rig.catalog()
    table = _directory(rig)
    big = {"note": "x" * 20_000}
    with _full_disk(rig.services().catalog):
        r = rig.push("c", exact_vector(H), metadata=big)
        assert (r.status_code, r.json()["error"]["code"]) == (507, "storage_full"), r.text
        r = rig.push("a", exact_vector(H, seed=5), replace=True, metadata=big)
        assert r.status_code == 507, r.text
    time.sleep(3 * RECONCILE_PERIOD_S)
    assert rig.catalog() == listed
    assert _directory(rig) == table
    rig.stop_api()
    rig.start_api()
    assert {k: v["generation"] for k, v in rig.catalog().items()} == \
        {k: v["generation"] for k, v in listed.items()}
    assert rig.push("c", exact_vector(H), metadata=big).json()["generation"] == 1


def test_a_vector_evicted_for_a_push_that_hits_a_full_disk_comes_back(tmp_path):
    rig = Rig(tmp_path)
    rig.start_engine(n_slots=1)
    rig.start_api()
    try:
        only = exact_vector(H, seed=1)
        assert rig.push("only", only).status_code == 201
        wait_until(lambda: rig.engine.bound, what="only applied")
        with _full_disk(rig.services().catalog):
            r = rig.push("second", exact_vector(H, seed=2), metadata={"note": "x" * 20_000})
            assert r.status_code == 507, r.text
        assert list(rig.catalog()) == ["only"]
        assert rig.engine.entries("second") == {}
        wait_until(lambda: rig.resident("only"), what="the evicted vector written again")
        np.testing.assert_array_equal(rig.engine.entries("only")[ANY_LAYER][2], only)
    finally:
        rig.stop()
