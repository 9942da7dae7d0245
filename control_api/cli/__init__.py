"""``hotwire``, the command line: a client of the control API over HTTP (:mod:`.client`), one
module per subcommand, dispatched by :mod:`.main`."""

from .main import main

__all__ = ["main"]
