"""Contrast vectors: the mean residual stream of positive prompts minus that of negative ones.

The recipe (what ``hotwire vectors make`` and the demo compute), for a decoder layer ``L``:

1. each prompt is tokenized as plain text with the tokenizer's default special tokens (no chat
   template) and run alone through the transformers model in float32;
2. its stream at the end of layer ``L`` is ``hidden_states[L + 1]`` of that forward
   (transformers' numbering: ``hidden_states[0]`` is the embeddings), the tensor hotwire adds
   ``scale * v`` to; it is averaged over the prompt's tokens;
3. the vector is the mean of those per-prompt means over the positive prompts minus the same
   over the negative prompts.

The last layer is refused: transformers returns its output after the final norm. Position 0
carries a stream of huge norm at many layers (on SmolLM2-135M, 750 at layer 6 and 24000 at layer
15 against 100-250 elsewhere) that depends only on the first token: start the positive and
negative prompts with the same words so that it cancels.

Alongside, :func:`make` measures the stream's typical size at ``L``: the mean per-token L2 norm
over every prompt's tokens but the first. The suggested scale is the one at which
``scale * |v|`` is :data:`SCALE_FRACTION` of that norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

RECIPE = ("mean over prompts of hidden_states[layer+1] averaged over the prompt's tokens "
          "(plain text, default special tokens, float32), positive minus negative")
# Measured on SmolLM2-135M-Instruct (README, "Making a vector"): answers follow the direction
# and stay fluent while scale * |v| is up to about a third of the stream's typical norm.
SCALE_FRACTION = 0.3


@dataclass
class Contrast:
    """A contrast vector and what was measured while making it."""

    vector: np.ndarray  # float32 (hidden,)
    layer: int
    stream_norm: float  # mean per-token L2 norm of the stream at ``layer``, position 0 left out
    suggested_scale: float
    model: str
    n_positive: int
    n_negative: int
    metadata: dict[str, str] = field(default_factory=dict)


def load(model_path: str, device: str | None = None):
    """(model, tokenizer) in float32 on ``device`` (default: CUDA when available, else CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    return model, tokenizer


def prompt_means(model, tokenizer, prompts: list[str], layer: int,
                 on_prompt: Callable[[int, str], None] | None = None) -> tuple[np.ndarray, list[float]]:
    """Per-prompt mean stream at the end of ``layer`` ``(n, hidden)``, and the per-token norms
    there of every prompt's tokens but the first; ``on_prompt(i, text)`` before each forward."""
    import torch

    n_layers = model.config.num_hidden_layers
    if not 0 <= layer < n_layers - 1:
        raise ValueError(f"layer {layer}: choose 0..{n_layers - 2} (the last layer's output is "
                         f"returned after the final norm)")
    device = next(model.parameters()).device
    means, norms = [], []
    with torch.no_grad():
        for i, text in enumerate(prompts):
            if on_prompt is not None:
                on_prompt(i, text)
            ids = tokenizer(text, return_tensors="pt").input_ids.to(device)
            stream = model(ids, output_hidden_states=True).hidden_states[layer + 1][0].float()
            means.append(stream.mean(dim=0).cpu().numpy())
            norms.extend(stream[1:].norm(dim=-1).tolist())
    return np.stack(means).astype(np.float32), norms


def make(model, tokenizer, positive: list[str], negative: list[str], layer: int,
         model_name: str = "", report: Callable[[str], None] | None = None) -> Contrast:
    """The contrast vector of ``positive`` vs ``negative`` at ``layer`` (the module's recipe);
    ``report`` is told of each prompt as its forward starts."""
    if not positive or not negative:
        raise ValueError("need at least one positive and one negative prompt")

    def telling(side: str, prompts: list[str]) -> Callable[[int, str], None] | None:
        if report is None:
            return None
        return lambda i, text: report(f"{side} prompt {i + 1}/{len(prompts)}: {text[:60]!r}")

    pos, pos_norms = prompt_means(model, tokenizer, positive, layer, telling("positive", positive))
    neg, neg_norms = prompt_means(model, tokenizer, negative, layer, telling("negative", negative))
    vector = (pos.mean(axis=0) - neg.mean(axis=0)).astype(np.float32)
    stream_norm = float(np.mean(pos_norms + neg_norms))
    vec_norm = float(np.linalg.norm(vector))
    scale = round(SCALE_FRACTION * stream_norm / vec_norm, 2) if vec_norm > 0 else 0.0
    metadata = {"layer": str(layer), "suggested_scale": str(scale), "model": model_name,
                "recipe": RECIPE, "stream_norm": f"{stream_norm:.4g}", "vector_norm": f"{vec_norm:.4g}",
                "n_positive": str(len(positive)), "n_negative": str(len(negative))}
    return Contrast(vector, layer, stream_norm, scale, model_name, len(positive), len(negative), metadata)


def save(contrast: Contrast, path) -> None:
    """Write the vector as safetensors (one tensor, ``vector``) with the metadata as strings."""
    from safetensors.numpy import save_file

    save_file({"vector": np.ascontiguousarray(contrast.vector)}, str(path), metadata=contrast.metadata)
