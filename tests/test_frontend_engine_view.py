"""The API server's judgement of a spec from real mailbox files, as the engine core and the
control API write them (the engine side's own classes): what the directory holds is what the
next engine step admits, every data-parallel rank must steer, an engine restart starts anew, and
the API server never writes."""

from __future__ import annotations

import json
import os

import numpy as np

from hotwire.engine_plugin.frontend.engine_view import EngineView
from hotwire.shared.mailbox import ANY_LAYER, ControlMailbox, EngineMailbox, Fingerprint, rank_mailboxes

FP = Fingerprint("tiny", 4, 8, "float32")
ROW = np.linspace(-1, 1, 8, dtype=np.float32)


def engine(path, armed=(1, 2)) -> EngineMailbox:
    box = EngineMailbox.create(str(path), FP, 8)
    box.set_armed(list(armed), entries=4)
    return box


def reason(view: EngineView, **entry) -> str | None:
    verdict = view.judge(json.dumps({"layer": 1, **entry}))
    return verdict.reason if verdict.reason is not None else verdict.state


def test_what_the_directory_holds_is_judged_as_the_engine_admits(tmp_path):
    path = tmp_path / "engine.mbx"
    box = engine(path)
    box.publish_startup(0, "boot", ANY_LAYER, ROW)
    view = EngineView(str(path))
    assert reason(view, id="boot") == "applied"
    assert reason(view, id="boot", layer=3) == "unarmed_layer"
    assert reason(view, id="new") == "unknown_id"
    assert reason(view, id="boot", scale=1e38) == "out_of_range"
    assert view.judge(json.dumps([{"id": "boot", "layer": 1}] * 5)).reason == "too_many_entries"
    assert view.judge("[]") is None  # no entries: asked for nothing
    # a projecting mode on "all" layers with no projection layer would steer nothing: never applied
    for entry in ({"id": "boot", "layers": "all", "mode": "ablate"}, {"id": "nope", "layers": "all", "mode": "clamp",
                                                                       "lo": 0.0}):
        assert view.judge(json.dumps(entry)).reason == "unarmed_projection"

    control = ControlMailbox.attach(str(path))
    control.write(1, "new", 1, ROW, gen=1)  # not yet acknowledged: the next step applies it
    assert reason(view, id="new") == "applied"
    assert reason(view, id="new", layer=2) == "unknown_id"  # a per-layer row serves its layer only
    control.retire(1)
    assert reason(view, id="new") == "unknown_id"  # the engine binds no new request to it


def test_every_data_parallel_rank_must_steer(tmp_path):
    path = tmp_path / "engine.mbx"
    ranks = [engine(path), engine(f"{path}.dp1")]
    ranks[0].publish_startup(0, "v", ANY_LAYER, ROW)
    view = EngineView(str(path))
    assert reason(view, id="v") == "unknown_id"  # rank 1 has no such vector
    ranks[1].publish_startup(0, "v", ANY_LAYER, ROW)
    control = ControlMailbox.attach(f"{path}.dp1")
    control.write(1, "w", ANY_LAYER, ROW, gen=1)  # the header moves: rank 1 is read again
    assert reason(view, id="v") == "applied"


def test_the_ranks_folder_is_listed_again_only_when_it_changed(tmp_path, monkeypatch):
    """A steered request must not list the mailbox's folder (50 µs of the API server's CPU each,
    beside the engine core): listed once while the folder stays, again once a rank is added."""
    from hotwire.engine_plugin.frontend import engine_view

    listed = []
    monkeypatch.setattr(engine_view, "rank_mailboxes", lambda base: listed.append(base) or rank_mailboxes(base))
    path = tmp_path / "engine.mbx"
    engine(path).publish_startup(0, "v", ANY_LAYER, ROW)
    settle(tmp_path)
    view = EngineView(str(path))
    assert [reason(view, id="v") for _ in range(5)] == ["applied"] * 5
    assert len(listed) == 1
    engine(f"{path}.dp1")  # a second data-parallel rank, without the vector
    assert reason(view, id="v") == "unknown_id" and len(listed) == 2
    settle(tmp_path)
    assert reason(view, id="v") == "unknown_id" and len(listed) == 3  # a changed stamp: listed again
    assert reason(view, id="v") == "unknown_id" and len(listed) == 3


def settle(folder) -> None:
    """Date the folder's last change back past what the view takes as a settled folder."""
    old = os.stat(folder).st_mtime_ns - 10**10
    os.utime(folder, ns=(old, old))


def test_an_engine_restart_starts_the_mirror_anew_and_nothing_is_written(tmp_path):
    path = tmp_path / "engine.mbx"
    engine(path).publish_startup(0, "old", ANY_LAYER, ROW)
    view = EngineView(str(path))
    assert reason(view, id="old") == "applied"
    engine(path, armed=(3,)).publish_startup(0, "fresh", ANY_LAYER, ROW)  # a new file, new epoch
    before = path.read_bytes(), os.stat(path).st_mtime_ns
    assert reason(view, id="old", layer=3) == "unknown_id"
    assert reason(view, id="fresh", layer=3) == "applied"
    assert reason(view, id="fresh") == "unarmed_layer"
    assert (path.read_bytes(), os.stat(path).st_mtime_ns) == before


def test_the_engines_own_settings_judge_not_this_processes_environment(tmp_path, monkeypatch):
    """The API server and the engine core may run with different ``HOTWIRE_*`` (a headless
    engine on another node, a sidecar): the verdict goes by what the engine published."""
    monkeypatch.setenv("HOTWIRE_PROJECTION_LAYERS", "")
    monkeypatch.setenv("HOTWIRE_ENTRIES", "4")
    path = tmp_path / "engine.mbx"
    box = EngineMailbox.create(str(path), FP, 8)
    box.set_armed([1, 2], entries=2, projecting=[2])  # HOTWIRE_ENTRIES=2 HOTWIRE_PROJECTION_LAYERS=2 there
    box.publish_startup(0, "v", ANY_LAYER, ROW)
    view = EngineView(str(path))
    assert reason(view, id="v", layer=2, mode="ablate") == "applied"
    assert reason(view, id="v", layer=1, mode="ablate") == "unarmed_projection"
    assert view.judge(json.dumps([{"id": "v", "layer": 1}] * 3)).reason == "too_many_entries"
    assert view.judge(json.dumps([{"id": "v", "layer": 1}] * 2)).reason is None


def test_without_a_readable_mailbox_a_spec_is_unverified(tmp_path):
    view = EngineView(str(tmp_path / "absent.mbx"))
    assert view.judge(json.dumps({"id": "v", "layer": 1})).header == b"unverified; reason=no_mailbox"
    assert view.judge("not json").reason == "malformed"  # the spec itself is still checked
    assert EngineView(None).judge(json.dumps({"id": "v", "layer": 1})).state == "unverified"
