"""``hotwire slots``: the engine's slot table; with data parallelism, each rank's in turn."""

from __future__ import annotations

import argparse
import json

from ..layer_lists import format_layers
from .client import ControlClient, add_client_options, client_command
from .tables import format_table


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the server's JSON")
    add_client_options(parser)
    parser.set_defaults(run=_slots)


@client_command
def _slots(client: ControlClient, args: argparse.Namespace) -> None:
    table = client.slots()
    if args.json:
        print(json.dumps(table, indent=2))
        return
    ranks = table.get("ranks") or [{"dp_rank": 0, **table}]
    for i, rank in enumerate(ranks):
        if len(ranks) > 1:
            print(("\n" if i else "") + f"dp rank {rank['dp_rank']}  {rank['mailbox']}")
        if rank.get("engine") is None:
            print(f"detached {rank['problem']}")
            continue
        _print_table(rank)


def _print_table(table: dict) -> None:
    e = table["engine"]
    sync = "in sync" if e["in_sync"] else "applying"
    print(f"engine   {e['model']} ({e['n_layers']} layers, hidden {e['hidden']}, {e['dtype']}), "
          f"pid {e['pid']}, epoch {e['epoch']}, heartbeat {e['heartbeat_age_s']:.1f}s ago")
    print(f"armed    {format_layers(e['armed_layers']) or 'none'}")
    print(f"mailbox  generation {e['applied_generation']}/{e['target_generation']} ({sync}), "
          f"slots {table['used']}/{table['n_slots']} used")
    print("counters " + ", ".join(f"{k}={v}" for k, v in e["counters"].items()))
    rows = [(s["slot"], s["vector_id"], "any" if s["layer"] is None else s["layer"], s["state"],
             s["generation"], s["inflight"], s["last_used"],
             ",".join(f for f in ("pinned", "startup") if s[f]) or None) for s in table["slots"]]
    print()
    print(format_table(["SLOT", "VECTOR", "LAYER", "STATE", "GEN", "INFLIGHT", "LAST USED", "FLAGS"],
                       rows))
