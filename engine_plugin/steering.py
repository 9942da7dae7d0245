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
request), and it writes only steered tokens: an unsteered token keeps its bits.
Each armed layer holds a view of its own layer's slice of the routing table as a buffer: a graph
input, so every armed layer traces to the same graph (a layer index would be a constant in it).
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass

import torch
from torch import nn

from .interventions import WORDS
from .steer_op import GateScratch, StepState, attach, steer_

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)$")


class SteeringTables(nn.Module):
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
    """

    def __init__(self, *, slots: int, hidden: int, armed: int, requests: int, entries: int,
                 max_tokens: int, dtype: torch.dtype, device: torch.device):
        super().__init__()

        def buf(name: str, *shape: int, dtype: torch.dtype = torch.int32) -> None:
            self.register_buffer(name, torch.zeros(*shape, dtype=dtype, device=device), persistent=False)

        buf("bank", slots + 1, hidden, dtype=dtype)
        buf("route", requests + 1, armed, entries, WORDS)
        buf("tok_row", max_tokens)
        buf("gates", max_tokens, entries)
        buf("gate_counts", requests + 1, entries)
        buf("gate_decided", requests + 1, entries)
        self.step = StepState(GateScratch(self.gates, self.gate_counts, self.gate_decided),
                              [self.layer(pos) for pos in range(armed)])
        attach(self.bank, self.step)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def layer(self, pos: int) -> torch.Tensor:
        """Armed layer ``pos``'s entries per request row: a view ``[R+1, K, 8]``."""
        return self.route[:, pos]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                route: torch.Tensor) -> torch.Tensor:
        # x: [T, H] the layer's output (an addend of the stream), steered in place and returned;
        # residual: [T, H] the other addend (None: x is the stream); positions: [T] (or [3, T] for
        # M-RoPE); route: [R+1, K, 8], the layer's slice of the routing table
        if positions.dim() == 2:
            positions = positions[0]
        steer_(x, residual, positions[: x.shape[0]], self.bank, route, self.tok_row)
        return x


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
            stream = residual if reads_stream else None
            return self.hotwire(hidden, stream, positions, self.hotwire_route), residual
        if isinstance(out, torch.Tensor):
            return self.hotwire(out, None, positions, self.hotwire_route)
        raise TypeError(f"{base.__name__} returns {type(out).__name__}; cannot steer it")

    name = f"{'Projecting' if reads_stream else 'Steered'}{base.__name__}"
    return type(name, (base,), {"forward": forward, "__module__": __name__})


def arm(found: dict[int, nn.Module], armed: list[int], tables: SteeringTables,
        projecting: frozenset[int] = frozenset()) -> ArmedModel:
    """Wrap the chosen decoder layers (from :func:`decoder_layers`) in place; those in
    ``projecting`` read the residual too.

    Layer names and parameters are unchanged; the tables become a child of each armed layer,
    so torch.compile sees them as module buffers (graph inputs at fixed addresses). The layer's
    own slice of the per-token table is a buffer too (``hotwire_route``, a view), not an index:
    every armed layer then traces to the same graph, compiled once.
    """
    for pos, i in enumerate(armed):
        layer = found[i]
        layer.add_module("hotwire", tables)
        layer.register_buffer("hotwire_route", tables.layer(pos), persistent=False)
        layer.__class__ = _steered_class(type(layer), i in projecting)
    return ArmedModel(tables, tuple(armed))
