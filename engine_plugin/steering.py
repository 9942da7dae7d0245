"""The steering tables, and the steering op armed into the model's decoder layers.

At the end of armed layer ``L`` every token ``t`` of request ``r`` gets

    h_L[t] += sum_k  c_k(h_L[t]) * bank[slot[r, L, k]]     for k with lo <= pos[t] < hi

on the residual stream, ``c_k`` being the entry's mode coefficient (:mod:`.interventions`:
its scale for an add, from ``h·v`` and ``‖h‖`` for the projecting modes). The steering is one opaque
in-place custom op (``hotwire::steer_``, :mod:`.steer_op`): torch.compile traces it without a
graph break, inductor leaves it a kernel of its own, and the kernels around it are generated
exactly as without the plugin. All state lives in buffers allocated once, before compile and
CUDA-graph capture; steering on/off and vector changes are content updates between replays
(invariant 4), and steps with nothing steered replay graphs without the op (:mod:`.idle_graphs`).

The op reads each token's request row (``tok_row``, uploaded by the router only when the batch
changes), then that row's entries for its layer in the routing table (``route``, written once per
request), and it writes only steered tokens: an unsteered token keeps its bits. The tables are
no input of the compiled forward: each armed layer's op call names one of the layer's own
parameters as its anchor, bound to the layer's slice of the tables (:func:`.steer_op.bind`), so
the compiled forward takes exactly the inputs it takes without the plugin, and every armed layer
traces to the same graph.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass

import torch
from torch import nn

from .interventions import WORDS
from .steer_op import ArmedLayer, GateScratch, StepState, bind, steer_

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)$")


class SteeringTables:
    """GPU bank, per-request routing rows and each token's request row, at fixed addresses.

    Shapes (S slots, H hidden, A armed layers, R request rows, K entries, N max tokens)::

        bank      [S+1, H]          model dtype   row 0 = zeros
        route     [R+1, A, K, 8]    int32         an entry's words (:mod:`.interventions`: bank
                                                  row, token window, mode and its float32
                                                  coefficients); request row 0 = null (all zeros)
        tok_row   [N]               int32         request row of each token of the current step
                                                  (0 for an unsteered request's tokens)
        gates     [N, K]            int32         per token: did the request's gate g open (probes
                                                  write it, gated entries read it; one step long)
        gate_counts [R+1, K]        int32         tokens each gate opened, per request row
        gate_decided [R+1, K]       int32         a prompt gate's decision, per request row

    ``route`` is row-major in the request row, so admitting a request is one copy of a contiguous
    row, and a batch change one copy of the token map into ``tok_row``: no kernel of their own on
    the host path, which a host-bound served engine pays on most steps (:mod:`.routing`). A
    layer's slice (:meth:`layer`) is a strided view; an entry's eight words are 32-byte aligned.
    ``layers[pos]`` is what armed layer ``pos``'s op calls read (:class:`.steer_op.ArmedLayer`).
    """

    def __init__(self, *, slots: int, hidden: int, armed: int, requests: int, entries: int,
                 max_tokens: int, dtype: torch.dtype, device: torch.device):
        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.bank = zeros(slots + 1, hidden, dtype=dtype)
        self.route = zeros(requests + 1, armed, entries, WORDS)
        self.tok_row = zeros(max_tokens)
        self.gates = zeros(max_tokens, entries)
        self.gate_counts = zeros(requests + 1, entries)
        self.gate_decided = zeros(requests + 1, entries)
        self.step = StepState(GateScratch(self.gates, self.gate_counts, self.gate_decided), armed)
        self.layers = [ArmedLayer(self.bank, self.layer(pos), self.tok_row, self.step, pos) for pos in range(armed)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in
                   (self.bank, self.route, self.tok_row, self.gates, self.gate_counts, self.gate_decided))

    def layer(self, pos: int) -> torch.Tensor:
        """Armed layer ``pos``'s entries per request row: a view ``[R+1, K, 8]``."""
        return self.route[:, pos]


@dataclass(frozen=True)
class ArmedModel:
    tables: SteeringTables
    layers: tuple[int, ...]  # decoder-layer indices, in table order

    def position(self, layer: int) -> int | None:
        """The layer's index in the tables, None when it is not armed."""
        return self._positions.get(layer)

    @functools.cached_property
    def _positions(self) -> dict[int, int]:
        return {layer: i for i, layer in enumerate(self.layers)}


def decoder_layers(model: nn.Module) -> dict[int, nn.Module]:
    """``{layer index: module}`` for every ``*DecoderLayer`` this rank holds that can be steered.

    The op needs each token's position, so only layers whose forward takes vLLM's ``positions``
    qualify. Others are left alone: the Transformers modeling backend's layers (``position_ids``,
    a batch dimension), Mamba-style mixers, OPT; a model with none of them serves unsteered.
    """
    found: dict[int, nn.Module] = {}
    for name, mod in model.named_modules():
        m = _LAYER_INDEX.search(name)
        if m and type(mod).__name__.endswith("DecoderLayer") and _positions_arg(type(mod)) is not None:
            found.setdefault(int(m.group(1)), mod)
    return found


