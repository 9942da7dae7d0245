"""Admission: a request's spec resolved to bank slots, the same way on the engine core and on
every rank.

Inputs are the spec, the slot bindings (the registry, changed only by :class:`.delta.SyncDelta`)
and which request rows are in use; every process sees the same inputs in the same order (one
scheduler output after another), so every process takes the same decision. That is what lets
the engine core count references for the mailbox's retirement acks (invariant 6) while the
ranks route tokens, and what makes all ranks of a TP/PP engine steer the same requests
(invariant 9). The armed layers are the engine's, over all pipeline stages; a rank writes the
entries of its own layers (:class:`.routing.Router`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from hotwire.shared.spec import (NO_END, PROJECTION_MODES, Gate, Spec, SpecError, SteerEntry, parse_spec,
                                 spec_from_extra_args)

from .counters import Counters
from .interventions import coefficient_words, probe_words
from .registry import Registry
from .stream_bound import Change, StreamBudget, change


# Resolutions kept (Admission._resolve_seen); the oldest dropped when full. Each is about 5 objects Python's
# collector walks in every full collection of the engine core (``Term`` is a tuple subclass, which
# the collector never untracks; measured on CPU): 4,096 of them would be about 20,000, where vLLM's
# frozen start-up heap leaves only what was made since to collect. Clients and presets repeat far
# fewer specs.
RESOLVED_KEPT = 256


def prompt_length(request: Any) -> int:
    """The prompt's length as admission counts it, from a scheduler output's new request or a
    mapping of ``Request`` arguments (the prefix-cache salt, :mod:`.salts`)."""
    if isinstance(request, dict):
        ids, embeds = request.get("prompt_token_ids"), request.get("prompt_embeds")
    else:
        ids, embeds = getattr(request, "prompt_token_ids", None), getattr(request, "prompt_embeds", None)
    return len(ids) if ids is not None else (len(embeds) if embeds is not None else 0)


def request_args(req: Any) -> tuple[str, dict[str, Any] | None, int]:
    """``(req_id, extra_args, prompt_len)`` of a scheduler output's new request: what admission
    reads, the same on the engine core and on every rank. ``prompt_len`` is 0 for a request that
    sends no spec: admission reads it only for a spec, so an unsteered arrival's prompt is not
    measured."""
    sp = req.sampling_params
    extra = sp.extra_args if sp is not None else None
    return req.req_id, extra, prompt_length(req) if spec_from_extra_args(extra) is not None else 0


class Term(NamedTuple):
    """One entry of a request on one layer: where it goes in the route table (``layer``, column
    ``k``), its bank slot, and its words 1-7 (:mod:`.interventions`)."""

    layer: int
    k: int
    slot: int
    lo: int  # token window [lo, hi)
    hi: int
    mode: int
    a: int  # float32 bits, as are the next two
    clamp_lo: int  # a probe's threshold
    clamp_hi: int
    gate: int  # 0: ungated; < 0: a prompt gate; a probe: the gate it records

    @property
    def words(self) -> tuple[int, ...]:
        """The entry's words 1-7, as the route table holds them after the bank row."""
        return self[3:]


class Resolution(NamedTuple):
    """A spec resolved against the slot bindings: what every request sending it is admitted with."""

    terms: tuple[Term, ...]
    slots: tuple[int, ...]  # distinct slots the request holds a reference on
    gates: int  # how many gates the request has


class Admitted(NamedTuple):
    """A steered request as the engine core admitted it (a tuple: made on the step thread for
    each steered arrival, at half a frozen dataclass's cost)."""

    row: int  # request row in the route table (1-based; 0 is the null row)
    terms: tuple[Term, ...]
    slots: tuple[int, ...]  # distinct slots the request holds a reference on
    gates: int  # how many gates the request has (0: none; its entries' largest gate index)


@dataclass(frozen=True)
class Refused:
    """Why a request runs unsteered: ``reason`` is the counter's code (``unsteered_<reason>``)."""

    reason: str
    detail: str


