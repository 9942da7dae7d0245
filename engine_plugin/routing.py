"""Per-request routing rows and the per-step token -> request map, on one rank.

Per request, on arrival only: the engine core's :class:`.admission.Admission` resolved the spec
to bank slots (:mod:`.step_decision`), and this rank writes one request row ``[A, K, 8]`` of its
route table for the layers it holds.
Per step, when the batch changed, the token map ``tok_row``, through which the op reads each
token's entries (decode steps of a steady batch reuse it: positions, not the map, move the token
windows): with the V2 runner, expanded on the device by the upload kernel from the runner's own
map of the batch and hotwire's row per state row (:mod:`.state_rows`: no request looked up on the
host); else one vectorised ``np.repeat`` of the batch's request rows over its token counts,
uploaded when it changed. And, in a step that steers, the layers the steered requests in flight
have entries on, for the op to skip the rest (:class:`.steer_op.StepState`; counted as requests
come and go).
Uploads go through :class:`.staging.HostRing` buffers, filled by ``memoryview`` copies and read
by the GPU itself: at most one upload a step, the rows of the requests that arrived and a changed
token map (or its expansion) together. Nothing per step lets the GIL go but that upload's launch, neither a torch
call nor a large numpy operation (``.staging``).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat

import numpy as np
import torch

from .admission import Admitted, Term
from .gate_report import GateReport
from .interventions import PROBE, WORDS
from .staging import DeviceWords, Expansion, HostRing, Span, clear, put
from .state_rows import StateBatch, StateRows
from .steering import ArmedModel

log = logging.getLogger("vllm.hotwire")
NO_LAYERS: tuple[int, ...] = ()  # a step that steers no token: the op skips every layer


class Router:
    """``depth``: how many steps' uploads may be in flight at once, plus one
    (:class:`.staging.HostRing`'s reuse contract); ``states``: the V2 runner's request state rows
    (:meth:`route_states`), None for a runner routed by request id (:meth:`route`)."""

    def __init__(self, armed: ArmedModel, report: GateReport | None = None, depth: int = 3,
                 states: int | None = None):
        self.armed, self.report = armed, report
        self.tables = armed.tables
        rows, shape = self.tables.route.shape[0], self.tables.route.shape[1:]  # R+1, [A, K, 8]
        self._row_words = int(np.prod(shape))
        self._k_words = shape[1] * shape[2]  # words of one layer's entries in a request row
        device = self.tables.route.device
        # each buffer: [m, A, K, 8] rows to write, then from word _tok_at [N] each token's row, then
        # from word _states_at [S] the request row of each state row (.state_rows)
        self._tok_at = rows * self._row_words
        self._states_at = self._tok_at + self.tables.tok_row.shape[0]
        self.states = StateRows(states) if states else None
        self._ring = HostRing(self._states_at + (states or 0), depth, device, spans=rows + 1)
        self._route_words, self._tok_words = DeviceWords(self.tables.route), DeviceWords(self.tables.tok_row)
        self.active: dict[str, Admitted] = {}  # the steered requests in flight, as the engine core admitted them
        self._batch: list[str] | bytes = []  # the last step's batch (ids, or state rows), to skip unchanged steps
        self._counts = b""  # the last step's token counts, as bytes
        self._rows: np.ndarray | None = None  # [len(_batch)] the request row of each, None: no steered request
        self._dirty = False  # a request arrived or left since the last route()
        self._row_of: dict[str, int] = {}  # request row of each steered request, looked up per step
        # request row -> its entries [(word in the row, its 8 words)], admitted since the last commit
        # (a row reused before the commit holds its latest request's)
        self._staged: dict[int, list[tuple[int, array]]] = {}
        self._tok = np.zeros(0, dtype=np.int32)  # tok_row content on the device, up to its length
        self._layers_of: dict[str, tuple[int, ...]] = {}  # the armed layers (table positions) of each
        self._users = [0] * shape[0]  # steered requests in flight with an entry on each armed layer
        self._live: list[int] | None = []  # the layers with users (None: a count crossed zero, gather again)
        self._routed: Sequence[int] | None = None  # what the last step told the op (route_layers)
        self._steers = False  # does the last routed step send a token to a request row
        self._high = 0  # tokens the last expansion on the device wrote (route_states)

    @property
    def direct(self) -> bool:
        """Do the uploads make no torch call on the step thread (the upload kernel on CUDA, numpy on
        the CPU)?"""
        return self._ring.direct

    @property
    def expands(self) -> bool:
        """Does the upload kernel expand the token map on the device (:meth:`route_states`)?"""
        return self._ring.expands

    @property
    def uploads(self) -> str:
        """How the uploads reach the device (:attr:`.staging.HostRing.how`)."""
        return self._ring.how

    @property
    def steering(self) -> bool:
        """May the last routed step send a token to a request row (else nothing is steered)? Where
        the device expands the token map: is a steered request in flight."""
        return self._steers

    # -- arrival / finish -------------------------------------------------------------------
    def admit(self, req_id: str, admitted: Admitted) -> None:
        """Stage the request row of a request the engine core admitted (written by :meth:`commit`)."""
        if req_id in self.active:
            self.finish((req_id,))
        cut = self._gates_elsewhere(admitted.terms) if admitted.gates else ()
        entries, layers = [], set()  # another stage's layer: that rank writes it
        k_words = self._k_words
        for t in admitted.terms:
            pos = self.armed.position(t.layer)
            if pos is not None and t.gate not in cut:
                # the entry's words and where they go in its request row, [A, K, 8] flat
                entries.append((pos * k_words + t.k * WORDS, array("i", (t.slot + 1, *t.words))))
                layers.add(pos)
        self.active[req_id] = admitted
        self._row_of[req_id] = admitted.row
        layers = self._layers_of[req_id] = tuple(layers)
        for pos in layers:
            if not self._users[pos]:
                self._live = None
            self._users[pos] += 1
        self._staged[admitted.row] = entries
        self._dirty = True

    def _gates_elsewhere(self, terms: tuple[Term, ...]) -> set[int]:
        """Gates whose probe layer another pipeline stage holds: their entries here stay off (a
        stage cannot read another's stream), said once per request."""
        probes = {t.gate: t.layer for t in terms if t.mode == PROBE}  # gate word -> probe layer
        cut = {g for g, layer in probes.items() if self.armed.position(layer) is None}
        if cut and any(t.gate in cut and self.armed.position(t.layer) is not None for t in terms):
            log.warning("hotwire: gates %s probe layers on another pipeline stage; the entries they gate on "
                        "this stage stay off", sorted(cut))
        return cut

    def finish(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            admitted = self.active.pop(req_id, None)
            if admitted is None:
                continue
            del self._row_of[req_id]
            for pos in self._layers_of.pop(req_id):
                self._users[pos] -= 1
                if not self._users[pos]:
                    self._live = None
            self._dirty = True
            if admitted.gates:
                self._gated_row_done(req_id, admitted)

    @torch.inference_mode()
    def _gated_row_done(self, req_id: str, admitted: Admitted) -> None:
        """A gated request's row, cleared for its next request: its prompt gates' decisions (no
        other request writes them), and its counts once read back."""
        self.tables.gate_decided[admitted.row].zero_()
        if self.report is not None:
            self.report.finish(req_id, admitted.row, admitted.gates)

    def commit(self) -> None:
        """Write the rows of requests admitted since the last commit now (:meth:`route` writes
        them with the step's token map)."""
        if self._staged:
            self._ring.copy(self._stage_rows(self._ring.next()))

    def _stage_rows(self, buf: np.ndarray) -> list[Span]:
        """The staged rows' contents into ``buf`` and the spans that write them into their rows
        of the routing table; the stage starts anew."""
        m, w = len(self._staged), self._row_words
        clear(buf, 0, m * w)
        for i, entries in enumerate(self._staged.values()):
            for at, words in entries:  # memoryview copies: no numpy call per entry
                put(buf, i * w + at, words)
        spans = [(i * w, (i + 1) * w, self._route_words, row * w) for i, row in enumerate(self._staged)]
        self._staged.clear()
        return spans

    # -- per step -----------------------------------------------------------------------------
    def route(self, req_ids: Sequence[str], num_tokens: np.ndarray) -> bool:
        """Point each token of this step at its request's row (0 for unsteered requests); True
        where the batch's requests (or their order) changed since the last step, or requests
        were admitted or finished since.

        Must run after vLLM has settled the batch for the step (order, adds, removals).
        A decode step of an unchanged batch costs two comparisons and nothing else; one whose
        requests only changed their token counts (the step after a prefill) keeps their rows.
        """
        counts = np.asarray(num_tokens).tobytes()
        same = not self._dirty and req_ids == self._batch
        if same and counts == self._counts:
            return False
        if not same:
            self._batch = list(req_ids)
            self._keep_rows(np.fromiter(map(self._row_of.get, req_ids, repeat(0)), np.int32, len(req_ids))
                            if self._row_of else None)
        self._counts, self._dirty = counts, False
        self._route_tokens(num_tokens)
        return not same

    def by_request_id(self) -> None:
        """Route by request id (:meth:`route`) from the next step on, though built for state rows.
        The map the device expanded last is taken as unknown, so the next step rewrites it whole
        and nulls its tail."""
        self.states = None
        self._dirty = True
        if self._high:
            self._tok, self._high = np.full(self._high, -1, np.int32), 0

    def route_states(self, batch: StateBatch, state_of: Mapping[str, int]) -> bool:
        """:meth:`route` for the V2 runner, by its request state rows (:mod:`.state_rows`;
        ``state_of``: the runner's ``req_id_to_index``). No request is looked up: where the ring
        expands on the device, a changed step hands the upload kernel hotwire's rows by state and
        the runner's own map of the batch; elsewhere the map is expanded here from
        ``rows[states]``."""
        placed = self.states.place(state_of, self._row_of)
        key, counts = batch.states.tobytes(), batch.num_tokens.tobytes()
        same = not self._dirty and not placed and key == self._batch
        if same and counts == self._counts:
            return False
        self._batch, self._counts, self._dirty = key, counts, False
        if not self.expands:
            if not same:
                self._keep_rows(self.states.rows[batch.states] if self._row_of else None)
            self._route_tokens(batch.num_tokens)
            return not same
        buf = self._ring.next()
        spans = self._stage_rows(buf) if self._staged else []
        steers = bool(self._row_of)  # a steered request in flight: the device finds whose tokens
        expansion = None
        if steers:
            put(buf, self._states_at, self.states.rows)
            expansion = Expansion(batch.states_at, batch.starts_at, self._states_at, self._tok_words,
                                  len(batch.states), batch.tokens, max(batch.tokens, self._high))
            self._high = batch.tokens
        elif self._high:  # the last expansion's tokens, nulled
            expansion = Expansion(0, 0, 0, self._tok_words, 0, 0, self._high)
            self._high = 0
        self._steers = steers
        self._tell_layers()
        if spans or expansion is not None:
            self._ring.copy(spans, expansion)
        return not same

    def _keep_rows(self, rows: np.ndarray | None) -> None:
        """The batch's request rows as ``_rows``: None where no steered request is in it (bytes
        compared, not a reduction: .staging)."""
        self._rows = rows if rows is not None and rows.tobytes() != bytes(rows.nbytes) else None

    def _route_tokens(self, num_tokens: np.ndarray) -> None:
        """The token map of a changed step from ``_rows`` (None: no steered request in the
        batch), expanded here, and the step's uploads."""
        buf = self._ring.next() if self._staged else None
        spans = self._stage_rows(buf) if buf is not None else []
        rows = self._rows
        tok = np.repeat(rows, num_tokens) if rows is not None else self._tok[:0]
        self._steers = rows is not None
        self._tell_layers()
        if tok.shape != self._tok.shape or tok.tobytes() != self._tok.tobytes():  # bytes: numpy's != may let the GIL go
            n, at = max(len(tok), len(self._tok)), self._tok_at  # the last step's tokens past this one's: null row
            buf = self._ring.next() if buf is None else buf
            put(buf, at, tok)
            clear(buf, at + len(tok), at + n)
            spans.append((at, at + n, self._tok_words, 0))
            self._tok = tok
        if spans:
            self._ring.copy(spans)

    def _tell_layers(self) -> None:
        """The op's layers for the step: those the steered requests in flight have entries on, none
        in a step that steers no token; the op is told only when they change."""
        if self._steers:
            if self._live is None:
                self._live = [pos for pos, n in enumerate(self._users) if n]
            live = self._live
        else:
            live = NO_LAYERS
        if live is not self._routed:  # the same list while no layer's count crossed zero
            self.tables.step.route_layers(live)
            self._routed = live
