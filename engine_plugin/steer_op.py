"""``hotwire::steer``, the steering add, as one opaque custom op: Triton on CUDA, torch elsewhere.

Why opaque. Traced as plain tensor code, the add was fused by inductor into the next layer's
RMSNorm kernel, and on the GPU the heavier kernel made inductor pick another reduction
strategy (looped instead of persistent): the norm's summation order changed, and with it the
rounding of unsteered tokens. As a custom op the add is a kernel of its own, one launch per
armed layer, and the kernels around it are generated exactly as without the plugin, provided
its input is a tensor the plugin-free graph stores too (hence the layer's output, not the
residual: :func:`.steering._steered_class`). An unsteered token passes through bit for bit
(invariant 1); ``benchmarks/kernel_diff.py`` compares the generated kernels.

Contract, for ``x [T, H]`` (the layer's output: one addend of the residual stream),
``positions [T]`` and the layer's per-token entries ``route [N>=T, K, 4]`` int32 (any token
stride; an entry's four words contiguous)::

    out[t] = x[t] + sum_k  where(lo <= positions[t] < hi,  scale * bank[row],  -0.0)
             with (row, lo, hi, scale as float32 bits) = route[t, k]

in float32 (each term clamped to float32's finite range, so no sum is ever NaN), saturated to the
finite range of ``x.dtype`` and rounded once to it. A token with no
entry on keeps every bit (here ``-0.0`` is the exact identity of float addition; the Triton
kernel stores such a token as loaded). A steered token never becomes non-finite (invariant 8):
admission bounds each entry's size (:func:`.routing.entry_limit`), and the saturation is the
backstop for a sum that still overflows.
``out`` is a new contiguous tensor (custom ops may not alias their inputs).

The op takes the layer's own entries, not the whole tables and a layer index: an index would be
a constant of the traced graph, making every armed layer's piece of it unique (inductor compiled
each one: start-up +75 % at 28 layers), and one held in a tensor would be one more dependent load.
"""

from __future__ import annotations

import torch


def reference(x: torch.Tensor, positions: torch.Tensor, bank: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
    """The contract in torch: the CPU kernel, and what the Triton kernel is tested against."""
    # x: [T, H]; positions: [T]; bank: [S+1, H]; route: [N>=T, K, 4] int32
    n = x.shape[0]
    rt = route[:n]                                               # [T, K, 4]
    c = rt[..., 3].view(torch.float32)                           # [T, K] the scales' bits
    pos = positions[:n, None]                                    # [T, 1]
    on = (pos >= rt[..., 1]) & (pos < rt[..., 2])                # [T, K]
    acc = x.to(torch.float32, copy=True)                         # [T, H]
    big = torch.finfo(torch.float32).max
    for k in range(rt.shape[1]):  # K is small and static
        v = (bank[rt[:, k, 0]].float() * c[:, k, None]).clamp(-big, big)  # [T, H] finite: no inf - inf
        acc = acc + torch.where(on[:, k, None], v, -0.0)
    top = torch.finfo(x.dtype).max
    acc = torch.where(on.any(1, keepdim=True), acc.clamp(-top, top), acc)  # steered tokens only
    return acc.to(x.dtype).contiguous()


@torch.library.custom_op("hotwire::steer", mutates_args=())
def steer(x: torch.Tensor, positions: torch.Tensor, bank: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
    return reference(x, positions, bank, route)


@steer.register_fake
def _(x, positions, bank, route):
    return x.new_empty(x.shape)


@steer.register_kernel("cuda")
def _(x, positions, bank, route):
    from .steer_triton import launch  # Triton is only needed (and present) where CUDA is

    return launch(x, positions, bank, route)
