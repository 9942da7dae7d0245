"""``docs/architecture.md`` keeps up with the code: every "invariant N" the code, the tests and the
docs cite is one the document defines (nine, numbered 1-9), every test it names exists, and its
module map has one line for every module there is and none for a module that is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
MAPPED = ("engine_plugin", "shared", "control_api", "tools")  # packages the module map covers
CITING = (*MAPPED, "tests", "benchmarks")  # where code and tests cite invariants

# "invariant 5", "Invariant 8's", "invariants 5 and 8", "invariants 1-9"
CITATION = re.compile(r"\binvariants?\s+(\d+(?:\s*(?:,|and|or|-|–)\s*\d+)*)", re.I)
OUTSIDE_BRIEF = re.compile(r"\bDESIGN\.md\b")  # a brief from outside the repository


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def defined_invariants(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^### Invariant (\d+): \S", section(text, "Invariants"), re.M)]


def cited_invariants(text: str) -> set[int]:
    return {int(n) for group in CITATION.findall(text) for n in re.findall(r"\d+", group)}


def citing_files() -> list[Path]:
    """Code, tests, README and docs (this file aside: its checks quote wrong citations)."""
    here = Path(__file__).resolve()
    files = [p for top in CITING for p in sorted((ROOT / top).rglob("*.py")) if p != here]
    return [*files, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def module_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for top in MAPPED for p in (ROOT / top).rglob("*.py")
            if "__pycache__" not in p.parts}


def mapped_modules(text: str) -> set[str]:
    return set(re.findall(r"^- `([\w/]+\.py)`: \S", section(text, "Module map"), re.M))


def test_the_document_defines_invariants_1_to_9_once_each():
    assert defined_invariants(DOC) == list(range(1, 10))


def test_every_cited_invariant_is_defined_in_the_document():
    defined = set(defined_invariants(DOC))
    wrong = {f"{path.relative_to(ROOT)}: invariant {n}" for path in citing_files()
             for n in cited_invariants(path.read_text()) if n not in defined}
    assert not wrong, f"citations of invariants docs/architecture.md does not define: {sorted(wrong)}"


def test_nothing_cites_the_outside_brief_instead_of_the_document():
    citing = [str(path.relative_to(ROOT)) for path in citing_files()
              if OUTSIDE_BRIEF.search(path.read_text())]
    assert not citing, f"cite docs/architecture.md instead in {citing}"


def test_every_module_has_a_line_in_the_module_map_and_every_line_a_module():
    modules, mapped = module_files(), mapped_modules(DOC)
    assert not modules - mapped, f"modules without a line in the module map: {sorted(modules - mapped)}"
    assert not mapped - modules, f"module map lines for modules that do not exist: {sorted(mapped - modules)}"


def test_every_test_the_document_names_exists():
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", DOC)
    assert len(named) >= 9
    missing = []
    for file, name in named:
        path = ROOT / file
        defined = set() if not path.exists() else {
            node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name not in defined:
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/architecture.md names tests that do not exist: {missing}"


def test_the_checks_catch_what_they_are_for():
    """Each check above can fail: a wrong citation, an unmapped module, a vanished one."""
    assert cited_invariants("invariant 10; Invariant 8's backstop; invariants 5 and 8") == {10, 8, 5}
    assert cited_invariants("VLLM_BATCH_INVARIANT=1, batch-invariant kernels") == set()
    broken = DOC.replace("### Invariant 9:", "### Invariant 10:")
    assert defined_invariants(broken) != list(range(1, 10))
    dropped = DOC.replace("- `engine_plugin/salts.py`:", "- salts:")
    assert "engine_plugin/salts.py" in module_files() - mapped_modules(dropped)
    gone = DOC.replace("- `engine_plugin/salts.py`:",
                       "- `engine_plugin/gone.py`: x\n- `engine_plugin/salts.py`:")
    assert mapped_modules(gone) - module_files() == {"engine_plugin/gone.py"}
