"""``hotwire control-api``: serve the control API with uvicorn.

Flags override the environment (``HOTWIRE_*``, see :class:`Settings`; ``--help`` lists every
variable); the tokens and the catalog DSN are read from the environment only.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from .settings import Settings


NOTES = """\
Bearer tokens and the DSN come from the environment only (a flag would show in ps).
HOTWIRE_TOKEN guards writes (POST, DELETE), and reads accept it too; HOTWIRE_READ_TOKEN guards
reads (GET /steer/vectors, /steer/vectors/ID, /steer/slots, /metrics). /healthz and /readyz are
always open. The default bind is 127.0.0.1; in a container, listen on 0.0.0.0 (--host or
HOTWIRE_HOST).
"""


def _default(field: str) -> str:
    default = Settings.model_fields[field].default
    return "" if default is None or default is PydanticUndefined else f" (default {default})"


def environment_help(width: int = 100) -> str:
    """Every setting's variable with what it does, from :class:`Settings`: none can be missed."""
    lines = ["settings, from the environment (the flag above, where there is one, overrides it):"]
    column = max(map(len, Settings.ENV.values())) + 4
    for field, variable in Settings.ENV.items():
        text = f"{Settings.model_fields[field].description}{_default(field)}"
        lines += textwrap.wrap(text, width, initial_indent=f"  {variable}".ljust(column),
                               subsequent_indent=" " * column)
    return "\n".join(lines) + "\n\n" + NOTES


def configure(parser: argparse.ArgumentParser) -> None:
    env = Settings.ENV
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = environment_help()
    parser.add_argument("--host", help=f"interface to listen on (${env['host']}, default "
                        "127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, help=f"port (${env['port']}, default 8001)")
    parser.add_argument("--mailbox", type=Path, help=f"engine mailbox file (${env['mailbox']})")
    parser.add_argument("--state-dir", type=Path, help=f"catalog directory (${env['state_dir']}, "
                        "default $XDG_STATE_HOME/hotwire, /var/lib/hotwire as root, else "
                        "~/.local/state/hotwire)")
    parser.add_argument("--unknown-vectors", choices=["adopt", "retire"],
                        help="engine vectors the catalog does not know: adopt them into the "
                        f"catalog (default) or retire them (${env['unknown_vectors']})")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    parser.set_defaults(run=run)


# How long an idle connection stays open: longer than clients and load balancers keep theirs
# (httpx 5 s, common balancers 60 s), so that the client, not this server, closes an idle one.
# uvicorn's 5 s closed connections on which a request had just been sent, whenever the process
# came back from a stall of over 5 s (under uvloop its due timers run before its sockets are read).
KEEP_ALIVE_S = 75


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app

    try:
        settings = Settings.from_env(host=args.host, port=args.port, mailbox=args.mailbox,
                                     state_dir=args.state_dir, unknown_vectors=args.unknown_vectors)
    except ValidationError as e:
        print(f"hotwire control-api: bad setting: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=args.log_level, timeout_keep_alive=KEEP_ALIVE_S)
    return 0
