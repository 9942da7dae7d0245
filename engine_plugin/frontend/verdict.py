"""What the API server tells a caller about its request's steering: the ``x-hotwire`` header.

``applied``: every entry resolves on the engine as it stands now. ``unsteered; reason=<code>``:
the engine will run the request unsteered, for the reason it counts (``unsteered_<code>``).
``unverified; reason=no_mailbox``: the spec parses, but the engine's vectors cannot be seen from
here (mailbox off or unreadable). Requests that ask for no steering get no header. A caller who
may not read the catalog (a read token is configured and the request does not carry it) is told
the state alone (:meth:`Verdict.withheld`): the reasons and their detail say which vector ids
exist and, bisected, how large each is.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = b"x-hotwire"
APPLIED, UNSTEERED, UNVERIFIED = "applied", "unsteered", "unverified"


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str | None = None
    detail: str = ""

    @classmethod
    def applied(cls) -> Verdict:
        return cls(APPLIED)

    @classmethod
    def unsteered(cls, reason: str, detail: str) -> Verdict:
        return cls(UNSTEERED, reason, detail)

    @classmethod
    def unverified(cls, detail: str) -> Verdict:
        return cls(UNVERIFIED, "no_mailbox", detail)

    def withheld(self) -> Verdict:
        """The state alone, without the reason and its detail."""
        return Verdict(self.state)

    @property
    def header(self) -> bytes:
        return (self.state if self.reason is None else f"{self.state}; reason={self.reason}").encode()
