"""The Triton kernel behind :class:`.staging.HostRing`'s uploads on CUDA: words read from pinned
host memory by the GPU's own threads and stored into device tensors.

Why a kernel, not a copy. A copy (``cuMemcpyAsync``, or torch's ``copy_``) from pinned memory
runs on a copy engine, in stream order: the step's next kernel starts only once the kernels before
it have drained and the copy has landed. Where the GPU is shared and busy (servers under MPS, every
SM taken), that wait grew the step: at 256 in flight on one H100 a server uploading by copies
waited 0.9 ms a step longer for its output than plugin-free (5 ms in a run on a faster host), with
the same forward time, and neither one uploading nothing nor one uploading through a kernel did
(``docs/performance.md``, "Session 29").
vLLM's own runner reads its staged inputs the same way (unified addressing: a pinned buffer's
device address), never through a copy engine.

One program per segment. The segments are described in pinned memory too, three int64 words each
``(dst address, src address, words)``, so the kernel has one argument and compiles once::

    for (dst, src, n) in segments:  dst[0:n] = src[0:n]     (int32 words)

The programs run in any order, so no two segments' destinations may overlap (the routing's never
do: distinct request rows, one token map).

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


@triton.jit(do_not_specialize=["desc"])
def _gather(desc, BLOCK: tl.constexpr):
    seg = desc.to(tl.pointer_type(tl.int64)) + 3 * tl.program_id(0)  # this program's (dst, src, n)
    dst = tl.load(seg).to(tl.pointer_type(tl.int32))
    src = tl.load(seg + 1).to(tl.pointer_type(tl.int32))
    n = tl.load(seg + 2)
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)                          # [BLOCK]
        tl.store(dst + i, tl.load(src + i, mask=i < n), mask=i < n)


def launch(desc: int, segments: int) -> None:
    """Enqueue the copies of ``segments`` descriptors at device address ``desc`` on the current
    stream."""
    _gather[(segments,)](desc, BLOCK=BLOCK)


def launcher(desc: int, device: int) -> Callable[[int, int], None]:
    """Compile the kernel for CUDA device ``device`` (the current one) by one launch of the
    descriptors at ``desc`` (one segment), and return how to launch it from then on, as
    :func:`launch` is called: by the driver, or by Triton where the driver cannot, and for good
    once the driver has refused a launch (logged once)."""
    fast = driver_launch.launcher(_gather[(1,)](desc, BLOCK=BLOCK), (driver_launch.WORD,), device)
    if fast is None:
        return launch

    def launch_by_driver(desc: int, segments: int) -> None:
        nonlocal fast
        if fast is None or not fast(segments, desc):  # refused by the driver (logged): Triton's, from now on
            fast = None
            launch(desc, segments)

    return launch_by_driver


def reference(memory: np.ndarray, desc: np.ndarray) -> None:
    """The contract on one flat int32 array standing for the address space: descriptors
    ``[m, 3]`` of word offsets into ``memory``."""
    for dst, src, n in desc.tolist():
        memory[dst: dst + n] = memory[src: src + n]
