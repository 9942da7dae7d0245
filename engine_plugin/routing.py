"""Per-request routing rows and the per-step token -> request map, on one rank.

Per request, on arrival only: the engine core's :class:`.admission.Admission` resolved the spec
to bank slots (:mod:`.step_decision`), and this rank writes one request row ``[A, K, 8]`` of its
route table for the layers it holds.
Per step: one vectorised ``np.repeat`` of request rows over the step's token counts; when that
token map changed, one upload of it into ``tok_row``, through which the op reads each token's
entries (decode steps of a steady batch reuse it: positions, not the map, move the token
windows), and, in a step that steers, the layers the steered requests in flight have entries on,
for the op to skip the rest (:class:`.steer_op.StepState`; counted as requests come and go).
Uploads go through :class:`.staging.HostRing` buffers, filled by ``memoryview`` copies and read
by the GPU itself: at most one upload a step, the rows of the requests that arrived and a changed
token map together. Nothing per step lets the GIL go but that upload's launch, neither a torch
call nor a large numpy operation (``.staging``).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Sequence
from itertools import repeat

import numpy as np
import torch

from .admission import Admitted, Term
from .gate_report import GateReport
from .interventions import PROBE, WORDS
from .staging import DeviceWords, HostRing, Span, clear, put
from .steering import ArmedModel

log = logging.getLogger("vllm.hotwire")
NO_LAYERS: tuple[int, ...] = ()  # a step that steers no token: the op skips every layer


class Router:
    """``depth``: how many steps' uploads may be in flight at once, plus one
    (:class:`.staging.HostRing`'s reuse contract)."""

    def __init__(self, armed: ArmedModel, report: GateReport | None = None, depth: int = 3):
        self.armed, self.report = armed, report
        self.tables = armed.tables
        rows, shape = self.tables.route.shape[0], self.tables.route.shape[1:]  # R+1, [A, K, 8]
        self._row_words = int(np.prod(shape))
        self._k_words = shape[1] * shape[2]  # words of one layer's entries in a request row
        device = self.tables.route.device
        # each buffer: [m, A, K, 8] rows to write, then from word _tok_at [N] each token's row
        self._tok_at = rows * self._row_words
        self._ring = HostRing(self._tok_at + self.tables.tok_row.shape[0], depth, device, spans=rows + 1)
        self._route_words, self._tok_words = DeviceWords(self.tables.route), DeviceWords(self.tables.tok_row)
        self.active: dict[str, Admitted] = {}  # the steered requests in flight, as the engine core admitted them
        self._ids: list[str] = []  # the last step's batch, to skip unchanged decode steps
        self._counts = b""  # the last step's token counts, as bytes
        self._rows: np.ndarray | None = None  # [len(_ids)] the request row of each, None: no steered request
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

    @property
    def direct(self) -> bool:
        """Do the uploads make no torch call on the step thread (the upload kernel on CUDA, numpy on
        the CPU)?"""
        return self._ring.direct

    @property
    def uploads(self) -> str:
        """How the uploads reach the device (:attr:`.staging.HostRing.how`)."""
        return self._ring.how

    @property
    def steering(self) -> bool:
        """Does the last routed step send any token to a request row (else nothing is steered)?"""
        return len(self._tok) > 0

    # -- arrival / finish -------------------------------------------------------------------
    def admit(self, req_id: str, admitted: Admitted) -> None:
        """Stage the request row of a request the engine core admitted (written by :meth:`commit`)."""
        self.finish((req_id,))
        cut = self._gates_elsewhere(admitted.terms)
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
        same = not self._dirty and req_ids == self._ids
        if same and counts == self._counts:
            return False
        buf = self._ring.next() if self._staged else None
        spans = self._stage_rows(buf) if buf is not None else []
        self._counts, self._dirty = counts, False
        if not same:
            self._ids = list(req_ids)
            rows = (np.fromiter(map(self._row_of.get, req_ids, repeat(0)), np.int32, len(req_ids))
                    if self._row_of else None)
            # None: no steered request in the batch (bytes compared, not a reduction: .staging)
            self._rows = rows if rows is not None and rows.tobytes() != bytes(rows.nbytes) else None
        rows = self._rows
        if rows is not None:
            tok = np.repeat(rows, num_tokens)
            if self._live is None:
                self._live = [pos for pos, n in enumerate(self._users) if n]
            live = self._live
        else:
            tok, live = self._tok[:0], NO_LAYERS
        if live is not self._routed:  # the same list while no layer's count crossed zero
            self.tables.step.route_layers(live)
            self._routed = live
        if tok.shape != self._tok.shape or tok.tobytes() != self._tok.tobytes():  # bytes: numpy's != may let the GIL go
            n, at = max(len(tok), len(self._tok)), self._tok_at  # the last step's tokens past this one's: null row
            buf = self._ring.next() if buf is None else buf
            put(buf, at, tok)
            clear(buf, at + len(tok), at + n)
            spans.append((at, at + n, self._tok_words, 0))
            self._tok = tok
        if spans:
            self._ring.copy(spans)
        return not same
