"""``hotwire::steer``, the steering add, as one opaque custom op: Triton on CUDA, torch elsewhere.

Why opaque. Traced as plain tensor code, the add was fused by inductor into the next layer's
RMSNorm kernel, and on the GPU the heavier kernel made inductor pick another reduction
strategy (looped instead of persistent): the norm's summation order changed, and with it the
rounding of unsteered tokens. As a custom op the add is a kernel of its own, one launch per
armed layer, and the kernels around it are generated exactly as without the plugin, provided
its input is a tensor the plugin-free graph stores too (hence the layer's output, not the
residual: :func:`.steering._steered_class`). An unsteered token passes through bit for bit
(invariant 1); ``benchmarks/kernel_diff.py`` compares the generated kernels.

Contract, for ``x [T, H]`` (the layer's output: one addend of the residual stream), ``residual
[T, H]`` (the other addend, read only; None where the layer returns the stream itself),
``positions [T]`` and the layer's per-token entries ``route [N>=T, K, 8]`` int32 (any token
stride; an entry's words contiguous, laid out as in :mod:`.interventions`)::

    h      = x[t] + residual[t]                                      (float32)
    out[t] = x[t] + sum_k  where(lo <= positions[t] < hi,  c_k(h) * bank[row],  -0.0)

with ``c_k`` the entry's mode coefficient (:func:`.interventions.coefficient`: ``a`` for an add,
from ``h·bank[row]`` and ``‖h‖`` otherwise), in float32 (each term clamped to float32's finite
range, so no sum is ever NaN), saturated to the finite range of ``x.dtype`` and rounded once to it.
A token with no entry on keeps every bit (here ``-0.0`` is the exact identity of float addition;
the Triton kernel stores such a token as loaded, and reads neither its residual nor a bank row).
A steered token never becomes non-finite (invariant 8): admission bounds each entry's size
(:func:`.admission.entry_limit`), and the saturation is the backstop for a sum that still overflows.
``out`` is a new contiguous tensor (custom ops may not alias their inputs).

The op takes the layer's own entries, not the whole tables and a layer index: an index would be
a constant of the traced graph, making every armed layer's piece of it unique (inductor compiled
each one: start-up +75 % at 28 layers), and one held in a tensor would be one more dependent load.
"""

from __future__ import annotations

import torch

from .interventions import ADD, CLAMP_HI, CLAMP_LO, COEF, MODE, POS_HI, POS_LO, ROW, coefficient


def reference(x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
              bank: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
    """The contract in torch: the CPU kernel, and what the Triton kernel is tested against."""
    # x, residual: [T, H]; positions: [T]; bank: [S+1, H]; route: [N>=T, K, 8] int32
    n = x.shape[0]
    rt = route[:n]                                               # [T, K, 8]
    f = rt.view(torch.float32)                                   # the same words as float32
    pos = positions[:n, None]                                    # [T, 1]
    on = (pos >= rt[..., POS_LO]) & (pos < rt[..., POS_HI])      # [T, K]
    if not on.any():  # nothing to do on this step: the common case, kept cheap on the CPU
        return x.clone(memory_format=torch.contiguous_format)
    acc = x.to(torch.float32, copy=True)                         # [T, H]
    project = bool((on & (rt[..., MODE] != ADD)).any())          # any entry needs h·v or ‖h‖
    h = acc if residual is None or not project else acc + residual.float()  # [T, H] the stream
    hnorm = h.square().sum(-1).sqrt() if project else None       # [T]
    big = torch.finfo(torch.float32).max
    for k in range(rt.shape[1]):  # K is small and static
        v = bank[rt[:, k, ROW]].float()                          # [T, H]
        dot = (h * v).sum(-1) if project else None               # [T]
        c = coefficient(rt[:, k, MODE], f[:, k, COEF], f[:, k, CLAMP_LO], f[:, k, CLAMP_HI], dot, hnorm)
        term = (v * c[:, None]).clamp(-big, big)                 # [T, H] finite: no inf - inf
        acc = acc + torch.where(on[:, k, None], term, -0.0)
    top = torch.finfo(x.dtype).max
    acc = torch.where(on.any(1, keepdim=True), acc.clamp(-top, top), acc)  # steered tokens only
    return acc.to(x.dtype).contiguous()


@torch.library.custom_op("hotwire::steer", mutates_args=())
def steer(x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, bank: torch.Tensor,
          route: torch.Tensor) -> torch.Tensor:
    return reference(x, residual, positions, bank, route)


@steer.register_fake
def _(x, residual, positions, bank, route):
    return x.new_empty(x.shape)


@steer.register_kernel("cuda")
def _(x, residual, positions, bank, route):
    from .steer_triton import launch  # Triton is only needed (and present) where CUDA is

    return launch(x, residual, positions, bank, route)
