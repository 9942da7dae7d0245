"""``hotwire vectors push|list|rm``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hotwire.shared.spec import layer_ranges

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
                      help='JSON object stored with the vector, e.g. \'{"note": "v2"}\'')
    push.set_defaults(run=_push)

    listing = actions.add_parser("list", help="list registered vectors")
    listing.add_argument("--json", action="store_true", help="print the server's JSON")
    listing.set_defaults(run=_list)

    remove = actions.add_parser("rm", help="delete a vector (retires its slots)")
    remove.add_argument("id", help="vector id")
    remove.set_defaults(run=_remove)

    for sub in (push, listing, remove):
        add_client_options(sub)


def parse_layers(text: str) -> list[int]:
    """``"10-12,20"`` -> ``[10, 11, 12, 20]``."""
    try:
        return layer_ranges(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected layers like 10-20,24") from None


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
             "armed" if v["layers"] is None else ",".join(map(str, v["layers"])),
             "yes" if v["pinned"] else "", v["state"], len(v["slots"])) for v in vectors]
    print(format_table(["ID", "GEN", "SHAPE", "DTYPE", "LAYERS", "PINNED", "STATE", "SLOTS"], rows))


@client_command
def _remove(client: ControlClient, args: argparse.Namespace) -> None:
    client.remove(args.id)
    print(f"removed {args.id}")
