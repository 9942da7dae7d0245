"""What ``hotwire vectors sweep`` measures at a grid point, from the server's log-probabilities.

Effect (higher is what the user wants; one of):

- **words**: for each prompt, the log of the total probability of a word list right after a
  stem (each word's probability the product of its tokens'), averaged over the prompts;
- **A/B** (contrastive activation addition's recipe): for each multiple-choice question, the
  probability of the answer that matches the behaviour, ``p(match) / (p(" A") + p(" B"))``
  after the stem, averaged;
- **score**: the mean of a user function ``module:function`` (text -> number) over the greedy
  continuations of the prompts.

Damage, on a neutral text (plain prose) the whole of which is steered:

- **KL**: the mean over its positions of KL(unsteered || steered) of the next-token
  distribution, over the unsteered top ``k`` tokens, each on its own, and the rest of the
  vocabulary lumped into one outcome (the server returns the top ``k`` and the text's own
  token, not the whole distribution). A top-``k`` token the steered top ``k`` lacks is given
  the steered ``k``-th probability, the most it can have;
- **perplexity** of the text under steering: ``exp`` of minus the mean log-probability of its
  own tokens, exact.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence

import numpy as np

from .served_model import PromptScores

TINY = 1e-12  # floor of a lumped probability, so a log stays finite


class ScorerError(ValueError):
    """A ``--score`` function that cannot be loaded, or returned something but a number."""


def continuation_logprob(scores: PromptScores, n: int) -> float:
    """The log-probability of the prompt's last ``n`` tokens given what precedes them."""
    return sum(scores.own(t) for t in range(len(scores.tokens) - n, len(scores.tokens)))


def log_total(logprobs: Sequence[float]) -> float:
    """``log(sum(exp(logprobs)))``, stably."""
    return float(np.logaddexp.reduce(np.asarray(logprobs, dtype=np.float64)))


def words_effect(per_prompt: Sequence[Sequence[float]]) -> float:
    """Mean over prompts of the log total probability of the words (their log-probabilities)."""
    return float(np.mean([log_total(words) for words in per_prompt]))


def ab_effect(a: Sequence[float], b: Sequence[float], matching: Sequence[str]) -> float:
    """Mean over questions of ``p(matching letter) / (p(A) + p(B))``, from log-probabilities."""
    shares = []
    for la, lb, letter in zip(a, b, matching):
        pa = 1.0 / (1.0 + math.exp(min(lb - la, 700.0)))
        shares.append(pa if letter == "A" else 1.0 - pa)
    return float(np.mean(shares))


def kl_divergence(reference: PromptScores, steered: PromptScores, top_k: int) -> float:
    """Mean over positions of KL(reference || steered) on the lumped top-``k`` outcomes."""
    values = []
    for p_entry, q_entry in zip(reference.positions[1:], steered.positions[1:]):
        top = [(tok, lp) for tok, (lp, rank) in p_entry.items() if rank <= top_k]
        ranked = [lp for lp, rank in q_entry.values() if rank <= top_k]
        floor = min(ranked) if len(ranked) >= top_k else -math.inf
        p = np.exp([lp for _, lp in top])
        q = np.exp([q_entry[tok][0] if tok in q_entry else floor for tok, _ in top])
        p_rest, q_rest = max(1.0 - p.sum(), 0.0), max(1.0 - q.sum(), TINY)
        q = np.maximum(q, TINY)
        kl = float(np.sum(p * (np.log(np.maximum(p, TINY)) - np.log(q))))
        if p_rest > 0:
            kl += p_rest * (math.log(p_rest) - math.log(q_rest))
        values.append(max(kl, 0.0))
    return float(np.mean(values)) if values else 0.0


def perplexity(scores: PromptScores) -> float:
    """``exp(-mean log p)`` of the prompt's own tokens after the first (at most ``e^700``, so
    that it stays a finite float)."""
    own = [scores.own(t) for t in range(1, len(scores.tokens))]
    return float(math.exp(min(-float(np.mean(own)), 700.0))) if own else 1.0


def load_scorer(name: str) -> Callable[[str], float]:
    """``module:function``, imported; :class:`ScorerError` saying what is missing."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ScorerError(f"--score {name!r}: expected module:function, e.g. mypkg.scores:joy")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ScorerError(f"--score {name!r}: cannot import {module_name} ({e})") from None
    scorer = getattr(module, attr, None)
    if not callable(scorer):
        raise ScorerError(f"--score {name!r}: {module_name} has no function {attr}")
    return scorer


def mean_score(scorer: Callable[[str], float], texts: Sequence[str], name: str) -> float:
    """The mean of ``scorer`` over ``texts``; :class:`ScorerError` if it returns a non-number."""
    values = []
    for text in texts:
        value = scorer(text)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ScorerError(f"--score {name}: returned {value!r} for {text[:60]!r}; it must "
                             "return a finite number")
        values.append(float(value))
    return float(np.mean(values))