class Admission:
    """Steered requests in flight: their rows, their terms and the references they hold.

    ``counters``: where refusals are counted and logged (the engine core's); None on ranks,
    which decide the same and need not say it again.
    """

    def __init__(self, registry: Registry, *, armed: Iterable[int], entries: int, requests: int,
                 budget: StreamBudget, counters: Counters | None, projecting: Iterable[int] = ()):
        self.registry, self.entries, self.budget, self.counters = registry, entries, budget, counters
        self.armed = frozenset(armed)
        self.projecting = frozenset(projecting)  # HOTWIRE_PROJECTION_LAYERS: where h can be read
        self.active: dict[str, Admitted] = {}
        self._free = list(range(requests, 0, -1))  # request row 0 is the null row
        # (spec's form, prompt length where the spec reads it) -> (registry.binding_changes, resolved)
        self._resolved: dict[tuple[str, int], tuple[int, Resolution]] = {}

    def admit(self, req_id: str, extra_args: dict[str, Any] | None, prompt_len: int) -> Admitted | Refused | None:
        """Bind a new (or re-sent) request to a row; or why it runs unsteered (counted); None when
        it asks for no steering."""
        self.finish((req_id,))
        try:
            resolved = self._resolve_request(extra_args, prompt_len)
            if resolved is None:
                return None
            if not self._free:
                raise SpecError("table_full", f"all {len(self.active)} request rows are in use")
        except SpecError as e:
            if self.counters is not None:
                self.counters.unsteered(req_id, e.reason, e.detail)
            return Refused(e.reason, e.detail)
        admitted = Admitted(self._free.pop(), *resolved)
        self.active[req_id] = admitted
        self.registry.hold(resolved.slots)
        if self.counters is not None:
            self.counters.add("steered_requests")
        return admitted

    def prepare(self, extra_args: dict[str, Any] | None, prompt_len: int) -> None:
        """Resolve a request's spec ahead of its :meth:`admit`, kept as :meth:`_resolve_seen` keeps
        it: the engine core's input thread calls this as vLLM makes the request (:mod:`.arrival`),
        so the step that admits it finds it resolved unless a slot binding changed in between. A
        spec that does not resolve is left to :meth:`admit`, which refuses it and counts why.
        Takes the same lock as :meth:`admit` (the caller's: :meth:`.core_sync.CoreSync.prepare`)."""
        try:
            self._resolve_request(extra_args, prompt_len)
        except SpecError:
            pass

    def _resolve_request(self, extra_args: dict[str, Any] | None, prompt_len: int) -> Resolution | None:
        """A request's spec parsed and resolved (:meth:`_resolve_seen`); None when it asks for no
        steering, SpecError when it cannot be."""
        raw = spec_from_extra_args(extra_args)
        if raw is None:
            return None
        entries = parse_spec(raw)
        return self._resolve_seen(entries, prompt_len) if entries else None

    def finish(self, req_ids: Iterable[str]) -> list[str]:
        """Release finished requests; returns those that were steered."""
        gone = []
        for req_id in req_ids:
            admitted = self.active.pop(req_id, None)
            if admitted is not None:
                self.registry.release(admitted.slots)
                self._free.append(admitted.row)
                gone.append(req_id)
        return gone

    def _resolve_seen(self, spec: Spec, prompt_len: int) -> Resolution:
        """:meth:`_resolve`, kept per spec (and per prompt length for a spec whose tokens depend
        on it) until a slot binding changes: what a resolution reads besides the spec (the armed
        layers, the budget) is fixed, requests of one preset or client send the same spec, and a
        spec resolved as its request arrived (:meth:`prepare`) is found here at its step. Refusals
        are not kept."""
        key = (spec.form, prompt_len if spec.relative_to_prompt else -1)
        kept = self._resolved.get(key)
        if kept is not None and kept[0] == self.registry.binding_changes:
            return kept[1]
        resolved = self._resolve(spec, prompt_len)
        if len(self._resolved) >= RESOLVED_KEPT:  # the oldest: not one resolved ahead a moment ago
            del self._resolved[next(iter(self._resolved))]
        self._resolved[key] = (self.registry.binding_changes, resolved)
        return resolved

    def _resolve(self, entries: tuple[SteerEntry, ...], prompt_len: int) -> Resolution:
        terms: list[Term] = []
        changes: dict[int, list[Change]] = {}  # what each layer's entries can do to the stream
        gates: dict[Gate, int] = {}  # a request's distinct gates, 1-based
        used: dict[int, int] = {}  # entries so far per layer

        def add(layer: int, slot: int, words: tuple[int, ...]) -> None:
            k = used.get(layer, 0)
            if k == self.entries:
                raise SpecError("too_many_entries", f"more than {self.entries} entries on layer {layer}")
            used[layer] = k + 1
            terms.append(Term(layer, k, slot, *words))

        for e in entries:
            span = e.span(prompt_len)
            g = 0 if e.gate is None else (gates.get(e.gate)
                                          or self._gate(e.gate, len(gates) + 1, add, gates, prompt_len))
            if e.gate is not None and e.gate.scope == "prompt":  # from the deciding token on
                span = (max(span[0], prompt_len - 1), span[1])
            projecting = e.mode in PROJECTION_MODES
            # "all": every layer the entry can run on (a projecting mode: the projection layers)
            layers = e.targets(self.projecting if projecting else self.armed)
            if not layers and projecting:
                raise SpecError("unarmed_projection", f"{e.mode} on all layers needs the stream, and no layer is "
                                "among HOTWIRE_PROJECTION_LAYERS")
            if not layers:
                raise SpecError("unarmed_layer", "the entry is on all layers, and no layer is armed")
            for layer in layers:
                if e.gate is not None and e.gate.layer > layer:
                    raise SpecError("bad_params", f"gate on layer {e.gate.layer} is after the entry's layer {layer}")
                slot = self._bound_slot(e.id, layer, e.mode if projecting else None)
                norm = float(self.registry.norm[slot])
                if projecting:
                    self.budget.check_length(norm, f"vector {e.id!r}")
                add(layer, slot, (*span, *coefficient_words(e, norm), g))
                changes.setdefault(layer, []).append(change(e.mode, e.scale, norm, e.lo, e.hi))
        self.budget.check(changes)
        return Resolution(tuple(terms), tuple(sorted({t.slot for t in terms})), len(gates))

    def _gate(self, gate: Gate, g: int, add, gates: dict[Gate, int], prompt_len: int) -> int:
        """Give ``gate`` index ``g`` (``-g`` for a prompt gate, in every entry it concerns) and put
        its probe entry on the probe layer: on every token, or on the prompt's last one."""
        if g > self.entries:
            raise SpecError("too_many_entries", f"more than {self.entries} distinct gates")
        slot = self._bound_slot(gate.probe, gate.layer, "a gate probe")
        norm = float(self.registry.norm[slot])
        self.budget.check_length(norm, f"gate probe {gate.probe!r}")
        mode, a, threshold, _ = probe_words(gate.threshold, norm, gate.probe)
        word, window = (g, (0, NO_END)) if gate.scope == "token" else (-g, (prompt_len - 1, prompt_len))
        add(gate.layer, slot, (*window, mode, a, threshold, 0, word))
        gates[gate] = word
        return word

    def _bound_slot(self, vector_id: str, layer: int, projecting: str | None) -> int:
        """The bank slot serving ``vector_id`` at ``layer``, or SpecError (why it cannot run there);
        ``projecting`` names what needs the stream there (None: an add)."""
        if layer not in self.armed:
            raise SpecError("unarmed_layer", f"layer {layer} is not armed (armed: {sorted(self.armed)})")
        if projecting is not None and layer not in self.projecting:
            raise SpecError("unarmed_projection", f"{projecting} needs the stream at layer {layer}, which is "
                            f"not among HOTWIRE_PROJECTION_LAYERS ({sorted(self.projecting) or 'none'})")
        slot = self.registry.resolve(vector_id, layer)
        if slot is None:
            raise SpecError("unknown_id", f"no vector {vector_id!r} for layer {layer}")
        return slot
