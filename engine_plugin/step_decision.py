"""What the engine core decides for one step, carried to every rank with the step.

The engine core admits each new request once (:class:`.admission.Admission`: its spec resolved
against the slot bindings as the step starts) and sends what it admitted with the step's
``SchedulerOutput`` (attribute ``hotwire``), beside the slot-binding change
(:class:`.delta.SyncDelta`): every rank writes the same request rows at the same step
(invariant 9) without parsing a spec or holding a registry of its own, and a one-GPU engine,
whose rank shares the core's process, admits each request once instead of twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from .admission import Admitted
from .delta import SyncDelta


@dataclass(frozen=True)
class StepDecision:
    delta: SyncDelta | None  # the slot bindings' change at the start of the step, None: none
    admitted: tuple[tuple[str, Admitted], ...]  # (request id, what it was admitted with), in order


# a step in which no request came or went and no slot binding changed: nothing to decide, one
# object for all of them (the engine core's fast path, :meth:`.core_sync.CoreSync.on_schedule`)
NOTHING = StepDecision(None, ())