@functools.cache
def _positions_arg(cls: type) -> int | None:
    """Index of ``positions`` among the positional arguments of ``cls.forward``, or None."""
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    for i, p in enumerate(params):
        if p.name == "positions" and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            return i
    return None


def anchor_path(layer: nn.Module, taken: set[int], device: torch.device) -> tuple[str, ...] | None:
    """Where the op's anchor is in ``layer`` (:mod:`.steer_op`): the last parameter registered
    that is on ``device`` and whose address is not in ``taken`` (other armed layers' anchors: a
    weight shared between layers cannot tell them apart), preferring a plain ``nn.Parameter`` (a
    subclass with its own torch function sends the call through the dispatcher). In most decoder
    families the last is a norm's weight read after the attention, already an input of the compiled
    piece the op is in. A parameter vLLM offloaded to host memory without a device view of it is
    not on ``device``: its forward runs on a fresh copy each time, at another address. None when
    the layer has no such parameter."""
    params = [(name, p) for name, p in layer.named_parameters()
              if p.numel() and p.device.type == device.type and p.data_ptr() not in taken]
    plain = [(name, p) for name, p in params if type(p) in (nn.Parameter, torch.Tensor)]
    return tuple((plain or params)[-1][0].split(".")) if params else None


def steer(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor | None,
          positions: torch.Tensor) -> torch.Tensor:
    """Steer ``x``, armed ``layer``'s output, in place and return it."""
    # x: [T, H] an addend of the stream; residual: [T, H] the other addend (None: x is the
    # stream); positions: [T] (or [3, T] for M-RoPE)
    if positions.dim() == 2:
        positions = positions[0]
    steer_(x, residual, positions[: x.shape[0]], _walk(layer, layer.hotwire_anchor))
    return x


@functools.cache
def _steered_class(base: type, reads_stream: bool) -> type:
    """A subclass of ``base`` whose forward steers the residual stream it returns; with
    ``reads_stream`` its op is also given the residual (the projecting modes need ``h``)."""
    at = _positions_arg(base)

    def forward(self, *args, **kwargs):
        out = base.forward(self, *args, **kwargs)
        positions = kwargs["positions"] if "positions" in kwargs else args[at]
        if isinstance(out, tuple) and len(out) == 2 and out[1] is not None:
            # vLLM's fused pair: the stream is hidden + residual. Steer ``hidden``, the layer's
            # own output (in most families the MLP's down projection, a GEMM result that every
            # compiled graph materialises), never ``residual``: inductor may keep the residual sum
            # unmaterialised in float32 and recompute it inside the next norm kernel, and an op
            # reading it forces a rounded bf16 copy the next norm then loads (unsteered logprobs
            # moved by up to 1e-2 on the GPU at hidden 128; bit-exact at Qwen3 0.6B's width). So
            # only HOTWIRE_PROJECTION_LAYERS read it.
            hidden, residual = out
            return steer(self, hidden, residual if reads_stream else None, positions), residual
        if isinstance(out, torch.Tensor):
            return steer(self, out, None, positions)
        raise TypeError(f"{base.__name__} returns {type(out).__name__}; cannot steer it")

    name = f"{'Projecting' if reads_stream else 'Steered'}{base.__name__}"
    return type(name, (base,), {"forward": forward, "__module__": __name__})


def anchors(found: dict[int, nn.Module], armed: list[int], device: torch.device) -> dict[int, tuple[str, ...]]:
    """Each armed layer's anchor (:func:`anchor_path`), for those that have one."""
    taken: set[int] = set()
    paths = {}
    for i in armed:
        path = anchor_path(found[i], taken, device)
        if path is not None:
            paths[i] = path
            taken.add(_walk(found[i], path).data_ptr())
    return paths


def _walk(layer: nn.Module, path: tuple[str, ...]) -> torch.Tensor:
    for name in path:
        layer = getattr(layer, name)
    return layer


def arm(found: dict[int, nn.Module], paths: dict[int, tuple[str, ...]], tables: SteeringTables,
        projecting: frozenset[int] = frozenset()) -> ArmedModel:
    """Wrap the layers of ``paths`` (decoder-layer index: its anchor, :func:`anchors`; table
    order) in place; those in ``projecting`` read the residual too.

    Layer names, parameters and buffers are unchanged: the layer gets its class, its anchor's
    path (``hotwire_anchor``) and what its anchor is bound to (``hotwire``, so the binding lives
    as long as the layer: :func:`.steer_op.bind`)."""
    for pos, (i, path) in enumerate(paths.items()):
        layer = found[i]
        layer.hotwire_anchor, layer.hotwire = path, tables.layers[pos]
        bind(_walk(layer, path), layer.hotwire)
        layer.__class__ = _steered_class(type(layer), i in projecting)
    return ArmedModel(tables, tuple(paths))
