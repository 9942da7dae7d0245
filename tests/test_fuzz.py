"""Fuzzing the control API from its own OpenAPI schema with schemathesis, bounded in time.

A real control API (uvicorn) on a real engine mailbox, with both tokens set, one vector
registered under the id the schema gives as its example. schemathesis generates valid and
invalid requests for every operation (its coverage, fuzzing and stateful phases) and checks
each response: never a 5xx, status codes, content types, headers and bodies as documented,
invalid input refused, and reads and writes refused without a token. Left out:
``positive_data_acceptance``, because a schema cannot say what makes a vector valid (a
safetensors file whose shape matches the attached model).

The suite runs the same test cases every time: ``HOTWIRE_FUZZ_EXAMPLES`` per operation (default
250, about 3,400 cases, 35 s on 2 cores), generated deterministically from the seed. ``make fuzz``
explores for ``HOTWIRE_FUZZ_SECONDS`` instead (180) and prints schemathesis' summary.
``HOTWIRE_FUZZ_SEED`` picks the seed (default fixed, for CI).
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

# The suite's run is bounded by examples, so every run generates the same test cases (a run
# bounded by time repeats its fuzzing and stateful phases as far as the machine's speed takes it,
# and so checks more on one run than on another); `make fuzz` explores for a time instead.
FUZZ_SECONDS = int(os.environ.get("HOTWIRE_FUZZ_SECONDS", "0"))
FUZZ_EXAMPLES = int(os.environ.get("HOTWIRE_FUZZ_EXAMPLES", "250"))
FUZZ_SEED = os.environ.get("HOTWIRE_FUZZ_SEED", "20261201")
BUDGET = (["--max-time", str(FUZZ_SECONDS)] if FUZZ_SECONDS else
          ["--max-examples", str(FUZZ_EXAMPLES), "--generation-deterministic"])
READ_TOKEN = "fuzz-reader"


def _schemathesis() -> str:
    beside = Path(sys.executable).with_name("schemathesis")
    found = str(beside) if beside.exists() else shutil.which("schemathesis")
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    return found


@pytest.mark.slow
@pytest.mark.timeout(FUZZ_SECONDS * 2 + 120 if FUZZ_SECONDS else 900)
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
             *BUDGET, "--seed", FUZZ_SEED,
             "--exclude-checks", "positive_data_acceptance",
             "--request-timeout", "30", "--no-color"],
            capture_output=True, text=True, cwd=tmp_path,
            timeout=FUZZ_SECONDS * 2 + 60 if FUZZ_SECONDS else 840)
        healthy = rig.http.get("/readyz").status_code
    finally:
        rig.stop()
    summary = run.stdout[run.stdout.find("SUMMARY"):] if "SUMMARY" in run.stdout else run.stdout
    print(f"\n$ schemathesis run ... {' '.join(BUDGET)} --seed {FUZZ_SEED}\n{summary}")
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert re.search(r"\d+ generated", run.stdout), "schemathesis ran no test case"
    assert healthy == 200
