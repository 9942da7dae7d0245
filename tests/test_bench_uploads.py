"""``benchmarks/bench_site/uploads.py``: the benchmark's stand-ins for hotwire's routing uploads take
what :meth:`HostRing.copy` takes, so a server kind that sets ``BENCH_UPLOADS`` routes the V2
runner's batches (a copy with an expansion) as hotwire does."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHECK = """
import inspect
from hotwire.engine_plugin import staging
before = list(inspect.signature(staging.HostRing.copy).parameters)
import uploads  # noqa: F401
print(list(inspect.signature(staging.HostRing.copy).parameters) == before, before)
"""


def test_no_uploads_takes_what_hostring_copy_takes():
    env = {**os.environ, "BENCH_UPLOADS": "none",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks" / "bench_site"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("True ['self', 'spans', 'expansion']"), done.stdout
