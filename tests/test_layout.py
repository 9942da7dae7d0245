"""The import graph: each layer of the control API imports only the layers below it, no module
imports itself back through others, and the packaging lists every package.

Imports are read from the source with ``ast`` (every ``import`` statement, wherever it sits:
one inside a function or under ``TYPE_CHECKING`` counts too), so nothing is imported to check.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = "hotwire"
CONTROL = f"{TOP}.control_api"

# The parts of control_api, and the parts each may import (besides itself), bottom up: the
# domain's errors and layer lists under everything, then catalog storage, then the slot protocol
# (which uses the catalog), then the HTTP service. The CLI is a client of the service over HTTP:
# it imports none of the service's layers.
MAY_IMPORT = {
    "": set(),  # control_api/__init__.py
    "errors": set(),
    "layer_lists": set(),
    "store": {"errors"},
    "slots": {"errors", "layer_lists", "store"},
    "api": {"errors", "layer_lists", "store", "slots"},
    "cli": {"layer_lists"},
}
# Top-level packages of hotwire, and the ones each may import: shared is imported by all and
# imports none; the engine runs without the control API; only the CLI dispatches to tools.
PACKAGE_MAY_IMPORT = {
    "shared": set(),
    "engine_plugin": {"shared"},
    "control_api": {"shared"},
    "tools": {"shared", "engine_plugin"},
}
CLI_MAY_IMPORT = {"tools"}


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``root`` (the directory of ``package``), by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules (or packages) ``name`` imports, relative imports resolved; ``from pkg import
    mod`` names ``pkg.mod`` when that is a module."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names
                      if f"{target}.{alias.name}" in known}
    return found


def graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = module_names(root, package)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def part_of(module: str, package: str) -> str:
    return module[len(package) + 1:].split(".")[0] if module != package else ""


def layer_violations(root: Path, package: str) -> list[str]:
    """Imports of a part of ``package`` from a part it may not import."""
    bad = []
    for module, targets in graph(root, package).items():
        part = part_of(module, package)
        for target in sorted(targets):
            if target == package or target.startswith(package + "."):
                other = part_of(target, package)
                if other != part and other not in MAY_IMPORT[part]:
                    bad.append(f"{module} imports {target} ({part or package} may not import "
                               f"{other or package})")
            elif target.startswith(TOP + "."):
                outside = target.split(".")[1]
                allowed = PACKAGE_MAY_IMPORT["control_api"] | (CLI_MAY_IMPORT if part == "cli"
                                                               else set())
                if outside not in allowed:
                    bad.append(f"{module} imports {target}")
    return bad


def cycles(root: Path, package: str) -> list[list[str]]:
    """Import cycles among the modules of ``package``, one path each."""
    edges = graph(root, package)
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges.get(module, ())):
            if target not in edges or target == module:
                continue
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_no_layer_of_the_control_api_imports_one_above_it():
    assert set(MAY_IMPORT) == {part_of(m, CONTROL) for m in module_names(ROOT / "control_api",
                                                                          CONTROL)}
    assert layer_violations(ROOT / "control_api", CONTROL) == []


def test_the_control_api_has_no_import_cycle():
    assert cycles(ROOT / "control_api", CONTROL) == []


def test_shared_and_the_engine_import_no_package_above_them():
    for package in ("shared", "engine_plugin", "tools"):
        for module, targets in graph(ROOT / package, f"{TOP}.{package}").items():
            outside = {t.split(".")[1] for t in targets if t.startswith(TOP + ".")} - {package}
            assert outside <= PACKAGE_MAY_IMPORT[package], (module, outside)


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    pkg = tmp_path / "control_api"
    for part in ("store", "slots", "api", "cli"):
        (pkg / part).mkdir(parents=True)
        (pkg / part / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "store" / "records.py").write_text("from ..api import app\n")
    (pkg / "api" / "app.py").write_text("from ..store import records\nimport hotwire.tools.demo\n")
    (pkg / "cli" / "client.py").write_text("from hotwire.control_api.slots import engines\n")
    (pkg / "slots" / "a.py").write_text("from . import b\n")
    (pkg / "slots" / "b.py").write_text("from .a import x\n")
    assert layer_violations(pkg, CONTROL) == [
        f"{CONTROL}.api.app imports hotwire.tools.demo",
        f"{CONTROL}.cli.client imports {CONTROL}.slots (cli may not import slots)",
        f"{CONTROL}.store.records imports {CONTROL}.api (store may not import api)",
        f"{CONTROL}.store.records imports {CONTROL}.api.app (store may not import api)",
    ]
    assert sorted(map(tuple, cycles(pkg, CONTROL))) == [
        (f"{CONTROL}.api.app", f"{CONTROL}.store.records", f"{CONTROL}.api.app"),
        (f"{CONTROL}.slots.a", f"{CONTROL}.slots.b", f"{CONTROL}.slots.a"),
    ]


def test_the_packaging_lists_every_package():
    """A package left out of pyproject.toml is missing from the installed wheel (and from the
    editable install, which maps packages explicitly)."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {".".join([TOP, *init.parent.relative_to(ROOT).parts]): init.parent
                for top in PACKAGE_MAY_IMPORT for init in (ROOT / top).rglob("__init__.py")}
    assert sorted(setuptools["packages"]) == sorted(packages)
    mapped = setuptools["package-dir"]
    for name, directory in packages.items():
        parent = max((p for p in mapped if name == p or name.startswith(p + ".")), key=len)
        assert ROOT / mapped[parent] / Path(*name[len(parent) + 1:].split(".")) == directory
