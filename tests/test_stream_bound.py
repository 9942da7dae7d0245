"""The bound on what a whole spec can do to a token's stream (invariant 8): it holds for the op's
own arithmetic, layer after layer and entry beside entry, and admission refuses every spec past
it, however its growth is spread over entries and layers; specs people use still run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from hotwire.engine_plugin.admission import Admission, Admitted, Refused
from hotwire.engine_plugin.interventions import coefficient_words
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.steer_op import reference
from hotwire.engine_plugin.stream_bound import StreamBudget, change
from hotwire.shared.mailbox import ANY_LAYER
from hotwire.shared.spec import parse_spec

H, LAYERS = 16, 12
MODES = [
    {"mode": "add", "scale": 3.0},
    {"mode": "add", "scale": -0.5},
    {"mode": "norm", "scale": 2.0},
    {"mode": "norm", "scale": -0.7},
    {"mode": "ablate", "scale": 1.0},
    {"mode": "ablate", "scale": -4.0},
    {"mode": "ablate", "scale": 3.0},
    {"mode": "clamp", "lo": 2.0, "hi": 5.0},
    {"mode": "clamp", "lo": -1.0, "hi": 1.0},
    {"mode": "clamp", "hi": -3.0},
]


ONE = torch.zeros(1, dtype=torch.int32)  # tok_row: the one token reads row 0 of its route


def _route(entries, rows: list[int], bank: torch.Tensor) -> torch.Tensor:
    """One token's route entries for ``entries`` (parsed) on bank ``rows``."""
    route = torch.zeros(1, len(entries), 8, dtype=torch.int32)
    for k, (e, row) in enumerate(zip(entries, rows)):
        mode, a, lo, hi = coefficient_words(e, float(bank[row].double().norm()))
        route[0, k] = torch.tensor([row, 0, 2**31 - 1, mode, a, lo, hi, 0], dtype=torch.int32)
    return route


@pytest.mark.parametrize("seed", range(12))
def test_the_op_never_grows_the_stream_past_the_bound(seed):
    rng = np.random.default_rng(seed)
    bank = torch.from_numpy(np.concatenate([np.zeros((1, H)), rng.standard_normal((6, H)) * rng.uniform(0.1, 4)]))
    bank = bank.float()
    h = torch.from_numpy(rng.standard_normal((1, H)) * 3).float()
    budget = StreamBudget(cap=math.inf, natural=float(h.norm()), longest=math.inf)
    plan: dict[int, list] = {}
    for layer in range(LAYERS):
        n = int(rng.integers(0, 4))  # entries on this layer: none, one, or several side by side
        picks = [MODES[i] for i in rng.integers(0, len(MODES), n)]
        entries = parse_spec([{"id": "v", "layer": layer, **p} for p in picks])
        rows = [int(r) for r in rng.integers(1, 7, n)]
        if n:
            reference(h, None, torch.zeros(1, dtype=torch.int64), bank, _route(entries, rows, bank), ONE)
        plan[layer] = [change(e.mode, e.scale, float(bank[r].double().norm()), e.lo, e.hi)
                       for e, r in zip(entries, rows)]
        held = {i: c for i, c in plan.items() if c}
        assert float(h.norm()) <= budget.bound(held) * (1 + 1e-5) + 1e-5, (layer, plan)


def test_entries_side_by_side_are_bounded_by_their_changes_added():
    """Three clamps of one direction on one layer each move the projection from the same ``p``:
    together they overshoot, far past what any one of them could do."""
    v = torch.zeros(1 + 1, H)
    v[1, 0] = 1.0
    h = torch.zeros(1, H)
    h[0, 0] = -100.0  # the projection on v: -100
    entries = parse_spec([{"id": "v", "layer": 0, "mode": "clamp", "lo": 1.0, "hi": 1.0}] * 3)
    reference(h, None, torch.zeros(1, dtype=torch.int64), v, _route(entries, [1, 1, 1], v), ONE)
    assert float(h[0, 0]) == 3 * 1.0 + 2 * 100.0  # p + 3·(1 - p)
    budget = StreamBudget(cap=math.inf, natural=100.0, longest=math.inf)
    bound = budget.bound({0: [change(e.mode, e.scale, 1.0, e.lo, e.hi) for e in entries]})
    assert float(h.norm()) <= bound


