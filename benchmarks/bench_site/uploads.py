"""Benchmark only: how hotwire's routing uploads reach the device, for the server kinds that set
``BENCH_UPLOADS`` (``server_kinds.py``); imported by ``sitecustomize.py`` at the start of each of
their processes.

* ``none``: nothing is uploaded (:meth:`.staging.HostRing.copy` returns at once). The device's
  tables stay as they were at start-up: no token is steered. With ``BENCH_OP_OFF=all`` beside
  ``hotwire_host_only``: what the uploads cost.
* ``kernel``: each upload is a Triton kernel reading the pinned host buffer through its device
  view (unified addressing), as vLLM's own model runner reads its staged inputs, instead of a copy
  by the copy engine (the driver's ``cuMemcpyAsync``). Beside ``hotwire``: whether a step's copies
  by the copy engine are what it waits for.
"""

import os

import torch
import triton
import triton.language as tl

from hotwire.engine_plugin import staging

how = os.environ.get("BENCH_UPLOADS")


@triton.jit
def _copy_words(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n), mask=i < n)


def _device_view(host: torch.Tensor) -> torch.Tensor:
    from vllm.utils import torch_utils

    view = getattr(torch_utils, "get_accelerator_view_from_cpu_tensor", None) or torch_utils.get_cuda_view_from_cpu_tensor
    return view(host)


if how == "none":
    staging.HostRing.copy = lambda self, start, stop, dst, at: None
elif how == "kernel":
    _init, _copy = staging.HostRing.__init__, staging.HostRing.copy

    def __init__(self, words, depth, device):
        _init(self, words, depth, device)
        self._views = [_device_view(h) for h in self._host] if device.type == "cuda" else None

    def copy(self, start, stop, dst, at):
        if self._views is None:
            return _copy(self, start, stop, dst, at)
        n = stop - start
        _copy_words[(triton.cdiv(n, 1024),)](self._views[self._i][start:stop], dst.spans.get(at, at + n), n,
                                             BLOCK=1024)

    staging.HostRing.__init__, staging.HostRing.copy = __init__, copy
elif how:
    raise ValueError(f"BENCH_UPLOADS={how!r}: none or kernel")
