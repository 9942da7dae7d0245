"""Stopping a tool by signal runs its clean-up.

Python's default for SIGTERM (and SIGHUP) ends the process at once: no ``finally`` block runs,
so a temporary directory (``hotwire verify``'s, ``hotwire demo``'s) and an engine process it
started would stay behind. Inside :func:`exit_on_signals` either signal raises ``SystemExit``
with the shell's status for it (``128 + signal``) in the main thread instead, so every ``with``
and ``finally`` on the way out runs; Ctrl-C already does that (``KeyboardInterrupt``).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit(128 + signum)`` while inside; the handlers that
    were there come back at the end."""

    def leave(signum: int, _frame) -> None:
        sys.exit(128 + signum)

    before = {sig: signal.signal(sig, leave) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
