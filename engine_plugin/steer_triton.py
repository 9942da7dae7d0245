"""The Triton kernel behind ``hotwire::steer_`` on CUDA (contract: :mod:`.steer_op`).

One program per token, in place. It reads the token's request row, then that row's entries for
the layer (bank rows are the only loads that depend on them); a token with no entry on stops
there: it is neither read nor written. A steered token's program walks the hidden dim in blocks: first, if an entry
projects (``norm``/``ablate``/``clamp``, :mod:`.interventions`) or probes a gate, it reduces
``h·v`` and ``‖h‖²`` over the whole row (reading its residual; add-only tokens skip this pass),
then adds its terms block by block and stores the row back. One program owning the whole row
is what makes the update safe in place: no program can overwrite a block another still has to
read for its reduction. Gate probes record whether each gate opened (``gates``, the per-request
``counts``, and for a prompt gate ``decided``); a gated entry reads a gate recorded on this layer
from its own probe's registers, one from an earlier layer from the scratch. A steered token's
terms are clamped to float32's finite range and its sum saturated to the output dtype's
``[-TOP, TOP]`` before it is rounded.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import driver_launch
from . import interventions as iv


# the route-table layout, as constants the kernel may read
ROW, POS_LO, POS_HI, MODE, COEF, CLAMP_LO, CLAMP_HI, GATE, WORDS = (
    tl.constexpr(w) for w in (iv.ROW, iv.POS_LO, iv.POS_HI, iv.MODE, iv.COEF, iv.CLAMP_LO, iv.CLAMP_HI, iv.GATE,
                              iv.WORDS))
NORM, ABLATE, CLAMP, PROBE = (tl.constexpr(m) for m in (iv.NORM, iv.ABLATE, iv.CLAMP, iv.PROBE))


@triton.jit
def _steer(x_ptr, res_ptr, pos_ptr, bank_ptr, route_ptr, route_stride, tok_row_ptr, gates_ptr, counts_ptr,
           decided_ptr,
           H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr,
           HAS_RES: tl.constexpr, HAS_GATES: tl.constexpr, TOP: tl.constexpr, BIG: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t)
    req = tl.load(tok_row_ptr + t).to(tl.int64)                 # the token's request row
    ks = tl.arange(0, KP)                                       # [KP] entries (K, padded)
    entry = route_ptr + req * route_stride + WORDS * ks         # route[req, k, :]
    live = ks < K
    rows = tl.load(entry + ROW, mask=live, other=0).to(tl.int64)
    on = live & (p >= tl.load(entry + POS_LO, mask=live, other=0)) & (p < tl.load(entry + POS_HI, mask=live, other=0))
    if tl.sum(on.to(tl.int32), axis=0) > 0:                     # else: an unsteered token, untouched
        mode = tl.load(entry + MODE, mask=live, other=0)
        gate = tl.load(entry + GATE, mask=live, other=0)        # [KP] 0: ungated, < 0: a prompt gate
        g = tl.abs(gate) - 1                                    # [KP] the gate's column
        coef = tl.load(entry + COEF, mask=live, other=0).to(tl.float32, bitcast=True)  # [KP] a
        applies = on & (mode != PROBE)
        projecting = on & (mode != 0)
        probing = on & (mode == PROBE)
        passed = probing & (ks < 0)                             # [KP] the gates this layer records: none yet
        if tl.sum(projecting.to(tl.int32), axis=0) > 0:
            dot = tl.zeros([KP], dtype=tl.float32)              # h·v per entry
            sq = tl.zeros([BLOCK], dtype=tl.float32)            # ‖h‖², by column
            for start in tl.static_range(0, H, BLOCK):
                c = start + tl.arange(0, BLOCK)
                h = tl.load(x_ptr + t * H + c, mask=c < H, other=0.0).to(tl.float32)
                if HAS_RES:
                    h += tl.load(res_ptr + t * H + c, mask=c < H, other=0.0).to(tl.float32)
                v = tl.load(bank_ptr + rows[:, None] * H + c[None, :],
                            mask=projecting[:, None] & (c < H)[None, :], other=0.0).to(tl.float32)  # [KP, BLOCK]
                dot += tl.sum(v * h[None, :], axis=1)
                sq += h * h
            hnorm = tl.sqrt(tl.sum(sq, axis=0))
            lo = tl.load(entry + CLAMP_LO, mask=live, other=0).to(tl.float32, bitcast=True)  # a probe's threshold
            hi = tl.load(entry + CLAMP_HI, mask=live, other=0).to(tl.float32, bitcast=True)
            proj = coef * dot
            if HAS_GATES:
                passed = probing & (proj > lo)
                tl.store(gates_ptr + t * G + g, passed.to(tl.int32), mask=probing)
                tl.atomic_add(counts_ptr + req * G + g, passed.to(tl.int32), mask=probing)
                tl.store(decided_ptr + req * G + g, passed.to(tl.int32), mask=probing & (gate < 0))
            coef = tl.where(mode == NORM, coef * hnorm,
                   tl.where(mode == ABLATE, -coef * dot,
                   tl.where(mode == CLAMP, (tl.minimum(tl.maximum(proj, lo), hi) - proj) * coef, coef)))
            coef = tl.where(coef == coef, coef, 0.0)            # NaN (an overflowed h·v): no change
            coef = tl.minimum(tl.maximum(coef, -BIG), BIG)
        if HAS_GATES:
            # a gate recorded on this layer is read from this token's own probe (in registers), one
            # from an earlier layer from the scratch
            gated = applies & (gate != 0)
            if tl.sum(gated.to(tl.int32), axis=0) > 0:
                per_token = tl.load(gates_ptr + t * G + g, mask=gated & (gate > 0), other=0)
                per_request = tl.load(decided_ptr + req * G + g, mask=gated & (gate < 0), other=0)
                opened = tl.where(gate < 0, per_request, per_token) != 0
                here = (gate[:, None] == gate[None, :]) & probing[None, :]       # [KP, KP]
                mine = tl.sum(here.to(tl.int32), axis=1) > 0
                mine_open = tl.sum((here & passed[None, :]).to(tl.int32), axis=1) > 0
                opened = tl.where(mine, mine_open, opened)
                applies = applies & ((gate == 0) | opened)
        else:
            applies = applies & (gate == 0)
        if tl.sum(applies.to(tl.int32), axis=0) > 0:            # else: only probes, or closed gates
            for start in tl.static_range(0, H, BLOCK):
                cols = start + tl.arange(0, BLOCK)              # [BLOCK]
                acc = tl.load(x_ptr + t * H + cols, mask=cols < H).to(tl.float32)
                for k in tl.static_range(K):
                    pick = ks == k
                    on_k = tl.sum((applies & pick).to(tl.int32), axis=0) > 0
                    row = tl.sum(tl.where(pick, rows, 0), axis=0)
                    c_k = tl.sum(tl.where(pick, coef, 0.0), axis=0)
                    width = tl.where(on_k, H, 0)                # off: the row is not read, v = 0
                    v = tl.load(bank_ptr + row * H + cols, mask=cols < width, other=0.0).to(tl.float32)
                    acc += tl.minimum(tl.maximum(v * c_k, -BIG), BIG)  # finite terms: never inf - inf
                acc = tl.minimum(tl.maximum(acc, -TOP), TOP)
                tl.store(x_ptr + t * H + cols, acc.to(x_ptr.dtype.element_ty), mask=cols < H)


@functools.cache
def _constants(dtype: torch.dtype, h: int, k: int, has_res: bool, gates: int | None) -> dict:
    """The kernel's compile-time arguments for one layer shape (looked up, not rebuilt, per call)."""
    return dict(H=h, K=k, KP=triton.next_power_of_2(k), G=gates or 1, BLOCK=min(1024, triton.next_power_of_2(h)),
                HAS_RES=has_res, HAS_GATES=gates is not None, TOP=torch.finfo(dtype).max,
                BIG=torch.finfo(torch.float32).max, num_warps=4)


