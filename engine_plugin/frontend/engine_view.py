"""The engine's admission decision, taken in the API server before a request is sent on.

The engine core applies its mailbox's directory at the start of every step, before it admits
that step's new requests, and publishes what it admits by: the layers it armed, those where a
projecting mode can read the stream, and the entries a request may have per layer (its own
``HOTWIRE_*`` settings, which this process's environment need not share). So what the directory holds when
a request arrives (ACTIVE entries, read consistently, that the engine would not reject) is what
the request's admission will see. From a read-only copy (:class:`~hotwire.shared.mailbox.MailboxView`:
this process never writes), a private :class:`~hotwire.engine_plugin.registry.Registry` is bound
as the engine core binds its own, and the engine's own
:class:`~hotwire.engine_plugin.admission.Admission` judges the spec: the reason codes and limits
are the engine's by construction. Only ``table_full`` (request rows busy at that step) cannot be
foreseen, nor a directory change between this check and the request's first step.

With data parallelism every rank's mailbox (``<path>.dpN``) is judged: the API server does not
know which rank a request will reach, so a spec is ``applied`` only where every rank steers it.
A mirror follows its mailbox when the header says the directory changed (a new engine, a write
by the control API); only slots whose content changed are read again. The ranks' mailboxes are
listed again only when their folder changed: listing it on every steered request cost 50 µs of
the API server's CPU, which shares its cores with the engine core.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from hotwire.shared.mailbox import ACTIVE, MailboxError, MailboxView, entry_problem, rank_mailboxes
from hotwire.shared.spec import SPEC_KEY, SpecError, parse_spec

from ..admission import Admission, Refused
from ..delta import PendingDelta
from ..registry import Registry
from ..stream_bound import StreamBudget
from .verdict import Verdict

_PROBE = "hotwire-frontend"  # the request id a judgement is admitted under, then finished
SETTLED_NS = 2 * 10**9  # a folder changed this recently may change again within its mtime's granularity


class _Rank:
    """One engine's mailbox, opened read-only, and a mirror of its core's bindings.

    The mirror is fed as the core feeds its own (:class:`~..delta.PendingDelta`, applied to a
    :class:`~..registry.Registry`); it starts anew when the engine makes a new mailbox.
    """

    def __init__(self, path: str):
        self.path = path
        self._view: MailboxView | None = None
        self._key: tuple[int, ...] | None = None
        self._bound: dict[int, int] = {}  # slot -> seq of the content the mirror holds
        self._registry: Registry | None = None
        self._pending: PendingDelta | None = None
        self._settings: tuple[list[int], frozenset[int], int] | None = None  # the engine's (admission_settings)
        self._budget: StreamBudget | None = None
        self._admission: Admission | None = None

    def judge(self, text: str) -> Verdict | None:
        """None for a spec without entries; MailboxError when the mailbox cannot be read."""
        admission = self._current()
        result = admission.admit(_PROBE, {SPEC_KEY: text}, 0)
        if isinstance(result, Refused):
            return Verdict.unsteered(result.reason, result.detail)
        if result is None:
            return None
        admission.finish((_PROBE,))
        return Verdict.applied()

    def _current(self) -> Admission:
        view = self._open()
        head = view.header
        key = (int(head["epoch"]), int(head["target_gen"]), int(head["armed_count"]))
        if key != self._key:
            self._follow(view)
            self._key = key
        assert self._admission is not None
        return self._admission

    def _open(self) -> MailboxView:
        try:
            inode = os.stat(self.path).st_ino
        except OSError as e:
            raise MailboxError(f"no mailbox at {self.path}: {e}") from None
        if self._view is None or self._view.inode != inode:
            if self._view is not None:
                self._view.close()
                self._view = None
            view = MailboxView.open(self.path)
            dtype = getattr(torch, view.fingerprint.dtype, None)
            if not isinstance(dtype, torch.dtype):
                view.close()
                raise MailboxError(f"{self.path} names no torch dtype ({view.fingerprint.dtype!r})")
            self._view, self._key, self._bound, self._settings = view, None, {}, None
            self._registry = Registry(view.n_slots)
            self._pending = PendingDelta(view.hidden, dtype)
            self._budget = StreamBudget.of(dtype)
        return self._view

    def _follow(self, view: MailboxView) -> None:
        """Bring the mirror to the directory's ACTIVE entries, as the engine's next step will."""
        d = view.directory
        live, seqs = d["state"] == ACTIVE, d["seq"]
        for slot, seq in list(self._bound.items()):
            if not live[slot] or int(seqs[slot]) != seq:
                self._pending.unbind(slot)
                del self._bound[slot]
        fp = view.fingerprint
        new = [s for s in np.flatnonzero(live).tolist() if s not in self._bound]
        for slot in sorted(new, key=lambda s: (int(d["gen"][s]), s)):  # newest binds last, wins
            entry = view.read_entry(slot, with_row=True)
            if entry is None or entry.seq != int(seqs[slot]):
                continue  # being rewritten: the next generation brings it
            if entry_problem(entry, fp.n_layers, fp.dtype) is None:
                self._pending.bind(slot, entry.vector_id, entry.layer, entry.gen, entry.row)
                self._bound[slot] = entry.seq
        delta = self._pending.take()
        if delta is not None:
            delta.apply(self._registry, None)
        settings = view.admission_settings()  # the engine core's own, whatever this process's env says
        if settings != self._settings:
            self._settings = armed, projecting, entries = settings
            self._admission = Admission(self._registry, armed=armed, entries=entries, requests=1,
                                        budget=self._budget, counters=None, projecting=projecting)


class EngineView:
    """Judges specs against every engine rank behind this API server."""

    def __init__(self, mailbox: str | None):
        self.mailbox = mailbox
        self._ranks: dict[str, _Rank] = {}
        self._listed: tuple[tuple[int, int] | None, list[str]] = (None, [])  # (folder's stamp, paths)

    def judge(self, text: str) -> Verdict | None:
        """The verdict on a spec text (the JSON string the engine receives); None when it has
        no entries (the engine runs it as a request that asked for nothing)."""
        try:
            if not parse_spec(text):
                return None
        except SpecError as e:
            return Verdict.unsteered(e.reason, e.detail)
        if self.mailbox is None:
            return Verdict.unverified("HOTWIRE_MAILBOX is off: the engine's vectors are not visible")
        try:
            for path in self._paths():
                verdict = self._rank(path).judge(text)
                if verdict is not None and verdict.reason is not None:
                    return verdict
        except MailboxError as e:
            return Verdict.unverified(str(e))
        return Verdict.applied()

    def _paths(self) -> list[str]:
        """Rank 0's mailbox, then each ``<mailbox>.dpN`` that exists.

        Kept while the folder's ``(inode, mtime)`` stays and that mtime is older than
        :data:`SETTLED_NS` (a file system may stamp two changes within its tick alike); the
        folder is stat-ed before it is listed, so a rank added during a listing moves the stamp."""
        stamp = _stamp(os.path.dirname(self.mailbox) or ".")
        kept, paths = self._listed
        if stamp is None or stamp != kept or time.time_ns() - stamp[1] < SETTLED_NS:
            paths = [str(path) for path in rank_mailboxes(self.mailbox).values()]
            self._listed = (stamp, paths)
        return paths

    def _rank(self, path: str) -> _Rank:
        rank = self._ranks.get(path)
        if rank is None:
            rank = self._ranks[path] = _Rank(path)
        return rank


def _stamp(folder: str) -> tuple[int, int] | None:
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
