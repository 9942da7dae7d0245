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
from importlib.metadata import PackageNotFoundError, version

from .exit_codes import EXIT_CODES

COMMANDS: dict[str, tuple[str, str]] = {
    "control-api": ("hotwire.control_api.api.serve", "run the control API server"),
    "vectors": ("hotwire.control_api.cli.vectors_command", "push, list and remove steering "
                "vectors; make one"),
    "presets": ("hotwire.control_api.cli.presets_command", "store, list and remove presets (named "
                "lists of spec entries)"),
    "slots": ("hotwire.control_api.cli.slots_command", "show the engine's slot table"),
    "demo": ("hotwire.tools.demo", "steered vs unsteered answers of a real chat model (SmolLM2), end to end"),
    "verify": ("hotwire.tools.verify", "check steering, batchmate exactness and cost on a model"),
}


def package_version() -> str:
    try:
        return version("hotwire")
    except PackageNotFoundError:
        return "unknown (not installed)"


def exit_codes_epilog() -> str:
    return "exit statuses of the client commands (vectors, presets, slots):\n" + "\n".join(
        f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items())


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotwire", description="Per-request activation steering "
                                     "for vLLM: control API and tools.", epilog=exit_codes_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hotwire {package_version()}",
                        help="print the package version and exit")
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
