"""benchmarks/served_step.py: the served load replayed through the real hooks, with requests
coming and going, every steered one admitted (a smoke test: the figures are the benchmark's)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from served_step import HOOKS, run  # noqa: E402


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_the_replayed_load_has_steady_and_changed_steps_timed_by_hook(runner):
    result = run(concurrency=16, steps=300, cold=False, ahead=True, device=torch.device("cpu"), runner=runner)
    assert result["steady"]["steps"] > 0 and result["changed"]["steps"] > 0
    assert result["steady"]["steps"] + result["changed"]["steps"] == 300
    for kind in ("steady", "changed"):
        assert all(result[kind][h] > 0 for h in HOOKS)
