"""The control API's attachment to one engine's mailbox, re-made whenever the engine restarts.

The engine owns the file: it creates it at start and re-creates it (new inode, new ``epoch``)
when it restarts. :meth:`EngineLink.refresh` notices both and attaches to the current file.

One writer per mailbox: two control APIs choosing slots for one table would overwrite each
other's rows, so the link holds an exclusive ``flock`` on the file it attached to, and a second
control API stays detached (and unready) with a message saying so.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from hotwire.shared.mailbox import ControlMailbox, MailboxError

log = logging.getLogger("hotwire.control_api")


class SyncWatch:
    """How long the engine has left a mailbox generation unapplied.

    The engine applies at step boundaries and, once it has served, from its idle heartbeat, so
    a short lag is normal. Before its first apply of an epoch (a fresh engine that has run no
    step yet) a lag is expected and not counted: the catalog pushed at engine start waits there
    for the first request, and an unready control API must not keep that request away.
    """

    def __init__(self) -> None:
        self._waiting_for: int | None = None
        self._since = 0.0

    def observe(self, applied: int, target: int) -> None:
        if applied == 0 or applied >= target:
            self._waiting_for = None
        elif self._waiting_for is None or applied >= self._waiting_for:
            self._waiting_for, self._since = target, time.monotonic()

    def lag_s(self) -> float:
        return 0.0 if self._waiting_for is None else time.monotonic() - self._since

    @property
    def waiting_for(self) -> int | None:
        return self._waiting_for


class EngineLink:
    """``box`` is the attached mailbox, or ``None`` with ``problem`` saying why."""

    def __init__(self, path: Path):
        self.path = path
        self.box: ControlMailbox | None = None
        self.epoch: int | None = None
        self.problem: str | None = f"no mailbox at {path} yet"
        self.watch = SyncWatch()
        self._lock_fd: int | None = None

    def refresh(self) -> bool:
        """Attach or re-attach as needed; True when now attached to a mailbox not seen before."""
        if self.box is not None and not self.box.replaced() and self.box.epoch == self.epoch:
            return False
        if self.box is not None:
            log.warning("engine mailbox %s was re-created (engine restart); re-attaching", self.path)
            self.close()
        try:
            box = ControlMailbox.attach(str(self.path))
        except (MailboxError, OSError, ValueError) as e:
            self.problem = str(e) if isinstance(e, MailboxError) else f"cannot attach {self.path}: {e}"
            return False
        fd = self._lock(box)
        if fd is None:
            box.close()
            return False
        self.box, self._lock_fd, self.epoch = box, fd, box.epoch
        self.problem = None
        self.watch = SyncWatch()
        fp = box.fingerprint
        log.info("attached engine mailbox %s: model %s (%d layers, hidden %d, %s), %d slots, epoch %x",
                 self.path, fp.model, fp.n_layers, fp.hidden, fp.dtype, box.n_slots, box.epoch)
        return True

    def _lock(self, box: ControlMailbox) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            self.problem = f"cannot open {self.path}: {e}"
            return None
        if os.fstat(fd).st_ino != box.inode:
            os.close(fd)
            self.problem = f"mailbox {self.path} was re-created while attaching"
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self.problem = f"another control API holds {self.path}; one control API per engine"
            return None
        return fd

    def observe_sync(self) -> None:
        if self.box is not None:
            self.watch.observe(int(self.box.header["applied_gen"]), int(self.box.header["target_gen"]))

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self.problem = f"detached from {self.path}"
