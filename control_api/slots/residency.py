"""Where a catalog vector stands: on one engine (data-parallel rank), and over all of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ResidencyState = Literal["resident", "queued", "not_resident", "incompatible", "no_engine"]


@dataclass(frozen=True)
class Residency:
    """Where a catalog vector stands on one engine."""

    state: ResidencyState
    reason: str | None
    slots: tuple[tuple[int, int], ...]  # (slot, slot layer)

    @property
    def resident(self) -> bool:
        return self.state == "resident"


@dataclass(frozen=True)
class RankResidency:
    rank: int
    residency: Residency


@dataclass(frozen=True)
class VectorResidency:
    """A vector on every rank, and the summary of them all: resident only when resident on
    every rank; otherwise the state of the first rank that lacks it, with each lacking rank's
    reason. With one rank, the summary is that rank's residency."""

    overall: Residency
    ranks: tuple[RankResidency, ...]

    @classmethod
    def of(cls, ranks: tuple[RankResidency, ...]) -> VectorResidency:
        lacking = [r for r in ranks if not r.residency.resident]
        if len(ranks) == 1 or not lacking:
            return cls(ranks[0].residency, ranks)
        first = lacking[0].residency
        reason = "; ".join(f"dp rank {r.rank}: {r.residency.reason or r.residency.state}"
                           for r in lacking)
        return cls(Residency(first.state, reason, ranks[0].residency.slots), ranks)
