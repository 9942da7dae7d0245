"""The Triton kernel behind :class:`.staging.HostRing`'s uploads on CUDA: words read from pinned
host memory by the GPU's own threads and stored into device tensors, and (the V2 runner) each
token's request row expanded from the runner's own batch on the device.

Why a kernel, not a copy. A copy (``cuMemcpyAsync``, or torch's ``copy_``) from pinned memory
runs on a copy engine, in stream order: the step's next kernel starts only once the kernels before
it have drained and the copy has landed. Where the GPU is shared and busy (servers under MPS, every
SM taken), that wait grew the step: at 256 in flight on one H100 a server uploading by copies
waited 0.9 ms a step longer for its output than plugin-free (5 ms in a run on a faster host), with
the same forward time, and neither one uploading nothing nor one uploading through a kernel did
(``docs/performance.md``, "Session 29").
vLLM's own runner reads its staged inputs the same way (unified addressing: a pinned buffer's
device address), never through a copy engine.

One launch, described in pinned memory: a header of :data:`HEADER` int64 words, then three int64
words ``(dst address, src address, words)`` per segment, so the kernel has one argument and
compiles once. Header::

    segments m, states, query_starts, rows, tok_row, requests n, tokens, clear_to

Programs ``0..m-1`` copy one segment each; programs ``m..m+n`` expand the token map (int32 words)::

    for (dst, src, w) in segments:  dst[0:w] = src[0:w]
    for i < n:  tok_row[query_starts[i]: query_starts[i+1]] = rows[states[i]]
    tok_row[tokens: clear_to] = 0

``states`` and ``query_starts`` are the runner's device tensors of the step (its request state of
each batch entry, and where each entry's tokens start), ``rows`` hotwire's request row per state,
in pinned memory (:class:`.state_rows.StateRows`). The programs run in any order, so no two
destinations may overlap and no program reads what another writes (the routing's never do:
distinct request rows, one token map, read only by the op).

Once compiled, the kernel is launched by the driver itself (:mod:`.driver_launch`: a few
microseconds, the GIL kept), where it can be; else by Triton.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import triton
import triton.language as tl

from . import driver_launch


BLOCK = 1024  # words a program moves per iteration
HEADER = 8  # int64 words before the segments (module docstring)


@triton.jit(do_not_specialize=["desc"])
def _upload(desc, BLOCK: tl.constexpr, HEADER: tl.constexpr):
    head = desc.to(tl.pointer_type(tl.int64))
    pid = tl.program_id(0)
    segments = tl.load(head)
    if pid < segments:
        seg = head + HEADER + 3 * pid                            # this program's (dst, src, n)
        dst = tl.load(seg).to(tl.pointer_type(tl.int32))
        src = tl.load(seg + 1).to(tl.pointer_type(tl.int32))
        n = tl.load(seg + 2)
        for start in range(0, n, BLOCK):
            w = start + tl.arange(0, BLOCK)                      # [BLOCK]
            tl.store(dst + w, tl.load(src + w, mask=w < n), mask=w < n)
    else:
        e = pid - segments                                       # this program's batch entry
        states = tl.load(head + 1).to(tl.pointer_type(tl.int32))
        starts = tl.load(head + 2).to(tl.pointer_type(tl.int32))
        rows = tl.load(head + 3).to(tl.pointer_type(tl.int32))
        tok = tl.load(head + 4).to(tl.pointer_type(tl.int32))
        entry = e < tl.load(head + 5)                            # else: the tail past the tokens
        row = tl.load(rows + tl.load(states + e, mask=entry, other=0), mask=entry, other=0)
        lo = tl.where(entry, tl.load(starts + e, mask=entry, other=0), tl.load(head + 6).to(tl.int32))
        hi = tl.where(entry, tl.load(starts + e + 1, mask=entry, other=0), tl.load(head + 7).to(tl.int32))
        for at in range(lo, hi, BLOCK):
            t = at + tl.arange(0, BLOCK)                         # [BLOCK]
            tl.store(tok + t, tl.zeros([BLOCK], tl.int32) + row, mask=t < hi)


def launch(desc: int, programs: int) -> None:
    """Enqueue the upload described at device address ``desc`` with ``programs`` programs (its
    segments, plus its batch entries and one for the tail where it expands) on the current stream."""
    _upload[(programs,)](desc, BLOCK=BLOCK, HEADER=HEADER)


def launcher(desc: int, device: int) -> Callable[[int, int], None]:
    """Compile the kernel for CUDA device ``device`` (the current one) by one launch of the
    description at ``desc`` (a header of zeros: no segment, an empty tail), and return how to
    launch it from then on, as :func:`launch` is called: by the driver, or by Triton where the
    driver cannot, and for good once the driver has refused a launch (logged once)."""
    fast = driver_launch.launcher(_upload[(1,)](desc, BLOCK=BLOCK, HEADER=HEADER), (driver_launch.WORD,), device)
    if fast is None:
        return launch

    def launch_by_driver(desc: int, programs: int) -> None:
        nonlocal fast
        if fast is None or not fast(programs, desc):  # refused by the driver (logged): Triton's, from now on
            fast = None
            launch(desc, programs)

    return launch_by_driver


def reference(memory: np.ndarray, desc: np.ndarray) -> None:
    """The contract on one flat int32 array standing for the address space: ``desc`` as the kernel
    reads it, with word offsets into ``memory`` for addresses."""
    m, states, starts, rows, tok, n, tokens, clear_to = desc[:HEADER].tolist()
    for dst, src, w in desc[HEADER: HEADER + 3 * m].reshape(-1, 3).tolist():
        memory[dst: dst + w] = memory[src: src + w]
    for i in range(n):
        memory[tok + memory[starts + i]: tok + memory[starts + i + 1]] = memory[rows + memory[states + i]]
    memory[tok + tokens: tok + clear_to] = 0