def test_a_layer_with_one_entry_gets_that_entrys_exact_bound():
    budget = StreamBudget(cap=math.inf, natural=1.0, longest=math.inf)
    assert budget.bound({0: [change("ablate", 1.0, 1.0)]}) == 1.0  # removing a direction never grows h
    assert budget.bound({0: [change("clamp", 0, 1.0, lo=-2.0, hi=2.0)]}) == 1.0  # a clamp around 0 neither
    assert budget.bound({0: [change("norm", 3.0, 1.0)], 5: [change("norm", 3.0, 1.0)]}) == 16.0
    assert budget.bound({0: [change("add", 2.0, 5.0)], 1: [change("ablate", -1.0, 1.0)]}) == (1 + 10) * 2
    # side by side, the changes' own bounds add: norm's |s|·‖h‖ and an add's |s|·‖v‖
    assert budget.bound({0: [change("norm", 3.0, 1.0), change("add", 2.0, 5.0)]}) == 4 + 10


SLOTS = 4


@pytest.fixture
def admission():
    """An engine core's admission over 12 armed layers, float32 (the tiny CPU models' dtype):
    ``unit`` is a (hidden,) vector of ones, max|v| = 1."""
    registry = Registry(SLOTS)
    row = np.ones(H, np.float32)
    registry.bind(0, "unit", ANY_LAYER, 1, float(np.abs(row).max()), float(np.linalg.norm(row)))
    return Admission(registry, armed=range(LAYERS), entries=4, requests=8,
                     budget=StreamBudget.of(torch.float32), counters=None, projecting=range(LAYERS))


def _admit(admission: Admission, *entries) -> Admitted | Refused | None:
    result = admission.admit("r", {"hotwire": json.dumps(list(entries))}, 8)
    admission.finish(("r",))
    return result


@pytest.mark.parametrize("attack", [
    [{"id": "unit", "layers": "all", "scale": 1e37}] * 4,  # each entry small, the spec not
    [{"id": "unit", "layers": "all", "scale": 1e18}],
    [{"id": "unit", "layer": 0, "scale": 1e37}, {"id": "unit", "layer": 1, "mode": "ablate", "scale": -64}],
    [{"id": "unit", "layer": 0, "scale": 1e37}, {"id": "unit", "layer": 1, "mode": "norm", "scale": 64}],
    [{"id": "unit", "layers": "all", "mode": "norm", "scale": 64}],  # 65^12: a multiplication per layer
    [{"id": "unit", "layers": "all", "mode": "ablate", "scale": -64}],
    [{"id": "unit", "layer": 3, "mode": "clamp", "lo": 1e37}],  # pins the projection far from 0
    [{"id": "unit", "layer": 3, "scale": 3.4e38}],
], ids=lambda a: json.dumps(a)[:60])
def test_specs_that_could_overflow_the_stream_are_refused(admission, attack):
    result = _admit(admission, *attack)
    assert isinstance(result, Refused) and result.reason == "out_of_range", result
    assert "every entry on every layer" in result.detail
    assert admission.registry.inflight.sum() == 0


@pytest.mark.parametrize("spec", [
    [{"id": "unit", "layers": "all", "scale": 8.0}],
    [{"id": "unit", "layers": "all", "mode": "ablate", "scale": 1.0}],  # a refusal direction, removed everywhere
    [{"id": "unit", "layers": "all", "mode": "norm", "scale": 0.5}, {"id": "unit", "layer": 4, "scale": -6.0}],
    [{"id": "unit", "layers": "all", "mode": "clamp", "lo": -3.0, "hi": 3.0}],
    [{"id": "unit", "layer": 2, "scale": 1e15}],
], ids=lambda a: json.dumps(a)[:60])
def test_specs_people_use_are_admitted(admission, spec):
    assert isinstance(_admit(admission, *spec), Admitted)


def test_a_vector_too_long_to_project_on_is_refused(admission):
    budget = admission.budget
    long = np.full(H, budget.longest, np.float64)  # ‖v‖ = 4·longest
    admission.registry.bind(1, "long", ANY_LAYER, 1, float(long.max()), float(np.linalg.norm(long)))
    result = _admit(admission, {"id": "long", "layer": 1, "mode": "ablate", "scale": 1e-30})
    assert isinstance(result, Refused) and result.reason == "out_of_range" and "too long" in result.detail
    gated = {"id": "unit", "layer": 2, "scale": 1.0, "gate": {"probe": "long", "layer": 1}}
    assert _admit(admission, gated).reason == "out_of_range"


def test_the_cap_keeps_both_addends_and_the_ops_float32_sums_finite():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        b = StreamBudget.of(dtype)
        assert 2 * b.cap <= torch.finfo(dtype).max / 2  # each addend of vLLM's residual pair
        assert b.cap**2 < torch.finfo(torch.float32).max  # ‖h‖² in float32
        assert b.cap * b.longest < torch.finfo(torch.float32).max  # h·v in float32
        assert b.natural**2 == pytest.approx(b.cap)
