"""``hotwire vectors sweep``: a vector's effect and its damage over a grid of scales (and
layers), measured on a running engine, and the scale to use.

Every grid point is one batch: the effect's prompts in one completions request and the neutral
text in another, sent together, steered with the point's spec (:mod:`.served_model`); the
unsteered model is measured once, first, as the reference. What is measured is
:mod:`.sweep_measures`'. The recommendation (:func:`recommend`) is, for each layer and each sign
of the scale, the largest ``|scale|`` whose damage stays within the KL budget along with every
smaller one of that sign, and of those the one of the highest effect, if it raises the effect
(by more than ``min_effect``); none when no grid point moves the effect by more than
``min_effect`` (the vector does nothing there), when even the smallest scale is over budget, or
when no scale within it raises the effect. The steering covers every token (``positions: "all"``): the
effect and the damage are read off prompt tokens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from pydantic import BaseModel

from . import sweep_measures as measures
from .served_model import PromptScores, ServedModel

DEFAULT_PROMPTS = ("How was your weekend?", "How do you feel today?",
                   "Tell me about your morning.")
NEUTRAL_TEXT = (
    "The town library opens at nine in the morning and closes at six in the evening. On the "
    "ground floor there are newspapers, a few computers and a desk where visitors can ask for "
    "help. The second floor holds most of the books, arranged by subject, with tables near the "
    "windows. Children have a room of their own at the back, next to a small garden. Each month "
    "the library lends several thousand books, and in winter more people come in the afternoon, "
    "when it gets dark early. A bus stops in front of the building every twenty minutes.")


class Point(BaseModel):
    """One grid point's measurements (``layer`` None: a preset's own layers)."""

    layer: int | None
    scale: float
    effect: float
    kl: float
    perplexity: float


class Recommendation(BaseModel):
    layer: int | None
    scale: float
    effect: float
    kl: float
    perplexity: float


class SweepReport(BaseModel):
    """What a sweep measured and recommends; written as the sweep's JSON."""

    model: str
    server: str
    target: dict[str, Any]
    regime: dict[str, Any]
    effect: dict[str, Any]
    damage: dict[str, Any]
    kl_budget: float
    min_effect: float
    unsteered: dict[str, float]
    points: list[Point]
    effect_change: float
    has_effect: bool
    recommendation: Recommendation | None
    reason: str
    measured_at: str
    seconds: float


class Target(Protocol):
    def spec(self, layer: int | None, scale: float) -> list[dict[str, Any]]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class VectorTarget:
    """A catalog vector, steered with ``mode`` at the grid's layers and scales."""

    vector: str
    mode: str = "add"

    def spec(self, layer: int | None, scale: float) -> list[dict[str, Any]]:
        entry = {"id": self.vector, "layer": layer, "scale": scale}
        return [entry if self.mode == "add" else {**entry, "mode": self.mode}]

    def describe(self) -> dict[str, Any]:
        return {"vector": self.vector, "mode": self.mode}


@dataclass(frozen=True)
class PresetTarget:
    """A preset's entries, every scale multiplied by the grid's (its layers are its own)."""

    preset: str
    entries: tuple[dict[str, Any], ...]

    def spec(self, layer: int | None, scale: float) -> list[dict[str, Any]]:
        return [{**e, "scale": float(e.get("scale", 1.0)) * scale} for e in self.entries]

    def describe(self) -> dict[str, Any]:
        return {"preset": self.preset, "entries": list(self.entries),
                "scale": "a factor on every entry's scale"}


class Effect(Protocol):
    description: dict[str, Any]

    async def measure(self, model: ServedModel, spec: list[dict[str, Any]] | None) -> float: ...


@dataclass
class WordsEffect:
    """Log total probability of ``words`` (token lists) after each context (prompt + stem)."""

    contexts: list[list[int]]
    words: list[list[int]]
    description: dict[str, Any]

    async def measure(self, model: ServedModel, spec: list[dict[str, Any]] | None) -> float:
        prompts = [c + w for c in self.contexts for w in self.words]
        scores = await model.score(prompts, spec)
        n = len(self.words)
        per_context = [[measures.continuation_logprob(s, len(w)) for s, w in
                        zip(scores[i * n:(i + 1) * n], self.words)] for i in range(len(self.contexts))]
        return measures.words_effect(per_context)


