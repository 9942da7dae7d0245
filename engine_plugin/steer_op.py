"""``hotwire::steer_``, the steering add, as one opaque in-place custom op: Triton on CUDA, torch
elsewhere.

Why opaque. Traced as plain tensor code, the add was fused by inductor into the next layer's
RMSNorm kernel, and on the GPU the heavier kernel made inductor pick another reduction
strategy (looped instead of persistent): the norm's summation order changed, and with it the
rounding of unsteered tokens. As a custom op the add is a kernel of its own, one launch per
armed layer, and the kernels around it are generated exactly as without the plugin, provided
its input is a tensor the plugin-free graph stores too (hence the layer's output, not the
residual: :func:`.steering._steered_class`). ``benchmarks/kernel_diff.py`` compares the generated
kernels.

Why in place. The op changes only the rows of steered tokens, so it writes only those: an
unsteered token costs its routing words and nothing else (no copy of the layer's output), and the
op can launch nothing at all while no request is steered (:mod:`.idle_graphs`: such steps replay
graphs captured without it). Inductor re-inplaces the functionalized op onto the layer's output
buffer, which nothing else reads, so no copy appears in the compiled graph.

Contract, for ``x [T, H]`` (the layer's output: one addend of the residual stream; changed in
place), ``residual [T, H]`` (the other addend, read only; None where the layer returns the stream
itself), ``positions [T]`` and ``anchor`` (a tensor of the armed layer's own, bound to its
:class:`ArmedLayer`: the layer's entries per request row ``route [R+1, K, 8]`` int32, any row
stride, an entry's words contiguous, laid out as in :mod:`.interventions`, row 0 null; each
token's request row ``tok_row [N>=T]`` int32; the ``bank``)::

    e    = route[tok_row[t], k]                                      (the token's entry k)
    h    = x[t] + residual[t]                                        (float32)
    x[t] = x[t] + sum_k  where(e.lo <= positions[t] < e.hi,  c_k(h) * bank[e.row],  -0.0)

with ``c_k`` the entry's mode coefficient (:func:`.interventions.coefficient`: ``a`` for an add,
from ``h·bank[row]`` and ``‖h‖`` otherwise); a gated entry counts as off unless its gate is open
(recorded by a probe entry, on this layer or an earlier one: :class:`GateScratch`), in float32
(each term clamped to float32's finite range, so no sum is ever NaN), saturated to the finite
range of ``x.dtype`` and rounded once to it. A token with no entry on is not written: it keeps
every bit (invariant 1), and the kernel reads neither its residual nor a bank row. A steered
token never becomes non-finite (invariant 8): admission bounds what the whole spec can do to the
stream (:mod:`.stream_bound`), and the saturation is the backstop. While
:func:`.idle_graphs.skipping` the op does nothing.

Why registered with ``torch.library.Library`` rather than ``torch.library.custom_op``. A step run
without a CUDA graph (more tokens than the largest capture size, or eager) calls the op from
Python once per armed layer; ``custom_op``'s Python wrapper cost about ten times the dispatch
itself (measured: 33 against 3.6 µs a call on a 2-core CPU box). In inference mode a plain call
goes past the dispatcher too, which let the GIL go on the way to the kernel
(:func:`_call_past_the_dispatcher`: 1.3 µs an idle call on that box, 4.4 through the dispatcher).
And in such a step the op returns at once, before any launch, for the layers no request of the
step has an entry on (:class:`StepState` ``live``): a step steering 2 layers of 28 launches 2
kernels.

Why the tables are found through an anchor, not passed. The op's inputs are inputs of the
compiled forward too, and each is one more slot in the Python frames that run the forward
(Dynamo's, the split graph's) and stay on the stack under every launch in it. CPython (3.11+)
keeps frames in 16 KiB chunks, and a call that crosses a chunk's end allocates the next chunk and
frees it on return, every time. The 28 route views (one per armed layer) moved that end under vLLM's
attention launch: three nested Python calls there took 4.5 µs instead of 0.07, and the step 20 %
longer on an H100 (``docs/performance.md``, "Session 28"). So the op takes no input the plugin-free
forward does not: its ``anchor`` is one of the layer's own parameters, which the forward takes
anyway, and the layer's tables are found by the anchor's address (:func:`bind`,
:func:`.steering.anchor_path`), as vLLM's attention finds its KV cache by the layer's name.
A layer index would not do: a constant of the traced graph
makes every armed layer's piece of it unique (inductor compiled each one: start-up +75 % at 28
layers). The op reads a token's entries through ``tok_row``, one dependent load per token, rather
than from a per-token copy of the rows: a step whose batch changed then uploads only the token
map, no gather (:mod:`.routing`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import NamedTuple

import torch

from . import graph_switch, idle_graphs
from .interventions import (ADD, CLAMP_HI, CLAMP_LO, COEF, GATE, MODE, POS_HI, POS_LO, PROBE, ROW, THRESHOLD,
                            coefficient)


class GateScratch(NamedTuple):
    """Where gates are recorded: ``gates [N, G]`` int32 (per token of the step: did gate g open),
    ``counts [R+1, G]`` int32 (tokens each gate opened, per request row: the token's ``tok_row``)
    and ``decided [R+1, G]`` int32 (a prompt gate's decision, per request row, held for the rest
    of the request). The op reaches them through its anchor
    (:class:`ArmedLayer`), the way vLLM's attention reaches its KV cache through the forward
    context: a probe's write at layer P precedes every read at a layer after it because those
    layers' inputs depend on P's output."""

    gates: torch.Tensor
    counts: torch.Tensor
    decided: torch.Tensor


class StepState:
    """What one engine's op calls need beyond their tensors, for the forward about to run: its gate
    scratch, and which armed layers may steer at this step (``live``: their positions in the
    tables; the layers the steered requests in flight have entries on, none in a step that steers
    no token, every layer until the first step is routed, so capture and warm-up passes launch the
    op everywhere). The router sets ``live`` before each forward."""

    def __init__(self, scratch: GateScratch | None, layers: int):
        self.scratch = scratch
        self.live = frozenset(range(layers))

    def route_layers(self, positions: Iterable[int]) -> None:
        """The layers (positions in the tables) that may steer at the coming step. ``live`` stays the
        same object while the set does not change (captured graphs check it by identity:
        :mod:`.graph_switch`)."""
        live = frozenset(positions)
        if live != self.live:
            self.live = live


class ArmedLayer:
    """What one armed layer's op calls read: the engine's ``bank`` and ``tok_row``, the layer's own
    entries ``route`` (its slice of the routing table), its position ``pos`` in the tables and the
    engine's :class:`StepState` (None: steer on every call, without gates). The op finds it through
    its anchor (:func:`bind`)."""

    __slots__ = ("bank", "route", "tok_row", "step", "pos", "__weakref__")

    def __init__(self, bank: torch.Tensor, route: torch.Tensor, tok_row: torch.Tensor,
                 step: StepState | None = None, pos: int = 0):
        self.bank, self.route, self.tok_row, self.step, self.pos = bank, route, tok_row, step, pos

    @property
    def scratch(self) -> GateScratch | None:
        return None if self.step is None else self.step.scratch


_LAYERS: "weakref.WeakValueDictionary[int, ArmedLayer]" = weakref.WeakValueDictionary()


def bind(anchor: torch.Tensor, layer: ArmedLayer) -> None:
    """Make ``layer`` what the op calls given ``anchor`` read, for as long as ``layer`` lives (its
    holder keeps it). ``anchor`` is a tensor of the armed layer's own that the compiled forward
    takes anyway (:func:`.steering.anchor_path`); it is found by its address."""
    _LAYERS[anchor.data_ptr()] = layer


def _steering(anchor: torch.Tensor) -> ArmedLayer | None:
    """The layer this call steers; None when it steers nothing (an idle step, or a layer no
    request of the step has an entry on)."""
    if idle_graphs.skipping():
        return None
    layer = _LAYERS.get(anchor.data_ptr())
    if layer is None:
        raise RuntimeError("hotwire::steer_ was given an anchor no armed layer is bound to "
                           "(steer_op.bind): was this layer armed in this process, and does its forward "
                           "run on the parameter arming saw rather than a copy of it?")
    step = layer.step
    # while a kept graph captures, every layer: the graph holds each one's kernel, switched per step
    # (a capture records, it runs nothing, so no token is steered by it)
    return layer if step is None or layer.pos in step.live or graph_switch.recording else None


def reference(x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, bank: torch.Tensor,
              route: torch.Tensor, tok_row: torch.Tensor, scratch: GateScratch | None = None) -> None:
    """The contract in torch, in place on ``x``: the CPU kernel, and what the Triton kernel is
    tested against. Without ``scratch`` no gate opens and probes record nothing."""
    # x, residual: [T, H]; positions: [T]; bank: [S+1, H]; route: [R+1, K, 8] int32; tok_row: [N>=T] int32
    n = x.shape[0]
    req = tok_row[:n].long()                                     # [T] each token's request row
    rt = route[req]                                              # [T, K, 8]
    f = rt.view(torch.float32)                                   # the same words as float32
    pos = positions[:n, None]                                    # [T, 1]
    on = (pos >= rt[..., POS_LO]) & (pos < rt[..., POS_HI])      # [T, K] inside the entry's window
    if not on.any():  # nothing to do on this step: the common case, kept cheap on the CPU
        return
    keep = on.any(0)                                             # [K] entry columns on for some token
    if not bool(keep.all()):  # the rest would add -0.0 to every sum: left out, each sum unchanged
        rt, f, on = rt[:, keep], f[:, keep], on[:, keep]         # [T, K'] from here on
    mode, gate = rt[..., MODE], rt[..., GATE]                    # [T, K] gate < 0: a prompt gate
    acc = x.to(torch.float32, copy=True)                         # [T, H]
    project = bool((on & (mode != ADD)).any())                   # any entry needs h·v or ‖h‖
    h = acc if residual is None or not project else acc + residual.float()  # [T, H] the stream
    hnorm = h.square().sum(-1).sqrt() if project else None       # [T]
    rows = [bank[rt[:, k, ROW]].float() for k in range(rt.shape[1])]  # K x [T, H]; K is small, static
    dots = torch.stack([(h * v).sum(-1) for v in rows], 1) if project else None  # [T, K]
    probing = on & (mode == PROBE)
    opened = torch.zeros_like(on)                                # [T, K] the gate an entry names is open
    if scratch is not None and bool(probing.any()):
        t, k = probing.nonzero(as_tuple=True)
        g, r = gate[t, k].abs() - 1, req[t]
        passed = (f[t, k, COEF] * dots[t, k] > f[t, k, THRESHOLD]).int()
        scratch.gates.index_put_((t, g), passed)
        scratch.counts.index_put_((r, g), passed, accumulate=True)
        prompt = gate[t, k] < 0
        scratch.decided.index_put_((r[prompt], g[prompt]), passed[prompt])
    if scratch is not None and bool((gate != 0).any()):
        g = (gate.abs() - 1).clamp(min=0).long()                 # [T, K]
        per_token = torch.gather(scratch.gates[:n], 1, g)
        per_request = scratch.decided[req[:, None], g]
        opened = torch.where(gate < 0, per_request, per_token) != 0
    applies = on & (mode != PROBE) & ((gate == 0) | opened)     # [T, K]
    big = torch.finfo(torch.float32).max
    for k, v in enumerate(rows):
        c = coefficient(mode[:, k], f[:, k, COEF], f[:, k, CLAMP_LO], f[:, k, CLAMP_HI],
                        dots[:, k] if project else None, hnorm)  # [T]
        term = (v * c[:, None]).clamp(-big, big)                 # [T, H] finite: no inf - inf
        acc = acc + torch.where(applies[:, k, None], term, -0.0)
    top = torch.finfo(x.dtype).max
    steered = applies.any(1)                                     # [T]
    x[steered] = acc[steered].clamp(-top, top).to(x.dtype)      # steered tokens only


_LIB = torch.library.Library("hotwire", "DEF")  # kept: the op lives as long as its library
_LIB.define("steer_(Tensor(a!) x, Tensor? residual, Tensor positions, Tensor anchor) -> ()")


def _steer_torch(x, residual, positions, anchor) -> None:
    layer = _steering(anchor)
    if layer is not None:
        reference(x, residual, positions, layer.bank, layer.route, layer.tok_row, layer.scratch)


def _steer_cuda(x, residual, positions, anchor) -> None:
    layer = _steering(anchor)
    if layer is not None:
        from .steer_triton import launch  # Triton is only needed (and present) where CUDA is

        launch(x, residual, positions, layer.bank, layer.route, layer.tok_row, layer.scratch)
        if graph_switch.recording:
            graph_switch.note(layer, x.device.index)


_LIB.impl("steer_", _steer_torch, "CompositeExplicitAutograd")
_LIB.impl("steer_", _steer_cuda, "CUDA")


@torch.library.register_fake("hotwire::steer_")
def _(x, residual, positions, anchor) -> None:
    return None


steer_ = torch.ops.hotwire.steer_.default


def _call_past_the_dispatcher(op: torch._ops.OpOverload) -> None:
    """Let a plain inference call of ``op`` reach its Python kernel without torch's dispatcher.

    Why: a step run without a CUDA graph calls the op from inductor's code on every armed layer
    (``torch.ops.hotwire.steer_.default(...)``), and the dispatcher lets the GIL go on the way to
    the op's Python kernel and takes it back there; in a served engine vLLM's other threads may
    take it in between, and the call then waits for it (:mod:`.staging`). So where no one but the
    kernel could act on the call (plain tensors, inference mode, no dispatch or function mode, no
    profiler) the kernel the dispatcher would pick is called directly: :func:`_steer_cuda` for CUDA
    tensors, :func:`_steer_torch` otherwise. Every other call, tracing and fake tensors included,
    goes through the dispatcher as registered. In inference mode the dispatcher does nothing else
    for an in-place custom op (no autograd, no version counter). ``OpOverload.__call__`` is
    ``self._op(...)``; where a torch lacks what this reads, the op is left as registered."""
    dispatched = getattr(op, "_op", None)
    if dispatched is None:
        return
    try:
        modes, function_modes = torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled
        profiling, inference = torch._C._autograd._profiler_enabled, torch.is_inference_mode_enabled
    except AttributeError:
        return
    plain, anchors = torch.Tensor, (torch.Tensor, torch.nn.Parameter)

    def call(x, residual, positions, anchor):
        if (type(x) is plain and type(positions) is plain and type(anchor) in anchors
                and (residual is None or type(residual) is plain)
                and inference() and not modes() and not function_modes() and not profiling()):
            (_steer_cuda if x.is_cuda else _steer_torch)(x, residual, positions, anchor)
            return None
        return dispatched(x, residual, positions, anchor)

    call.__wrapped__ = dispatched  # what a benchmark restores to compare (benchmarks/bench_site/op_off.py)
    op._op = call


_call_past_the_dispatcher(steer_)
