"""``hotwire vectors sweep``: calibrate a vector's (or a preset's) scale on the running engine.

The vector or preset comes from the control API; the measuring goes through the engine's
OpenAI server (:mod:`hotwire.tools.sweep`, which says what is measured and how the
recommendation is chosen). Progress goes to stderr, the table and the recommendation to stdout,
every point to the JSON file, the plot to a PNG (with matplotlib installed). ``--save-preset``
stores the recommended entries as a preset whose metadata is the calibration: what was swept,
on which model, in which regime, what was measured at every point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .arguments import parse_layers, parse_name, parse_scale
from .client import ControlApiError, ControlClient, add_client_options, client_command
from .tables import format_table

if TYPE_CHECKING:  # imported when the command runs: the other commands stay light
    from hotwire.tools.sweep import Recommendation, SweepReport, Target

DEFAULT_SERVER = "http://127.0.0.1:8000"
KL_BUDGET = 0.2  # nats per token on the neutral text; see README, "Choosing a scale"
MIN_EFFECT = 0.01
TOP_LOGPROBS = 20  # vLLM's default --max-logprobs


def configure(actions: argparse._SubParsersAction) -> None:
    sub = actions.add_parser(
        "sweep", help="measure a vector's effect and damage over a grid of scales on the running "
                      "engine; recommend a scale",
        description="For each scale (and layer) of the grid, one batch on the engine's OpenAI "
                    "server: the effect you name (--words, --ab or --score) and the damage (KL "
                    "from the unsteered next-token distribution and perplexity, on a neutral "
                    "text). Recommends the largest |scale| whose KL stays within --kl-budget; "
                    "--save-preset stores it with the measurements. See README, \"Choosing a "
                    "scale\".")
    sub.add_argument("vector", nargs="?", type=parse_name, help="the vector's id (or --preset)")
    sub.add_argument("--preset", type=parse_name,
                     help="sweep a preset instead: the grid's scales multiply its entries' scales")
    sub.add_argument("--scales", type=parse_scale, nargs="+", required=True, metavar="S",
                     help="the grid, e.g. -4 -2 0 1 2 4 8 (0 is the unsteered model)")
    sub.add_argument("--layers", type=parse_layers,
                     help="layers to sweep, e.g. 10,15 (default: the vector's metadata `layer`)")
    sub.add_argument("--mode", choices=("add", "norm"), default="add",
                     help="how the vector steers (default add: h += scale * v)")
    effect = sub.add_mutually_exclusive_group(required=True)
    effect.add_argument("--words", type=_words,
                        help="effect: log P(any of these words) right after the stem, e.g. "
                             "happy,glad,great")
    effect.add_argument("--ab", type=Path, metavar="FILE",
                        help="effect: P(matching answer) of multiple-choice questions, a JSONL "
                             "file of {\"question\", \"answer_matching_behavior\": \"(A)\"}")
    effect.add_argument("--score", metavar="MODULE:FUNCTION",
                        help="effect: the mean of FUNCTION(text) -> number over the greedy "
                             "continuations")
    sub.add_argument("--stem", help="text the answer starts with, after the prompt (default: "
                                    "none for --words, 'The answer is' for --ab)")
    sub.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                     help="a prompt (repeat; default: three everyday questions)")
    sub.add_argument("--prompts-file", type=Path, help="prompts, one per line")
    sub.add_argument("--no-chat", dest="chat", action="store_false",
                     help="send prompts as raw text, not through the model's chat template")
    sub.add_argument("--max-tokens", type=_positive, default=24,
                     help="tokens generated per prompt for --score (default 24)")
    sub.add_argument("--neutral-file", type=Path,
                     help="the text damage is measured on (default: a bundled paragraph of "
                          "plain prose)")
    sub.add_argument("--top-logprobs", type=_positive, default=TOP_LOGPROBS,
                     help=f"tokens per position the KL covers (default {TOP_LOGPROBS}, vLLM's "
                          "--max-logprobs)")
    sub.add_argument("--kl-budget", type=float, default=KL_BUDGET,
                     help=f"the most KL (nats per token) a recommended scale may cost (default "
                          f"{KL_BUDGET:g})")
    sub.add_argument("--min-effect", type=float, default=MIN_EFFECT,
                     help=f"an effect that moves less than this is no effect (default "
                          f"{MIN_EFFECT:g})")
    sub.add_argument("--server", default=os.environ.get("OPENAI_BASE_URL", DEFAULT_SERVER),
                     help=f"the engine's OpenAI server ($OPENAI_BASE_URL, default "
                          f"{DEFAULT_SERVER})")
    sub.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                     help="its --api-key, if it has one ($OPENAI_API_KEY)")
    sub.add_argument("--model", help="the served model name (default: the server's first)")
    sub.add_argument("--out", type=Path, help="the JSON of every point (default: "
                                              "sweep-<name>.json)")
    sub.add_argument("--plot", type=Path, help="the PNG plot (default: sweep-<name>.png; needs "
                                               "matplotlib)")
    sub.add_argument("--save-preset", type=parse_name, metavar="NAME",
                     help="store the recommendation as preset NAME, the measurements as its "
                          "metadata")
    sub.add_argument("--replace", action="store_true", help="replace a preset NAME that exists")
    add_client_options(sub)
    sub.set_defaults(run=_sweep)


def _words(text: str) -> list[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise argparse.ArgumentTypeError("name at least one word")
    return words


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return int(text)


@client_command
def _sweep(client: ControlClient, args: argparse.Namespace) -> None:
    from hotwire.tools.progress import Progress

    if (args.vector is None) == (args.preset is None):
        raise ControlApiError(0, "bad_usage", "name a vector or --preset, not both")
    target, layers, source = _target(client, args)
    inputs = _inputs(args)
    name = args.vector or args.preset
    progress = Progress("hotwire vectors sweep")
    report = asyncio.run(_measure(args, target, layers, inputs, progress.phase))
    print(format_table(["LAYER", "SCALE", "EFFECT", "KL", "PERPLEXITY"], [
        (p.layer, f"{p.scale:g}", f"{p.effect:.4g}", f"{p.kl:.4g}", f"{p.perplexity:.4g}")
        for p in report.points]))
    rec = report.recommendation
    print(f"recommended: {'none' if rec is None else _described(rec)} ({report.reason})")
    out = args.out or Path(f"sweep-{name}.json")
    _write(out, report.model_dump_json(indent=2))
    print(f"wrote {out}")
    _plot(report, args.plot or Path(f"sweep-{name}.png"))
    if args.save_preset:
        if rec is None:
            raise ControlApiError(0, "no_recommendation", f"nothing to save as preset "
                                  f"{args.save_preset}: {report.reason}")
        entries = target.spec(rec.layer, rec.scale)
        info = client.store_preset(args.save_preset, entries, replace=args.replace,
                                   description=_description(report), metadata=_passport(
                                       report, entries, source))
        print(f"stored preset {info['name']}: {info['description']}")


def _target(client: ControlClient, args: argparse.Namespace
            ) -> tuple[Target, list[int | None], dict[str, Any]]:
    """What to sweep, at which layers, and its catalog record (for the preset's metadata)."""
    from hotwire.tools.sweep import PresetTarget, VectorTarget

    if args.preset:
        if args.layers:
            raise ControlApiError(0, "bad_usage", "a preset steers its own layers; --layers "
                                  "applies to a vector")
        preset = client.preset(args.preset)
        for i, entry in enumerate(preset["entries"]):
            if entry.get("decode_only") or entry.get("positions", "all") != "all":
                raise ControlApiError(0, "bad_usage", f"preset {args.preset} entry {i} steers "
                                      "only some tokens; the sweep reads its measures off prompt "
                                      "tokens, so it steers every one: sweep its vector instead")
        return PresetTarget(args.preset, tuple(preset["entries"])), [None], {"preset": preset}
    record = client.vector(args.vector)
    layers = args.layers
    if not layers:
        layer = record.get("metadata", {}).get("layer")
        if type(layer) is not int:
            raise ControlApiError(0, "bad_usage", f"vector {args.vector}'s metadata names no "
                                  "layer: give --layers")
        layers = [layer]
    return VectorTarget(args.vector, args.mode), list(dict.fromkeys(layers)), {
        "vector": {k: record.get(k) for k in ("id", "generation", "shape", "metadata")}}


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The prompts, the A/B questions, the neutral text: every local file read, or file_error."""
    from hotwire.tools.sweep import DEFAULT_PROMPTS, NEUTRAL_TEXT

    prompts = list(args.prompt) + (_lines(args.prompts_file) if args.prompts_file else [])
    neutral = _read(args.neutral_file) if args.neutral_file else NEUTRAL_TEXT
    if not neutral.strip():
        raise ControlApiError(0, "file_error", f"{args.neutral_file}: empty")
    return {"prompts": prompts or list(DEFAULT_PROMPTS), "neutral": neutral,
            "neutral_source": str(args.neutral_file or "bundled paragraph"),
            "questions": _questions(args.ab) if args.ab else None}


def _questions(path: Path) -> list[tuple[str, str]]:
    """``(question, matching letter)`` per line of a CAA-style JSONL file."""
    questions = []
    for n, line in enumerate(_lines(path), 1):
        try:
            item = json.loads(line)
            question, answer = item["question"], item["answer_matching_behavior"]
        except (ValueError, KeyError, TypeError):
            raise ControlApiError(0, "file_error", f"{path}:{n}: expected a JSON object with "
                                  "question and answer_matching_behavior") from None
        letter = "".join(c for c in str(answer) if c in "AB")
        if not isinstance(question, str) or letter not in ("A", "B"):
            raise ControlApiError(0, "file_error", f"{path}:{n}: answer_matching_behavior "
                                  f"{answer!r} names neither A nor B")
        questions.append((question, letter))
    if not questions:
        raise ControlApiError(0, "file_error", f"{path}: no questions")
    return questions


async def _measure(args: argparse.Namespace, target: Target, layers: list[int | None],
                   inputs: dict[str, Any], progress: Callable[[str], None]) -> SweepReport:
    from hotwire.tools import sweep
    from hotwire.tools.served_model import ServedModel, ServedModelError
    from hotwire.tools.sweep_measures import ScorerError

    try:
        async with ServedModel(args.server, model=args.model, api_key=args.api_key) as model:
            progress(f"{await model.model()} at {model.url}: tokenizing, then the unsteered "
                     "model")
            if args.words:
                effect = await sweep.words_effect(model, inputs["prompts"], args.stem or "",
                                                  args.words, args.chat)
            elif args.ab:
                effect = await sweep.ab_effect(model, inputs["questions"],
                                               "The answer is" if args.stem is None else args.stem,
                                               args.chat)
            else:
                effect = await sweep.score_effect(model, inputs["prompts"], args.score,
                                                  args.max_tokens, args.chat)
            damage = await sweep.damage_on(model, inputs["neutral"], args.top_logprobs,
                                           inputs["neutral_source"])
            return await sweep.sweep(model, target, layers, list(dict.fromkeys(args.scales)),
                                     effect, damage,
                                     kl_budget=args.kl_budget, min_effect=args.min_effect,
                                     progress=progress)
    except ServedModelError as e:
        raise ControlApiError(0, "engine_error", str(e)) from None
    except ScorerError as e:
        raise ControlApiError(0, "bad_usage", str(e)) from None


def _plot(report: SweepReport, path: Path) -> None:
    from hotwire.tools.sweep_plot import PlotUnavailable, plot

    try:
        print(f"wrote {plot(report, path)}")
    except PlotUnavailable as e:
        print(str(e))


def _described(rec: Recommendation) -> str:
    where = "" if rec.layer is None else f" at layer {rec.layer}"
    return (f"scale {rec.scale:g}{where}: effect {rec.effect:.4g}, KL {rec.kl:.4g}, perplexity "
            f"{rec.perplexity:.4g}")


def _description(report: SweepReport) -> str:
    return (f"calibrated by hotwire vectors sweep on {report.model}: "
            f"{_described(report.recommendation)} (KL budget {report.kl_budget:g})")


def _passport(report: SweepReport, entries: list[dict[str, Any]],
              source: dict[str, Any]) -> dict[str, Any]:
    """The preset's metadata: what was calibrated, on which model, in which regime, measured how."""
    rec = report.recommendation
    return {"calibrated_by": "hotwire vectors sweep", "measured_at": report.measured_at,
            "model": report.model, "server": report.server, "calibrated": {
                "entries": entries, "layer": rec.layer, "scale": rec.scale,
                "mode": report.target.get("mode")},
            **source, "regime": report.regime, "effect": report.effect, "damage": report.damage,
            "kl_budget": report.kl_budget, "unsteered": report.unsteered,
            "recommendation": rec.model_dump(), "reason": report.reason,
            "points": [p.model_dump() for p in report.points]}


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in _read(path).splitlines() if line.strip()]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ControlApiError(0, "file_error", f"{path}: {getattr(e, 'strerror', None) or e}") \
            from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n")
    except OSError as e:
        raise ControlApiError(0, "file_error", f"{path}: {e.strerror or e}") from None
