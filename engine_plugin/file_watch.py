"""Sleep until a file is written, or a timeout: the engine core's mailbox thread waits this way
instead of waking every period to look.

Why: every wake-up of a thread in the engine core takes the GIL from vLLM's step thread, which
then waits to get it back. Polling the mailbox every 20 ms made 50 such hand-offs a second on an
idle mailbox; the control API writes it a few times a minute. On Linux the wait is inotify's
(``IN_MODIFY`` on the file: any process's write, the engine's own included, so the waiter drains
its own events before it sleeps); elsewhere, or where inotify cannot be had, :meth:`FileWatch.open`
returns None and the caller polls.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import sys

log = logging.getLogger("vllm.hotwire")

IN_MODIFY = 0x2
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)


class FileWatch:
    """An inotify descriptor watching one file for writes."""

    def __init__(self, fd: int):
        self._fd = fd

    @classmethod
    def open(cls, path: str) -> "FileWatch | None":
        """A watch on ``path``, or None where inotify is not available (then poll)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            if libc.inotify_add_watch(fd, os.fsencode(path), IN_MODIFY) < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, os.strerror(err))
        except (OSError, AttributeError) as e:
            log.info("hotwire: cannot watch %s for writes (%s); the mailbox thread polls it", path, e)
            return None
        return cls(fd)

    def wait(self, timeout: float) -> bool:
        """Sleep (the GIL released) until the file is written or ``timeout`` seconds pass; True
        when it was written. The events are left to :meth:`drain`."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        return bool(ready)

    def drain(self) -> bool:
        """Forget the writes seen so far; True when there were any."""
        seen = False
        while True:
            try:
                if not os.read(self._fd, 4096):
                    return seen
            except BlockingIOError:
                return seen
            seen = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