# the kernel's parameters as the driver reads them: five addresses, the route's row stride (int32,
# in range: a small multiple of WORDS), four addresses
_SIZES = (driver_launch.WORD,) * 5 + (driver_launch.HALF,) + (driver_launch.WORD,) * 4
_UNTRIED = object()
_LAUNCHES: dict[tuple, object] = {}  # specialisation -> a DriverLaunch, None (Triton's stays) or _UNTRIED
_FUNCTIONS: set[int] = set()  # the CUDA functions of every specialisation Triton launched


def kernel_functions() -> set[int]:
    """The CUDA function handles of the op's compiled kernels (:mod:`.graph_switch` switches only
    graph nodes running one of them)."""
    return _FUNCTIONS


def launch(x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, bank: torch.Tensor,
           route: torch.Tensor, tok_row: torch.Tensor, scratch=None) -> None:
    """Steer ``x`` in place: by Triton the first time a specialisation is met, by the CUDA driver
    from then on where it can be (:mod:`.driver_launch`).

    Why the driver. In a step run without a CUDA graph this is called on every steered layer, and
    Triton's launch costs the step thread several times the driver's call. A specialisation is
    what Triton compiles one kernel for: the constexprs (dtypes, ``H``, ``K``, residual or not,
    gates), the route's row stride (an integer specialised on being a multiple of 16) and which
    addresses are 16-byte aligned. The driver launches only calls whose addresses all are (those
    of vLLM's activations, hotwire's tables and views of them always are), with the kernel Triton
    compiled for such a call; a call with an unaligned address goes to Triton, and so does, from
    then on, a specialisation whose launch the driver refused (logged once)."""
    # x, residual: [T, H]; positions: [T]; bank: [S+1, H]; route: [R+1, K, 8] int32, a strided view;
    # tok_row: [N>=T] int32; scratch: a .steer_op.GateScratch, or None (no gate opens)
    n, h = x.shape
    if n == 0:
        return
    if not x.is_contiguous():  # not seen in vLLM's layers; kept correct all the same
        work = x.contiguous()
        launch(work, residual, positions, bank, route, tok_row, scratch)
        x.copy_(work)
        return
    positions, tok_row = positions.contiguous(), tok_row.contiguous()  # no-ops here
    residual = residual.contiguous() if residual is not None else None
    strides = route.stride()  # all at once: stride(dim) releases the GIL (.staging), stride() does not
    if strides[1] != iv.WORDS or strides[2] != 1:
        route = route.contiguous()
        strides = route.stride()
    gates, counts, decided = scratch if scratch is not None else (route,) * 3  # unread without gates
    res = x if residual is None else residual
    words = (x.data_ptr(), res.data_ptr(), positions.data_ptr(), bank.data_ptr(), route.data_ptr(), strides[0],
             tok_row.data_ptr(), gates.data_ptr(), counts.data_ptr(), decided.data_ptr())
    aligned = not (words[0] | words[1] | words[2] | words[3] | words[4] | words[6] | words[7] | words[8]
                   | words[9]) & 15
    key = (x.dtype, res.dtype, positions.dtype, bank.dtype, route.dtype, tok_row.dtype, gates.dtype, h,
           route.shape[1], strides[0], residual is not None, None if scratch is None else gates.shape[-1],
           x.device.index)
    fast = _LAUNCHES.get(key, _UNTRIED) if aligned else None
    if fast is not None and fast is not _UNTRIED:
        if fast(n, *words):
            return
        _LAUNCHES[key] = None  # the driver refused it (logged): Triton's launch, from now on
    compiled = _steer[(n,)](x, res, positions, bank, route, strides[0], tok_row, gates, counts, decided,
                            **_constants(x.dtype, h, route.shape[1], residual is not None,
                                         None if scratch is None else gates.shape[-1]))
    if getattr(compiled, "function", None):  # never 0: a node with no function is never the op's
        _FUNCTIONS.add(compiled.function)
    if fast is _UNTRIED:
        _LAUNCHES[key] = driver_launch.launcher(compiled, _SIZES, x.device.index)
