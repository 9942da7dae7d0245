"""Control API settings (control_api.api.settings, and the ``hotwire control-api`` flags of
control_api.api.serve): every one from the environment, flags over it, safe defaults.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from hotwire.control_api.api import serve
from hotwire.control_api.api.settings import Settings, default_state_dir

READ_TOKEN = "r3ad-only"


def test_replica_is_a_setting_defaulting_to_the_hostname():
    assert Settings.from_env({}).replica == socket.gethostname()
    assert Settings.from_env({"HOTWIRE_REPLICA": "pod-3"}).replica == "pod-3"
    assert Settings.ENV["replica"] == "HOTWIRE_REPLICA"


def test_the_default_state_dir_is_absolute(tmp_path, monkeypatch):
    assert default_state_dir({"XDG_STATE_HOME": "/srv/state"}, euid=1000) == \
        Path("/srv/state/hotwire")
    assert default_state_dir({"XDG_STATE_HOME": "relative"}, euid=0) == Path("/var/lib/hotwire")
    assert default_state_dir({}, euid=0) == Path("/var/lib/hotwire")
    assert default_state_dir({}, euid=1000) == Path.home() / ".local/state/hotwire"
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({}).state_dir.is_absolute()
    assert Settings().state_dir.is_absolute()
    xdg = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    assert Settings.from_env(xdg).catalog_path == tmp_path / "xdg/hotwire/catalog.sqlite3"


def test_unknown_vectors_is_a_setting_with_a_flag():
    assert Settings.from_env({}).unknown_vectors == "adopt"
    assert Settings.from_env({"HOTWIRE_UNKNOWN_VECTORS": "retire"}).unknown_vectors == "retire"
    with pytest.raises(ValidationError):
        Settings.from_env({"HOTWIRE_UNKNOWN_VECTORS": "ignore"})
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    assert parser.parse_args(["--unknown-vectors", "retire"]).unknown_vectors == "retire"
    assert parser.parse_args([]).unknown_vectors is None


def test_the_read_token_is_read_from_the_environment():
    settings = Settings.from_env({"HOTWIRE_READ_TOKEN": READ_TOKEN})
    assert settings.read_token.get_secret_value() == READ_TOKEN
    assert Settings.from_env({"HOTWIRE_READ_TOKEN": ""}).read_token is None


def test_the_control_api_listens_on_localhost_unless_told():
    assert Settings().host == "127.0.0.1"
    assert Settings.from_env({"HOTWIRE_HOST": "0.0.0.0"}).host == "0.0.0.0"
    help_text = " ".join(subprocess.run([sys.executable, "-m", "hotwire.control_api.cli",
                                         "control-api", "--help"], capture_output=True, text=True,
                                        check=True).stdout.split())
    assert "default 127.0.0.1" in help_text and "0.0.0.0" in help_text
    assert "HOTWIRE_READ_TOKEN" in help_text and "HOTWIRE_TOKEN" in help_text
