"""How hotwire attaches to vLLM (engine_plugin/hooks.py): a patch that does not fit the vLLM in
hand is logged and skipped, never raised into vLLM's import of its own module or into its start
(vLLM calls plugins' ``register`` unguarded, and from its argument parser too)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from hotwire.engine_plugin import hooks


def _broken(module):
    raise AttributeError(f"{module.__name__} has no such class")


def test_a_patch_that_fails_on_an_imported_module_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(hooks, "TARGETS", {"json": _broken})  # imported already: patched at install
    with caplog.at_level("ERROR", logger="vllm.hotwire"):
        hooks.install()
    assert "could not patch json" in caplog.text and "has no such class" in caplog.text


def test_a_patch_that_fails_on_import_leaves_the_module_imported(monkeypatch, caplog, tmp_path):
    (tmp_path / "hotwire_test_target.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hooks, "TARGETS", {"hotwire_test_target": _broken})
    monkeypatch.delitem(sys.modules, "hotwire_test_target", raising=False)
    hooks.install()
    with caplog.at_level("ERROR", logger="vllm.hotwire"):
        assert importlib.import_module("hotwire_test_target").VALUE == 7
    assert "could not patch hotwire_test_target" in caplog.text



# What hotwire wraps in the vLLM it runs with, by module and class. Modules a later vLLM removed
# (0.34: the V1 runners) or added (0.34: the CPU runner without Triton) may be missing; a module
# that is there must have every wrapper.
WRAPPED = {
    "vllm.v1.worker.gpu_model_runner": {"GPUModelRunner": {"load_model", "execute_model", "_prepare_inputs",
                                                           "_warmup_and_capture", "capture_model"}},
    "vllm.v1.worker.gpu.model_runner": {"GPUModelRunner": {"load_model", "execute_model", "prepare_inputs",
                                                           "capture_model"}},
    "vllm.v1.worker.gpu.cudagraph_utils": {"ModelCudaGraphManager": {"capture"}},
    "vllm.v1.worker.cpu_model_runner": {"CPUModelRunner": {"load_model"}},
    "vllm.v1.worker.cpu.standalone_model_runner": {"StandaloneCPUModelRunner": {"load_model", "execute_model",
                                                                                "prepare_inputs"}},
    "vllm.v1.worker.gpu_worker": {"Worker": {"compile_or_warm_up_model"}},
    "vllm.v1.worker.cpu_worker": {"CPUWorker": {"compile_or_warm_up_model"}},
    "vllm.v1.engine.core": {"EngineCore": {"_initialize_kv_caches", "step", "step_with_batch_queue"}},
    "vllm.v1.request": {"Request": {"__init__"}},
    "fastapi.applications": {"FastAPI": {"build_middleware_stack"}},
}
NOT_IN_EVERY_VERSION = {"vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.cpu_model_runner",
                        "vllm.v1.worker.cpu.standalone_model_runner"}


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package is missing too
        return False


@pytest.mark.vllm
def test_every_hook_attaches_to_the_installed_vllm():
    """Each method hotwire wraps exists in the installed vLLM and is wrapped once the plugin is
    registered: a renamed method would otherwise leave a part of hotwire silently off. (Run with
    another vLLM's sources on ``PYTHONPATH`` to read a new release against the hooks.)"""
    pytest.importorskip("vllm")
    from hotwire.engine_plugin import register

    register()
    missing = {}
    for name, classes in WRAPPED.items():
        if name in NOT_IN_EVERY_VERSION and not _exists(name):
            continue
        module = importlib.import_module(name)
        for cls, methods in classes.items():
            wrapped = {m for m, fn in vars(getattr(module, cls)).items() if getattr(fn, "__hotwire__", False)}
            if methods - wrapped:
                missing[f"{name}.{cls}"] = sorted(methods - wrapped)
    config = importlib.import_module("vllm.config.vllm").VllmConfig  # the compile cache's key, either form
    if not any(getattr(getattr(config, m, None), "__hotwire__", False) for m in ("compute_hash", "compile_factors")):
        missing["vllm.config.vllm.VllmConfig"] = ["compute_hash or compile_factors"]
    assert not missing, missing
