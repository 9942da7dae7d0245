"""``hotwire``: the command line.

Each subcommand lives in its own module, imported only when that subcommand runs: client
commands stay light (no FastAPI), and commands that need vLLM or torch cost nothing to the rest.
To add one, add ``name: (module, help)`` to :data:`COMMANDS`; the module defines
``configure(parser)``, which adds its arguments and sets ``run`` (``args -> exit status``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "control-api": ("hotwire.control_api.serve", "run the control API server"),
    "vectors": ("hotwire.control_api.vectors_cli", "push, list and remove steering vectors"),
    "slots": ("hotwire.control_api.slots_cli", "show the engine's slot table"),
    "demo": ("hotwire.engine_plugin.demo", "steered vs unsteered completion on a tiny model, end to end"),
    "verify": ("hotwire.engine_plugin.verify", "check steering, batchmate exactness and cost on a model"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotwire", description="Per-request activation steering "
                                     "for vLLM: control API and tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        if name == chosen:
            importlib.import_module(module).configure(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
