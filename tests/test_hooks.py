"""How hotwire attaches to vLLM (engine_plugin/hooks.py): a patch that does not fit the vLLM in
hand is logged and skipped, never raised into vLLM's import of its own module or into its start
(vLLM calls plugins' ``register`` unguarded, and from its argument parser too)."""

from __future__ import annotations

import importlib
import sys

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

