"""Random-weight models built offline from a config, for the demo, tests, verify and benchmarks.

No hub access anywhere: the tokenizer is a byte-level BPE trained on a few sentences, the model
is a transformers class with seeded random weights (``save_pretrained``), or, for large
benchmark shapes, only ``config.json`` for vLLM's ``load_format="dummy"``.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Steering vectors nudge a language model toward a concept.",
    "Paris is the capital of France, and Tokyo is the capital of Japan.",
    "Electric cars, rockets and batteries: engineers build the future.",
    "Once upon a time, a small robot learned to sing in the rain.",
]

# Published shapes of the Qwen3 family (random weights stand in for the real ones).
QWEN3_SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, intermediate_size=3072, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=9728, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=12288, tie_word_embeddings=False),
}


def build_tokenizer(path: str | Path, vocab_size: int = 384):
    """A small byte-level BPE tokenizer saved as ``tokenizer.json`` + config, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return fast


def build_tiny(path: str | Path, *, arch: str = "qwen3", hidden: int = 128, layers: int = 4,
               heads: int = 4, kv_heads: int = 2, intermediate: int = 256, seed: int = 0,
               dtype: str = "float32", max_positions: int = 2048) -> Path:
    """A tiny random model + tokenizer that vLLM and transformers both load, in seconds on CPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(path)
    config = AutoConfig.for_model(
        arch, vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
        head_dim=hidden // heads, max_position_embeddings=max_positions, tie_word_embeddings=False,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype))
    with torch.no_grad():  # larger than default init, so steering visibly changes greedy tokens
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(str(path))
    return path


def write_config(path: str | Path, shape: str, dtype: str = "bfloat16", **overrides) -> Path:
    """Only ``config.json`` of a Qwen3 shape, for ``LLM(..., load_format="dummy")`` on a GPU box."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "torch_dtype": dtype,
        "bos_token_id": 151643, "eos_token_id": 151645, "attention_bias": False,
        **QWEN3_SHAPES[shape], **overrides,
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def steered_layers(n_layers: int) -> tuple[int, int]:
    """The two layers the benchmarks' steered requests use (and ``hotwire_2`` engines arm)."""
    return n_layers // 3, (2 * n_layers) // 3


def benchmark_model(work: str | Path, shape: str, smoke: bool) -> tuple[Path, str]:
    """(model dir, shape name) for a benchmark: the tiny CPU model under ``--smoke``, else the
    ``config.json`` of a Qwen3 shape (random weights via ``load_format="dummy"``)."""
    work = Path(work)
    if smoke:
        return build_tiny(work / "tiny-qwen3", hidden=128, layers=4), "tiny"
    return write_config(work / shape, shape), shape