@dataclass
class ABEffect:
    """The share of the matching answer's probability, ``" A"`` against ``" B"``."""

    contexts: list[list[int]]
    letters: tuple[list[int], list[int]]
    matching: list[str]
    description: dict[str, Any]

    async def measure(self, model: ServedModel, spec: list[dict[str, Any]] | None) -> float:
        a, b = self.letters
        scores = await model.score([c + x for c in self.contexts for x in (a, b)], spec)
        la = [measures.continuation_logprob(s, len(a)) for s in scores[0::2]]
        lb = [measures.continuation_logprob(s, len(b)) for s in scores[1::2]]
        return measures.ab_effect(la, lb, self.matching)


@dataclass
class ScoreEffect:
    """The mean of a scoring function over each context's greedy continuation."""

    contexts: list[list[int]]
    scorer: Callable[[str], float]
    max_tokens: int
    description: dict[str, Any]

    async def measure(self, model: ServedModel, spec: list[dict[str, Any]] | None) -> float:
        texts = await model.generate(self.contexts, spec, max_tokens=self.max_tokens)
        return measures.mean_score(self.scorer, texts, self.description["function"])


@dataclass
class Damage:
    """KL from the unsteered next-token distribution and perplexity, on ``tokens``."""

    tokens: list[int]
    top_k: int
    description: dict[str, Any]
    reference: PromptScores | None = field(default=None, repr=False)

    async def measure(self, model: ServedModel,
                      spec: list[dict[str, Any]] | None) -> tuple[float, float]:
        [scores] = await model.score([self.tokens], spec, top_k=self.top_k)
        if spec is None:
            self.reference = scores
            return 0.0, measures.perplexity(scores)
        assert self.reference is not None, "measure the unsteered text first"
        return (measures.kl_divergence(self.reference, scores, self.top_k),
                measures.perplexity(scores))


async def contexts_of(model: ServedModel, prompts: Sequence[str], stem: str,
                      chat: bool) -> list[list[int]]:
    """Each prompt (a user message through the chat template, or raw text), then the stem."""
    stem_tokens = await model.tokens(stem) if stem else []
    heads = await asyncio.gather(*(model.chat_tokens(p) if chat else model.tokens(p, special=True)
                                   for p in prompts))
    return [head + stem_tokens for head in heads]


async def words_effect(model: ServedModel, prompts: Sequence[str], stem: str,
                       words: Sequence[str], chat: bool) -> WordsEffect:
    """Each word is scored as it follows the stem, after a space."""
    tokens = await asyncio.gather(*(model.tokens(" " + w.strip()) for w in words))
    return WordsEffect(await contexts_of(model, prompts, stem, chat), list(tokens),
                       {"kind": "words", "stem": stem, "words": list(words),
                        "prompts": list(prompts), "chat_template": chat,
                        "value": "mean over prompts of log P(any word | prompt + stem)"})


async def ab_effect(model: ServedModel, questions: Sequence[tuple[str, str]], stem: str,
                    chat: bool) -> ABEffect:
    """``questions``: ``(question, matching letter)``; the letters follow the stem after a space."""
    letters = (await model.tokens(" A"), await model.tokens(" B"))
    return ABEffect(await contexts_of(model, [q for q, _ in questions], stem, chat), letters,
                    [m for _, m in questions],
                    {"kind": "ab", "stem": stem, "questions": len(questions), "chat_template": chat,
                     "value": "mean over questions of P(matching) / (P(' A') + P(' B'))"})


async def score_effect(model: ServedModel, prompts: Sequence[str], function: str,
                       max_tokens: int, chat: bool) -> ScoreEffect:
    return ScoreEffect(await contexts_of(model, prompts, "", chat),
                       measures.load_scorer(function), max_tokens,
                       {"kind": "score", "function": function, "prompts": list(prompts),
                        "max_tokens": max_tokens, "chat_template": chat, "decoding": "greedy",
                        "value": "mean of the function over the continuations"})


