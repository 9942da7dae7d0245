"""The Triton kernel behind ``hotwire::steer`` on CUDA (contract: :mod:`.steer_op`).

One program per (token, block of the hidden dim). The routing entries a program reads sit at
the token's own index, so the bank row is the only dependent load, and it is skipped (masked)
for entries that are off: an unsteered token reads x and its routing entries, and stores x as
loaded (a select, not an add of zero, which compilers may fold away from ``-0.0``); a steered
token's terms are clamped to float32's finite range and its sum saturated to the output dtype's
``[-TOP, TOP]`` before it is rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _steer(x_ptr, out_ptr, pos_ptr, bank_ptr, route_ptr, route_stride,
           H: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, TOP: tl.constexpr, BIG: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)       # [BLOCK]
    x = tl.load(x_ptr + t * H + cols, mask=cols < H)
    acc = x.to(tl.float32)
    p = tl.load(pos_ptr + t)
    entry = route_ptr + t * route_stride                        # route[t, 0, :]
    hits = 0
    for k in tl.static_range(K):
        row = tl.load(entry + 4 * k).to(tl.int64)
        lo = tl.load(entry + 4 * k + 1)
        hi = tl.load(entry + 4 * k + 2)
        scale = tl.load(entry + 4 * k + 3).to(tl.float32, bitcast=True)
        on = (p >= lo) & (p < hi)
        hits += on.to(tl.int32)
        width = tl.where(on, H, 0)                              # off: the row is not read, v = 0
        v = tl.load(bank_ptr + row * H + cols, mask=cols < width, other=0.0).to(tl.float32)
        acc += tl.minimum(tl.maximum(v * scale, -BIG), BIG)  # finite terms: never inf - inf
    acc = tl.minimum(tl.maximum(acc, -TOP), TOP)
    # a token with no entry on is stored as loaded: every bit, signed zeros included
    out = tl.where(hits > 0, acc.to(out_ptr.dtype.element_ty), x)
    tl.store(out_ptr + t * H + cols, out, mask=cols < H)


def launch(x: torch.Tensor, positions: torch.Tensor, bank: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
    # x: [T, H]; positions: [T]; bank: [S+1, H]; route: [N>=T, K, 4] int32, a strided view
    x, positions = x.contiguous(), positions.contiguous()  # no-ops here
    if route.stride(1) != 4 or route.stride(2) != 1:
        route = route.contiguous()
    out = torch.empty_like(x)
    n, h = x.shape
    if n == 0:
        return out
    block = min(1024, triton.next_power_of_2(h))
    _steer[(n, triton.cdiv(h, block))](x, out, positions, bank, route, route.stride(0),
                                       H=h, K=route.shape[1], BLOCK=block,
                                       TOP=torch.finfo(x.dtype).max, BIG=torch.finfo(torch.float32).max,
                                       num_warps=4)
    return out
