"""Presets: ``/steer/presets`` on a real control API (SQLite and PostgreSQL catalogs), the
``hotwire presets`` CLI against it, and a catalog from before presets existed.

All real: control APIs served over HTTP by uvicorn, engine mailboxes driven by
:class:`EnginePump`, SQLite files and a PostgreSQL server of the test's own.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import datetime

import httpx
import numpy as np
import psycopg
import pytest
from pydantic import SecretStr

from hotwire.control_api.store.sqlite import Catalog
from hotwire.control_api.store.postgres import PostgresCatalog
from hotwire.control_api.cli.exit_codes import (EXIT_CONFLICT, EXIT_ERROR, EXIT_FILE, EXIT_INVALID,
                                                EXIT_OK, EXIT_UNAUTHORIZED, EXIT_USAGE)
from hotwire.control_api.cli.main import main
from hotwire.shared.spec import layer_ranges
from hotwire.shared.wire import encode_safetensors

from control_harness import FP, TOKEN, Rig, exact_vector
from pg_cluster import PgCluster, why_unavailable

H = FP.hidden
CALM = [{"id": "calm", "layer": 2, "scale": 1.5, "decode_only": True},
        {"id": "refusal", "layers": "all", "mode": "ablate"}]
FIELDS = {"name", "entries", "description", "created_at", "metadata"}
SWEPT = {"calibrated_by": "hotwire vectors sweep", "model": "tiny", "kl_budget": 0.25,
         "grid": [{"layer": 2, "scale": 1.5, "kl": 0.01, "effect": -3.5}]}
READ_TOKEN = "r3ad-only"


def store(http: httpx.Client, name: str, entries, **fields) -> httpx.Response:
    return http.post("/steer/presets", json={"name": name, "entries": entries, **fields})


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error["message"]


def presets_of(http: httpx.Client) -> dict[str, dict]:
    response = http.get("/steer/presets")
    assert response.status_code == 200, response.text
    return {p["name"]: p for p in response.json()["presets"]}


# REST ------------------------------------------------------------------------------------


def test_store_list_show_replace_delete(rig):
    r = store(rig.http, "calm", CALM, description="calm, and no refusals")
    assert r.status_code == 201, r.text
    info = r.json()
    assert set(info) == FIELDS
    assert info["entries"] == CALM and info["description"] == "calm, and no refusals"
    assert info["metadata"] == {}
    created = datetime.fromisoformat(info["created_at"])
    assert created.tzinfo is not None

    listed = rig.http.get("/steer/presets").json()
    assert set(listed) == {"presets"} and listed["presets"] == [info]
    assert rig.http.get("/steer/presets/calm").json() == info
    assert rig.catalog() == {}  # a recipe: the vectors it names are not registered

    message = error_of(store(rig.http, "calm", CALM[:1]), 409, "preset_exists")
    assert "replace=true" in message
    assert presets_of(rig.http)["calm"]["entries"] == CALM

    r = store(rig.http, "calm", CALM[:1], replace=True, metadata=SWEPT)
    assert r.status_code == 200, r.text
    assert r.json()["entries"] == CALM[:1] and r.json()["description"] is None
    assert r.json()["metadata"] == SWEPT == rig.http.get("/steer/presets/calm").json()["metadata"]
    assert store(rig.http, "bright", [{"id": "sun", "layer": 0}]).status_code == 201
    assert list(presets_of(rig.http)) == ["bright", "calm"]

    assert rig.http.delete("/steer/presets/calm").status_code == 204
    error_of(rig.http.get("/steer/presets/calm"), 404, "unknown_preset")
    error_of(rig.http.delete("/steer/presets/calm"), 404, "unknown_preset")
    assert list(presets_of(rig.http)) == ["bright"]


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


BAD_BODIES = {  # body -> (status, code, a piece of the message)
    "no entries": ({"name": "p", "entries": []}, 422, "bad_entries", "at least one entry"),
    "nested preset": ({"name": "p", "entries": [{"id": "a", "layer": 1}, {"preset": "calm"}]},
                      422, "bad_entries", "entries[1] names preset 'calm'"),
    "no layer": ({"name": "p", "entries": [{"id": "a"}]}, 422, "bad_entries",
                 "entries[0]: malformed: "),
    "bad id": ({"name": "p", "entries": [{"id": "a b", "layer": 1}]}, 422, "bad_entries",
               "malformed: id"),
    "clamp lo > hi": ({"name": "p", "entries": [{"id": "a", "layer": 1, "mode": "clamp",
                                                 "lo": 2, "hi": 1}]},
                      422, "bad_entries", "bad_params: "),
    "scale overflows": ({"name": "p", "entries": [{"id": "a", "layer": 1, "scale": 1e39}]},
                        422, "bad_entries", "finite in float32"),
    "too many": ({"name": "p", "entries": [{"id": "a", "layer": 1}] * 17}, 422, "bad_entries",
                 "too_many_entries: 17 entries"),
    "longer than a spec": ({"name": "p", "entries": [{"id": "a", "layers": list(range(4000))}]},
                           422, "bad_entries", "too_large: the entries are 18913 characters"),
    "not objects": ({"name": "p", "entries": [1]}, 422, "invalid_request", "entries.0"),
    "bad name": ({"name": "calm down", "entries": CALM}, 422, "bad_id", "must match"),
    "name with a newline": ({"name": "calm\n", "entries": CALM}, 422, "bad_id", "must match"),
    "unknown field": ({"name": "p", "entries": CALM, "pin": True}, 422, "invalid_request", "pin"),
    "long description": ({"name": "p", "entries": CALM, "description": "x" * 1025}, 422,
                         "invalid_request", "description"),
    "NUL in the description": ({"name": "p", "entries": CALM, "description": "a\x00b"}, 422,
                               "invalid_request", "description"),
    "metadata not an object": ({"name": "p", "entries": CALM, "metadata": [1]}, 422,
                               "invalid_request", "metadata"),
    "metadata too deep": ({"name": "p", "entries": CALM, "metadata": _deep(40)}, 422,
                          "invalid_request", "nests deeper than 32"),
    "metadata too large": ({"name": "p", "entries": CALM, "metadata": {"x": "a" * 70_000}}, 422,
                           "invalid_request", "at most 65536"),
}


@pytest.mark.parametrize("case", BAD_BODIES)
def test_bad_presets_are_refused_with_a_reason_and_nothing_is_stored(rig, case):
    body, status, code, piece = BAD_BODIES[case]
    assert piece in error_of(rig.http.post("/steer/presets", json=body), status, code)
    assert presets_of(rig.http) == {}


def test_bodies_that_are_not_json_or_too_large_are_refused(rig):
    r = rig.http.post("/steer/presets", content=b"name=p", headers={"content-type": "text/plain"})
    error_of(r, 415, "unsupported_media_type")
    huge = {"name": "p", "entries": CALM, "description": "x" * 200_000}
    error_of(rig.http.post("/steer/presets", json=huge), 413, "too_large")
    json_type = {"content-type": "application/json"}
    error_of(rig.http.post("/steer/presets", content=b"{not json", headers=json_type), 422,
             "invalid_request")
    infinite = b'{"name": "p", "entries": [{"id": "a", "layer": 1, "gate": {"threshold": 1e999}}]}'
    r = rig.http.post("/steer/presets", content=infinite, headers=json_type)
    assert r.status_code == 422, r.text  # refused, by the parser or as a non-finite number
    error_of(rig.http.get("/steer/presets/bad%20name"), 422, "invalid_request")
    assert presets_of(rig.http) == {}


def test_writes_need_the_write_token_and_reads_the_read_token(tmp_path):
    rig = Rig(tmp_path, read_token=SecretStr(READ_TOKEN))
    rig.start_engine()
    rig.start_api()
    try:
        assert store(rig.http, "calm", CALM).status_code == 201
        with httpx.Client(base_url=rig.server.url) as anonymous:
            for path in ("/steer/presets", "/steer/presets/calm"):
                error_of(anonymous.get(path), 401, "unauthorized")
                for token in (READ_TOKEN, TOKEN):
                    r = anonymous.get(path, headers={"Authorization": f"Bearer {token}"})
                    assert r.status_code == 200, (path, token)
            reader = {"Authorization": f"Bearer {READ_TOKEN}"}
            error_of(anonymous.post("/steer/presets", json={"name": "x", "entries": CALM},
                                    headers=reader), 401, "unauthorized")
            error_of(anonymous.delete("/steer/presets/calm", headers=reader), 401, "unauthorized")
            error_of(anonymous.delete("/steer/presets/calm"), 401, "unauthorized")
        assert list(presets_of(rig.http)) == ["calm"]
    finally:
        rig.stop()


def test_presets_survive_a_restart_and_a_lost_catalog_refuses_writes(rig):
    assert store(rig.http, "calm", CALM, metadata=SWEPT).status_code == 201
    before = presets_of(rig.http)
    rig.stop_api()
    rig.start_api()
    assert presets_of(rig.http) == before and before["calm"]["metadata"] == SWEPT
    rig.settings.catalog_path.rename(rig.settings.catalog_path.with_suffix(".moved"))
    error_of(store(rig.http, "other", CALM), 503, "catalog_lost")
    error_of(rig.http.delete("/steer/presets/calm"), 503, "catalog_lost")
    assert presets_of(rig.http) == before  # reads answer from memory


# A catalog from before presets ----------------------------------------------------------

V1_SCHEMA = """
CREATE TABLE vectors (id TEXT PRIMARY KEY, generation INTEGER NOT NULL, dtype TEXT NOT NULL,
    shape TEXT NOT NULL, layers TEXT, pinned INTEGER NOT NULL, metadata TEXT NOT NULL,
    data BLOB NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE generations (id TEXT PRIMARY KEY, last INTEGER NOT NULL);
PRAGMA user_version=1;
"""


def test_a_sqlite_catalog_from_before_presets_keeps_its_vectors_and_gains_presets(tmp_path):
    """The schema the catalog had before presets (user_version 1, no presets table), with a
    vector in it: the new build serves the vector and stores presets in the same file."""
    path = tmp_path / "state" / "catalog.sqlite3"
    path.parent.mkdir()
    vector = exact_vector(H, seed=7)
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO vectors VALUES (?,?,?,?,?,?,?,?,?,?)",
               ("old", 3, "float32", json.dumps([H]), None, 1, '{"from": "v1"}',
                encode_safetensors(vector), 1.0, 2.0))
    db.execute("INSERT INTO generations VALUES ('old', 3)")
    db.commit()
    db.close()

    rig = Rig(tmp_path)
    engine = rig.start_engine()
    rig.start_api()
    try:
        old = rig.catalog()["old"]
        assert (old["generation"], old["pinned"], old["metadata"]) == (3, True, {"from": "v1"})
        assert rig.resident("old")
        np.testing.assert_array_equal(next(iter(engine.entries("old").values()))[2], vector)
        assert store(rig.http, "calm", CALM).status_code == 201
        rig.stop_api()
        rig.start_api()
        assert list(presets_of(rig.http)) == ["calm"] and list(rig.catalog()) == ["old"]
    finally:
        rig.stop()
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"vectors", "generations", "presets"}
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    db.close()
    Catalog(path).close()  # and it opens again as it is


PRESETS_V1 = """
CREATE TABLE presets (name TEXT PRIMARY KEY, entries TEXT NOT NULL, description TEXT,
    created_at REAL NOT NULL);
"""


def test_a_sqlite_catalog_from_before_preset_metadata_gains_the_column(tmp_path):
    """Presets stored before they had metadata read back with ``{}``; new ones keep theirs."""
    path = tmp_path / "catalog.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA + PRESETS_V1)
    db.execute("INSERT INTO presets VALUES (?, ?, ?, ?)", ("old", json.dumps(CALM), "before", 5.0))
    db.commit()
    db.close()
    catalog = Catalog(path)
    try:
        assert catalog.preset("old").metadata == {} and catalog.preset("old").entries == tuple(CALM)
        catalog.put_preset("new", tuple(CALM), None, replace=False, metadata=SWEPT)
    finally:
        catalog.close()
    catalog = Catalog(path)
    try:
        assert catalog.preset("new").metadata == SWEPT and catalog.preset("old").metadata == {}
    finally:
        catalog.close()


# CLI -------------------------------------------------------------------------------------


def cli(capsys, url: str, *args: str, token: str | None = TOKEN) -> tuple[int, str, str]:
    status = main([*args, "--url", url] + (["--token", token] if token else []))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_add_list_show_rm(rig, capsys, tmp_path):
    url = rig.server.url
    status, out, err = cli(capsys, url, "presets", "add", "calm", "--entries", json.dumps(CALM),
                           "--description", "calm, no refusals")
    assert status == EXIT_OK, err
    assert out.strip() == "stored preset calm: 2 entries (calm,refusal)"

    status, out, _ = cli(capsys, url, "presets", "show", "calm", "--json", token=None)
    assert status == EXIT_OK
    shown = json.loads(out)
    assert shown["entries"] == CALM and shown["description"] == "calm, no refusals"

    (tmp_path / "calm.json").write_text(out)  # what show --json prints, read back by add --file
    status, out, err = cli(capsys, url, "presets", "add", "calm2", "--file", str(tmp_path / "calm.json"))
    assert status == EXIT_OK, err
    assert presets_of(rig.http)["calm2"]["description"] == "calm, no refusals"
    (tmp_path / "one.json").write_text(json.dumps({"id": "sun", "layer": 1}))
    status, out, err = cli(capsys, url, "presets", "add", "sun", "--file", str(tmp_path / "one.json"))
    assert (status, out.strip()) == (EXIT_OK, "stored preset sun: 1 entry (sun)"), err

    status, out, _ = cli(capsys, url, "presets", "list", token=None)
    assert status == EXIT_OK
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "ENTRIES", "VECTORS", "DESCRIPTION"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["calm", "2", "calm,refusal"], ["calm2", "2", "calm,refusal"], ["sun", "1", "sun"]]
    status, out, _ = cli(capsys, url, "presets", "list", "--json", token=None)
    assert [p["name"] for p in json.loads(out)] == ["calm", "calm2", "sun"]

    status, out, _ = cli(capsys, url, "presets", "rm", "calm2")
    assert (status, out.strip()) == (EXIT_OK, "removed preset calm2")
    assert list(presets_of(rig.http)) == ["calm", "sun"]


def test_cli_show_then_add_from_the_file_keeps_the_metadata(rig, capsys, tmp_path):
    assert store(rig.http, "swept", CALM, description="calibrated", metadata=SWEPT).status_code == 201
    status, out, _ = cli(capsys, rig.server.url, "presets", "show", "swept", "--json")
    assert status == EXIT_OK and json.loads(out)["metadata"] == SWEPT
    (tmp_path / "swept.json").write_text(out)
    status, _, err = cli(capsys, rig.server.url, "presets", "add", "copy", "--file",
                         str(tmp_path / "swept.json"))
    assert status == EXIT_OK, err
    copy = presets_of(rig.http)["copy"]
    assert (copy["entries"], copy["description"], copy["metadata"]) == (CALM, "calibrated", SWEPT)
    status, out, _ = cli(capsys, rig.server.url, "presets", "show", "swept")
    assert status == EXIT_OK and f"metadata     {json.dumps(SWEPT, separators=(',', ':'))}" in out


def test_cli_show_prints_layer_sets_as_ranges(rig, capsys):
    """What ``show`` prints pastes into ``--layers``: a GGUF import's 29 layers are ``1-29``."""
    url = rig.server.url
    entries = [{"id": "happy", "layers": [*range(1, 30), 31], "scale": 1},
               {"id": "calm", "layer": 2, "scale": 1.5, "decode_only": True},
               {"id": "refusal", "layers": "all", "mode": "ablate"}]
    assert cli(capsys, url, "presets", "add", "mixed", "--entries", json.dumps(entries))[0] == EXIT_OK
    status, out, _ = cli(capsys, url, "presets", "show", "mixed", token=None)
    assert status == EXIT_OK
    lines = out.splitlines()
    assert lines[0].split() == ["preset", "mixed"] and lines[1].split() == ["description", "-"]
    table = lines[lines.index("") + 1:]
    assert table[0].split() == ["VECTOR", "LAYERS", "SETTINGS"]
    assert [row.split() for row in table[1:]] == [
        ["happy", "1-29,31", "scale=1"], ["calm", "2", "scale=1.5", "decode_only=true"],
        ["refusal", "all", 'mode="ablate"']]
    assert layer_ranges(table[1].split()[1]) == entries[0]["layers"]


def test_cli_exit_codes(rig, capsys, tmp_path):
    url = rig.server.url
    entries = json.dumps(CALM)
    assert cli(capsys, url, "presets", "add", "calm", "--entries", entries)[0] == EXIT_OK
    status, _, err = cli(capsys, url, "presets", "add", "calm", "--entries", entries)
    assert status == EXIT_CONFLICT and "preset_exists" in err
    status, _, err = cli(capsys, url, "presets", "add", "calm", "--entries", entries, "--replace")
    assert status == EXIT_OK, err
    status, _, err = cli(capsys, url, "presets", "add", "bad", "--entries", '[{"id": "a"}]')
    assert status == EXIT_INVALID and "bad_entries" in err and "malformed" in err
    status, _, err = cli(capsys, url, "presets", "add", "x", "--file", str(tmp_path / "missing.json"))
    assert status == EXIT_FILE and "file_error" in err and "missing.json" in err
    (tmp_path / "junk.json").write_text("{not json")
    status, _, err = cli(capsys, url, "presets", "add", "x", "--file", str(tmp_path / "junk.json"))
    assert status == EXIT_FILE and "junk.json" in err
    for action in ("show", "rm"):
        status, _, err = cli(capsys, url, "presets", action, "never_was")
        assert status == EXIT_ERROR and "unknown_preset" in err
    status, _, err = cli(capsys, url, "presets", "rm", "calm", token="wrong")
    assert status == EXIT_UNAUTHORIZED and "unauthorized" in err
    for argv in (["presets", "add", "x"], ["presets", "add", "x", "--entries", entries,
                                           "--file", "f.json"],
                 ["presets", "add", "x", "--entries", "not json"]):
        with pytest.raises(SystemExit) as exited:
            cli(capsys, url, *argv)
        assert exited.value.code == EXIT_USAGE
    capsys.readouterr()
    assert list(presets_of(rig.http)) == ["calm"]


# PostgreSQL: control APIs of two replicas on one database ---------------------------------


@pytest.fixture(scope="module")
def pg():
    if why_unavailable() is not None:
        pytest.skip(why_unavailable())
    cluster = PgCluster()
    yield cluster
    cluster.destroy()


def test_replicas_see_each_others_presets_at_once(tmp_path, pg):
    dsn = pg.database("presets_replicas")
    a = Rig(tmp_path / "a", catalog_dsn=SecretStr(dsn), replica="a")
    b = Rig(tmp_path / "b", catalog_dsn=SecretStr(dsn), replica="b")
    try:
        for rig in (a, b):
            rig.start_engine()
            rig.start_api()
        assert store(a.http, "calm", CALM, description="from a").status_code == 201
        assert presets_of(b.http)["calm"]["description"] == "from a"  # no wait: read through
        assert b.http.get("/steer/presets/calm").json()["entries"] == CALM
        error_of(store(b.http, "calm", CALM), 409, "preset_exists")
        assert store(b.http, "calm", CALM[:1], replace=True).status_code == 200
        assert a.http.get("/steer/presets/calm").json()["entries"] == CALM[:1]
        assert b.http.delete("/steer/presets/calm").status_code == 204
        error_of(a.http.get("/steer/presets/calm"), 404, "unknown_preset")
        error_of(a.http.delete("/steer/presets/calm"), 404, "unknown_preset")

        answers: list[int] = []
        start = threading.Barrier(2)

        def create(rig: Rig) -> None:
            start.wait()
            answers.append(store(rig.http, "race", CALM).status_code)

        threads = [threading.Thread(target=create, args=(rig,)) for rig in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers) == [201, 409]
        assert list(presets_of(a.http)) == list(presets_of(b.http)) == ["race"]
    finally:
        a.stop()
        b.stop()


def test_a_postgres_catalog_from_before_presets_gains_the_table(pg):
    dsn = pg.database("presets_migrate")
    vector = exact_vector(H, seed=8)
    catalog = PostgresCatalog(dsn)
    catalog.put("old", vector, dtype="float32", layers=None, pinned=False, metadata={})
    catalog.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE hotwire_presets")  # as the schema was before presets
    catalog = PostgresCatalog(dsn)
    try:
        assert catalog.get("old").generation == 1
        np.testing.assert_array_equal(catalog.load("old"), vector)
        record, created = catalog.put_preset("calm", tuple(CALM), None, replace=False)
        assert created and catalog.preset("calm") == record
        assert [p.name for p in catalog.presets()] == ["calm"]
    finally:
        catalog.close()


def test_a_postgres_catalog_from_before_preset_metadata_gains_the_column(pg):
    dsn = pg.database("presets_metadata")
    catalog = PostgresCatalog(dsn)
    catalog.put_preset("old", tuple(CALM), "before", replace=False)
    catalog.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE hotwire_presets DROP COLUMN metadata")  # as it was before
    catalog = PostgresCatalog(dsn)
    try:
        assert catalog.preset("old").metadata == {}
        catalog.put_preset("old", tuple(CALM), None, replace=True, metadata=SWEPT)
        assert catalog.preset("old").metadata == SWEPT
    finally:
        catalog.close()
