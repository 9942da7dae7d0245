"""The ``hotwire`` command line against a real ``hotwire control-api`` process over HTTP."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from hotwire.control_api.cli.client import ControlClient
from hotwire.control_api.cli.exit_codes import (EXIT_CODES, EXIT_CONFLICT, EXIT_ERROR, EXIT_FILE,
                                                EXIT_INVALID, EXIT_OK, EXIT_UNAUTHORIZED,
                                                EXIT_UNREACHABLE, EXIT_USAGE)
from hotwire.control_api.cli.main import build_parser, main
from hotwire.shared.mailbox import ANY_LAYER

from control_harness import FP, TOKEN, EnginePump, exact_vector, free_port, wait_until

H = FP.hidden
HOTWIRE = str(Path(sys.executable).with_name("hotwire"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """An engine pump and a ``hotwire control-api`` subprocess on a free port."""
    tmp = tmp_path_factory.mktemp("cli")
    mailbox = tmp / "shm" / "engine.mbx"
    engine = EnginePump(mailbox)
    port = free_port()
    env = {**os.environ, "HOTWIRE_TOKEN": TOKEN}
    server = subprocess.Popen(
        [HOTWIRE, "control-api", "--host", "127.0.0.1", "--port", str(port), "--mailbox",
         str(mailbox), "--state-dir", str(tmp / "state"), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert server.poll() is None, server.stdout.read()
        try:
            return httpx.get(f"{url}/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, timeout=30, what="hotwire control-api to become ready")
        yield url, engine, tmp
    finally:
        server.terminate()
        server.wait(10)
        engine.stop()


def cli(capsys, url: str, *args: str, token: str | None = TOKEN) -> tuple[int, str, str]:
    argv = [*args, "--url", url] + (["--token", token] if token else [])
    status = main(argv)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_push_list_slots_rm(served, capsys):
    url, engine, tmp = served
    per_layer = exact_vector(FP.n_layers, H, seed=1)
    save_file({"steer": per_layer}, tmp / "per_layer.safetensors")
    flat = exact_vector(H, seed=2).astype(np.float16)
    np.save(tmp / "flat.npy", flat)

    status, out, err = cli(capsys, url, "vectors", "push", "cli_layers",
                           str(tmp / "per_layer.safetensors"), "--layers", "1-2", "--pin")
    assert status == 0, err
    assert "cli_layers: generation 1, resident" in out
    entries = engine.entries("cli_layers")
    assert sorted(entries) == [1, 2]
    np.testing.assert_array_equal(entries[2][2], per_layer[2])

    status, out, err = cli(capsys, url, "vectors", "push", "cli_flat", str(tmp / "flat.npy"),
                           "--metadata", '{"note": "npy"}')
    assert status == 0, err
    np.testing.assert_array_equal(engine.entries("cli_flat")[ANY_LAYER][2], flat.astype(np.float32))

    status, out, _ = cli(capsys, url, "vectors", "list", token=None)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "GEN", "SHAPE"]
    assert [line.split()[0] for line in lines[1:]] == ["cli_flat", "cli_layers"]
    assert "float16" in lines[1] and f"{FP.n_layers}x{H}" in lines[2]
    assert lines[2].split()[4] == "1-2"  # a layer set as ranges, as --layers takes it

    status, out, _ = cli(capsys, url, "slots", token=None)
    assert status == 0
    assert FP.model in out and "slots 3/8 used" in out
    slot_rows = [line.split() for line in out.splitlines() if "cli_" in line]
    assert sorted((row[1], row[2]) for row in slot_rows) == \
        [("cli_flat", "any"), ("cli_layers", "1"), ("cli_layers", "2")]

    status, out, _ = cli(capsys, url, "vectors", "rm", "cli_flat")
    assert (status, out.strip()) == (0, "removed cli_flat")
    assert engine.entries("cli_flat") == {}


def test_push_stores_the_files_own_metadata_under_the_flags(served, capsys):
    """What ``vectors make`` writes into the file (layer, suggested scale, norms, recipe)
    travels with a push; ``--metadata`` adds to it, its keys winning."""
    url, _, tmp = served
    made = {"layer": "2", "suggested_scale": "2.5", "stream_norm": "10", "recipe": "mean"}
    save_file({"vector": exact_vector(H, seed=6)}, tmp / "made.safetensors", metadata=made)

    def stored(vector_id: str) -> dict:
        client = ControlClient(url, TOKEN)
        try:
            return client.vector(vector_id)["metadata"]
        finally:
            client.close()

    assert cli(capsys, url, "vectors", "push", "made", str(tmp / "made.safetensors"))[0] == EXIT_OK
    assert stored("made") == made
    status, _, err = cli(capsys, url, "vectors", "push", "made", str(tmp / "made.safetensors"),
                         "--replace", "--metadata", '{"suggested_scale": 1, "note": "tuned"}')
    assert status == EXIT_OK, err
    assert stored("made") == {**made, "suggested_scale": 1, "note": "tuned"}
    save_file({"vector": exact_vector(H, seed=7)}, tmp / "bare.safetensors")
    assert cli(capsys, url, "vectors", "push", "bare", str(tmp / "bare.safetensors"))[0] == EXIT_OK
    assert stored("bare") == {}
    for vector_id in ("made", "bare"):
        assert cli(capsys, url, "vectors", "rm", vector_id)[0] == EXIT_OK


def test_not_found_exits_with_the_other_error_code(served, capsys):
    url, _, _ = served
    status, _, err = cli(capsys, url, "vectors", "rm", "never_was")
    assert status == EXIT_ERROR and "not_found" in err


def test_unreachable_exit_code(served, capsys):
    status, _, err = cli(capsys, f"http://127.0.0.1:{free_port()}", "vectors", "list")
    assert status == EXIT_UNREACHABLE and "cannot reach the control API" in err


def test_unauthorized_exit_code(served, capsys):
    url, _, tmp = served
    np.save(tmp / "ok.npy", exact_vector(H))
    status, _, err = cli(capsys, url, "vectors", "push", "denied", str(tmp / "ok.npy"),
                         token="wrong-token")
    assert status == EXIT_UNAUTHORIZED and "unauthorized" in err
    status, _, err = cli(capsys, url, "vectors", "push", "denied", str(tmp / "ok.npy"), token=None)
    assert status == EXIT_UNAUTHORIZED and "unauthorized" in err


def test_conflict_exit_code(served, capsys):
    url, _, tmp = served
    np.save(tmp / "twice.npy", exact_vector(H, seed=3))
    assert cli(capsys, url, "vectors", "push", "twice", str(tmp / "twice.npy"))[0] == EXIT_OK
    status, _, err = cli(capsys, url, "vectors", "push", "twice", str(tmp / "twice.npy"))
    assert status == EXIT_CONFLICT and "exists" in err
    assert cli(capsys, url, "vectors", "rm", "twice")[0] == EXIT_OK


def test_invalid_exit_code(served, capsys):
    url, _, tmp = served
    np.save(tmp / "bad.npy", np.full(H + 1, 0.5, dtype=np.float32))
    status, _, err = cli(capsys, url, "vectors", "push", "bad", str(tmp / "bad.npy"))
    assert status == EXIT_INVALID and "bad_shape" in err and "does not match the model" in err


@pytest.mark.parametrize("name", ["missing.npy", "missing.safetensors", "a_dir.npy", "junk.npy"])
def test_missing_or_unreadable_file_exits_without_a_traceback(served, name):
    url, _, tmp = served
    (tmp / "a_dir.npy").mkdir(exist_ok=True)
    (tmp / "junk.npy").write_bytes(b"not an array")
    done = subprocess.run([HOTWIRE, "vectors", "push", "v", str(tmp / name), "--url", url,
                           "--token", TOKEN], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == EXIT_FILE, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"hotwire: file_error: {tmp / name}: ")


def test_bad_arguments_exit_with_usage(served, capsys):
    url, _, tmp = served
    np.save(tmp / "ok.npy", exact_vector(H))
    with pytest.raises(SystemExit) as exited:
        cli(capsys, url, "vectors", "push", "m", str(tmp / "ok.npy"), "--metadata", "[1]")
    assert exited.value.code == EXIT_USAGE
    assert "expected a JSON object" in capsys.readouterr().err
    status, _, err = cli(capsys, url, "vectors", "push", "m", str(tmp / "ok.npy"), "--key", "k")
    assert status == EXIT_USAGE and "--key applies to .safetensors" in err


def test_replace_keeps_the_pin_unless_told(served, capsys):
    url, _, tmp = served
    np.save(tmp / "v1.npy", exact_vector(H, seed=4))
    np.save(tmp / "v2.npy", exact_vector(H, seed=5))

    def pinned() -> bool:
        client = ControlClient(url, TOKEN)
        try:
            return client.vector("pinme")["pinned"]
        finally:
            client.close()

    def push(*extra: str) -> None:
        status, _, err = cli(capsys, url, "vectors", "push", "pinme", str(tmp / "v2.npy"), *extra)
        assert status == EXIT_OK, err

    assert cli(capsys, url, "vectors", "push", "pinme", str(tmp / "v1.npy"), "--pin")[0] == EXIT_OK
    push("--replace")
    assert pinned() is True
    push("--replace", "--no-pin")
    assert pinned() is False
    push("--replace")
    assert pinned() is False
    push("--replace", "--pin")
    assert pinned() is True
    assert cli(capsys, url, "vectors", "rm", "pinme")[0] == EXIT_OK
    push("--replace")
    assert pinned() is False
    assert cli(capsys, url, "vectors", "rm", "pinme")[0] == EXIT_OK


def test_version_and_exit_codes_in_help(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"hotwire {version('hotwire')}"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code, meaning in EXIT_CODES.items():
        assert f"  {code}  {meaning}" in out
    assert len(set(EXIT_CODES)) == len(EXIT_CODES) == 8


@pytest.mark.parametrize("command", ["vectors", "slots"])
def test_every_client_option_has_help(command):
    def undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    missing += undocumented(sub, f"{path} {name}")
            elif not action.help:
                missing.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert undocumented(build_parser([command]), "hotwire") == []


def test_console_script_runs_client_commands(served):
    url, _, _ = served
    done = subprocess.run([HOTWIRE, "vectors", "list", "--json", "--url", url],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.lstrip().startswith("[")
    done = subprocess.run([HOTWIRE, "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "control-api" in done.stdout and "vectors" in done.stdout
