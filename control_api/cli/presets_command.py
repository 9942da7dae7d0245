"""``hotwire presets add|list|show|rm``: named lists of spec entries, kept in the catalog."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..layer_lists import format_layers
from .client import ControlApiError, ControlClient, add_client_options, client_command
from .tables import format_table


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = actions.add_parser("add", help="store a preset (the vectors it names need not exist yet)")
    add.add_argument("name", help="preset name (the vector id syntax)")
    source = add.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path,
                        help="JSON file: a list of entries, one entry, or a preset as `presets "
                             "show --json` prints it (its description is used unless --description, "
                             "and its metadata is kept)")
    source.add_argument("--entries", type=parse_entries,
                        help='entries as JSON, e.g. \'[{"id": "calm", "layer": 12, "scale": 2}]\'')
    add.add_argument("--description", help="what the preset is for")
    add.add_argument("--replace", action="store_true", help="replace a preset of this name")
    add.set_defaults(run=_add)

    listing = actions.add_parser("list", help="list presets")
    listing.add_argument("--json", action="store_true", help="print the server's JSON")
    listing.set_defaults(run=_list)

    show = actions.add_parser("show", help="print one preset: its entries, layers as ranges")
    show.add_argument("name", help="preset name")
    show.add_argument("--json", action="store_true",
                      help="print the server's JSON (what add --file reads back)")
    show.set_defaults(run=_show)

    remove = actions.add_parser("rm", help="delete a preset")
    remove.add_argument("name", help="preset name")
    remove.set_defaults(run=_remove)

    for sub in (add, listing, show, remove):
        add_client_options(sub)


def parse_entries(text: str) -> list[dict[str, Any]]:
    """``--entries``: a JSON list of entries or one entry."""
    try:
        return as_entries(json.loads(text))[0]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def as_entries(value: Any) -> tuple[list[Any], str | None, dict[str, Any]]:
    """``(entries, description, metadata)`` of a list of entries, one entry, or a preset object;
    the entries and the metadata themselves are checked by the server."""
    if isinstance(value, list):
        return value, None, {}
    if isinstance(value, dict) and "entries" in value:
        if not isinstance(value["entries"], list):
            raise ValueError("`entries` must be a JSON list")
        return value["entries"], value.get("description"), value.get("metadata") or {}
    if isinstance(value, dict):
        return [value], None, {}
    raise ValueError("expected a JSON list of entries, an entry or a preset object")


def read_entries_file(path: Path) -> tuple[list[Any], str | None, dict[str, Any]]:
    try:
        return as_entries(json.loads(path.read_text()))
    except OSError as e:
        raise ControlApiError(0, "file_error", f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ControlApiError(0, "file_error", f"{path}: {e}") from None


@client_command
def _add(client: ControlClient, args: argparse.Namespace) -> None:
    entries, description, metadata = (args.entries, None, {}) if args.file is None else \
        read_entries_file(args.file)
    info = client.store_preset(args.name, entries, replace=args.replace,
                               description=args.description or description, metadata=metadata)
    print(f"stored preset {info['name']}: {len(info['entries'])} entr"
          f"{'y' if len(info['entries']) == 1 else 'ies'} ({vector_ids(info)})")


@client_command
def _list(client: ControlClient, args: argparse.Namespace) -> None:
    presets = client.presets()
    if args.json:
        print(json.dumps(presets, indent=2))
        return
    rows = [(p["name"], len(p["entries"]), vector_ids(p), p["description"]) for p in presets]
    print(format_table(["NAME", "ENTRIES", "VECTORS", "DESCRIPTION"], rows))


@client_command
def _show(client: ControlClient, args: argparse.Namespace) -> None:
    preset = client.preset(args.name)
    if args.json:
        print(json.dumps(preset, indent=2))
        return
    print(f"preset       {preset['name']}")
    print(f"description  {preset['description'] or '-'}")
    print(f"created      {preset['created_at']}")
    if preset.get("metadata"):
        print(f"metadata     {json.dumps(preset['metadata'], separators=(',', ':'))}")
    print()
    print(format_table(["VECTOR", "LAYERS", "SETTINGS"], [entry_row(e) for e in preset["entries"]]))


def entry_row(entry: dict[str, Any]) -> tuple[str, str, str]:
    """An entry as ``(vector id, layers, the other fields as key=JSON)``: a layer list reads
    as ranges (``1-29``), as ``--layers`` takes them."""
    layers = entry.get("layers", entry.get("layer"))
    if isinstance(layers, list) and all(type(x) is int for x in layers):
        layers = format_layers(layers)
    rest = " ".join(f"{key}={json.dumps(value)}" for key, value in entry.items()
                    if key not in ("id", "layer", "layers"))
    return str(entry.get("id")), "-" if layers is None else str(layers), rest


@client_command
def _remove(client: ControlClient, args: argparse.Namespace) -> None:
    client.remove_preset(args.name)
    print(f"removed preset {args.name}")


def vector_ids(preset: dict[str, Any]) -> str:
    """The distinct vector ids a preset names, in order."""
    return ",".join(dict.fromkeys(str(e.get("id")) for e in preset["entries"]))