async def damage_on(model: ServedModel, text: str, top_k: int, source: str) -> Damage:
    tokens = await model.tokens(text, special=True)
    return Damage(tokens, top_k, {"text": source, "tokens": len(tokens), "top_k": top_k,
                                  "kl": "mean over positions of KL(unsteered || steered), the "
                                        "unsteered top-k tokens each on its own and the rest "
                                        "lumped"})


async def sweep(model: ServedModel, target: Target, layers: Sequence[int | None],
                scales: Sequence[float], effect: Effect, damage: Damage, *, kl_budget: float,
                min_effect: float, progress: Callable[[str], None]) -> SweepReport:
    """Measure the unsteered model, then every ``(layer, scale)`` point, one batch each."""
    start = time.perf_counter()
    base_effect, (_, base_ppl) = await asyncio.gather(effect.measure(model, None),
                                                      damage.measure(model, None))
    grid = [(layer, float(scale)) for layer in layers for scale in scales]
    steered = sum(1 for _, s in grid if s != 0)
    points, done, steered_start = [], 0, time.perf_counter()
    for layer, scale in grid:
        if scale == 0:
            points.append(Point(layer=layer, scale=0.0, effect=base_effect, kl=0.0,
                                perplexity=base_ppl))
            continue
        spec = target.spec(layer, scale)
        value, (kl, ppl) = await asyncio.gather(effect.measure(model, spec),
                                                damage.measure(model, spec))
        points.append(Point(layer=layer, scale=scale, effect=value, kl=kl, perplexity=ppl))
        done += 1
        left = (time.perf_counter() - steered_start) / done * (steered - done)
        progress(f"point {done}/{steered} (layer {_layer(layer)}, scale {scale:g}): effect "
                 f"{value:.4g}, KL {kl:.4g}, perplexity {ppl:.4g}; about {left:.0f} s left")
    rec, reason, change = recommend(points, base_effect, kl_budget, min_effect)
    return SweepReport(
        model=await model.model(), server=model.url, target=target.describe(),
        regime={"positions": "all", "decoding": "greedy", "layers": list(layers)},
        effect=effect.description, damage=damage.description, kl_budget=kl_budget,
        min_effect=min_effect, unsteered={"effect": base_effect, "perplexity": base_ppl},
        points=points, effect_change=change, has_effect=change > min_effect,
        recommendation=rec, reason=reason,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - start, 2))


def recommend(points: Sequence[Point], base_effect: float, kl_budget: float,
              min_effect: float) -> tuple[Recommendation | None, str, float]:
    """``(recommendation, why, effect change)``; the change is the largest ``|effect -
    unsteered|`` over the grid."""
    change = max((abs(p.effect - base_effect) for p in points), default=0.0)
    if change <= min_effect:
        return None, (f"no effect: the effect stays within {min_effect:g} of the unsteered "
                      f"{base_effect:.4g} at every grid point"), change
    candidates = []
    for layer in dict.fromkeys(p.layer for p in points):
        for sign in (1, -1):
            side = sorted((p for p in points if p.layer == layer and p.scale * sign > 0),
                          key=lambda p: abs(p.scale))
            kept = None
            for p in side:
                if not p.kl <= kl_budget:
                    break
                kept = p
            if kept is not None:
                candidates.append(kept)
    if not candidates:
        return None, (f"every scale of the grid is over the KL budget of {kl_budget:g}: try "
                      "smaller scales or a larger --kl-budget"), change
    raising = [p for p in candidates if p.effect > base_effect + min_effect]
    if not raising:
        return None, (f"no scale within the KL budget of {kl_budget:g} raises the effect above "
                      f"the unsteered {base_effect:.4g} (by more than {min_effect:g})"), change
    best = max(raising, key=lambda p: (p.effect, -abs(p.scale)))
    return Recommendation(**best.model_dump()), (
        f"the largest |scale| whose KL stays within {kl_budget:g} along with every smaller one, "
        f"of the highest effect ({best.effect:.4g}, unsteered {base_effect:.4g})"), change


def _layer(layer: int | None) -> str:
    return "of the preset" if layer is None else str(layer)

