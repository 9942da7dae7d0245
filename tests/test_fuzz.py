"""Fuzzing the control API from its own OpenAPI schema with schemathesis, bounded in time.

A real control API (uvicorn) on a real engine mailbox, with both tokens set, one vector
registered under the id the schema gives as its example. schemathesis generates valid and
invalid requests for every operation (its coverage, fuzzing and stateful phases) and checks
each response: never a 5xx, status codes, content types, headers and bodies as documented,
invalid input refused, and reads and writes refused without a token. Left out:
``positive_data_acceptance``, because a schema cannot say what makes a vector valid (a
safetensors file whose shape matches the attached model).

The suite runs it for ``HOTWIRE_FUZZ_SECONDS`` (default 30); ``make fuzz`` for 180 and prints
schemathesis' summary. ``HOTWIRE_FUZZ_SEED`` picks the seed (default fixed, for CI).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from control_harness import FP, TOKEN, Rig, exact_vector

FUZZ_SECONDS = int(os.environ.get("HOTWIRE_FUZZ_SECONDS", "30"))
FUZZ_SEED = os.environ.get("HOTWIRE_FUZZ_SEED", "20261201")
READ_TOKEN = "fuzz-reader"


def _schemathesis() -> str:
    beside = Path(sys.executable).with_name("schemathesis")
    found = str(beside) if beside.exists() else shutil.which("schemathesis")
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    return found


@pytest.mark.slow
@pytest.mark.timeout(FUZZ_SECONDS * 2 + 120)
def test_fuzz_from_the_openapi_schema(tmp_path):
    command = _schemathesis()
    rig = Rig(tmp_path, read_token=SecretStr(READ_TOKEN), max_upload_bytes=2**20)
    rig.start_engine(n_slots=32)
    rig.start_api()
    try:
        assert rig.push("tesla_car", exact_vector(FP.hidden)).status_code == 201
        run = subprocess.run(
            [command, "run", f"{rig.server.url}/openapi.json",
             "--header", f"Authorization: Bearer {TOKEN}",
             "--max-time", str(FUZZ_SECONDS), "--seed", FUZZ_SEED,
             "--exclude-checks", "positive_data_acceptance",
             "--request-timeout", "30", "--no-color"],
            capture_output=True, text=True, cwd=tmp_path, timeout=FUZZ_SECONDS * 2 + 60)
        healthy = rig.http.get("/readyz").status_code
    finally:
        rig.stop()
    summary = run.stdout[run.stdout.find("SUMMARY"):] if "SUMMARY" in run.stdout else run.stdout
    print(f"\n$ schemathesis run ... --max-time {FUZZ_SECONDS} --seed {FUZZ_SEED}\n{summary}")
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert re.search(r"\d+ generated", run.stdout), "schemathesis ran no test case"
    assert healthy == 200
