"""serve_throughput.py's ``original`` server (benchmarks/original_plugin.py): the environment that runs
hotwire-vllm 0.1.2 alone, the spec pool it can hold, its vectors and its log watch. The original
itself steers only on a GPU; here a stand-in with its packaging (import package ``hotwire``, a
``vllm.general_plugins`` entry point named ``hotwire``) meets vLLM's real plugin loader and this
checkout's installed ``hotwire``."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import original_plugin  # noqa: E402
from serving import bodies, pool_entries, write_vectors  # noqa: E402

from hotwire.shared.wire import decode_safetensors  # noqa: E402

LAYERS = (9, 18)


def _stand_in(site: Path) -> Path:
    """A folder laid out as ``pip install --no-deps --target`` lays out the original."""
    (site / "hotwire").mkdir(parents=True)
    (site / "hotwire" / "__init__.py").write_text("def register():\n    pass\n")
    meta = site / "hotwire_vllm-0.1.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: hotwire-vllm\nVersion: 0.1.2\n")
    (meta / "entry_points.txt").write_text("[vllm.general_plugins]\nhotwire = hotwire:register\n")
    return site


def _steered_entries(pool: int | None) -> set[tuple[str, int, float]]:
    seen = set()
    for client in range(4):
        feed = bodies(seed=1, client=client, clients=4, vocab=1000, layers=LAYERS, fraction=0.5, prompt_len=4,
                      max_tokens=(2, 4), pool=pool)
        for _ in range(2000):
            body = next(feed)
            if "vllm_xargs" in body:
                seen |= {(e["id"], e["layer"], e["scale"]) for e in json.loads(body["vllm_xargs"]["hotwire"])}
    return seen


def test_pooled_requests_name_only_entries_the_original_holds():
    slots = pool_entries(128, LAYERS)
    assert len(slots) == 256  # what serve_throughput gives it as HOTWIRE_SLOTS
    assert _steered_entries(128) <= slots
    assert len(_steered_entries(None)) > 256  # unpooled, the requests would run out of its slots


def test_its_vectors_are_ours_as_pt_files(tmp_path):
    import torch

    ours = write_vectors(tmp_path / "st", 64)
    theirs = original_plugin.write_pt_vectors(tmp_path / "pt", np.stack(
        [decode_safetensors((ours / f"v{i}.safetensors").read_bytes()) for i in range(256)]))
    for i in (0, 17, 255):
        t = torch.load(theirs / f"v{i}.pt", weights_only=True)
        assert t.shape == (64,) and t.untyped_storage().nbytes() == 64 * 4  # the row alone, not the array
        assert np.array_equal(t.numpy(), decode_safetensors((ours / f"v{i}.safetensors").read_bytes()))


def test_a_folder_without_the_original_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no hotwire-vllm installed there"):
        original_plugin.installed_version(tmp_path)
    assert original_plugin.installed_version(_stand_in(tmp_path / "site")) == "0.1.2"


def test_its_server_env_loads_exactly_the_original(tmp_path):
    pytest.importorskip("vllm")
    site = _stand_in(tmp_path / "site")
    original_plugin.check_plugins(original_plugin.server_env(site, tmp_path / "work"), site)
    # its folder first on PYTHONPATH is not enough: vLLM loads our entry point too (or the
    # original's under our name), and keeps one of the two by name
    with pytest.raises(SystemExit, match="not exactly hotwire_original"):
        original_plugin.check_plugins({"PYTHONPATH": str(site)}, site)


def test_the_log_watch_reports_each_unsteered_entry_once(tmp_path):
    log = tmp_path / "original.log"
    log.write_text("(APIServer pid=1) INFO started\n"
                   "(EngineCore pid=2) hotwire: unknown vector id 'v999'\n"
                   "(EngineCore pid=2) hotwire: no nvcc / CUDA toolkit found; VLLM_USE_FLASHINFER_SAMPLER=0\n"
                   "(EngineCore pid=2) hotwire: vector bank full (256 slots) — 'v3@9x0.5' not")
    watch = original_plugin.LogWatch(log)
    assert watch.failures() == ["(EngineCore pid=2) hotwire: unknown vector id 'v999'"]
    with open(log, "a") as f:
        f.write(" registered, entry ignored\n(EngineCore pid=2) hotwire: v2 slot fill failed; step runs unsteered\n")
    assert watch.failures() == ["(EngineCore pid=2) hotwire: vector bank full (256 slots) — 'v3@9x0.5' not "
                                "registered, entry ignored",
                                "(EngineCore pid=2) hotwire: v2 slot fill failed; step runs unsteered"]
    assert watch.failures() == []
