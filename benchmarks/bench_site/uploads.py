"""Benchmark only: how hotwire's routing uploads reach the device, for the server kinds that set
``BENCH_UPLOADS`` (``server_kinds.py``); imported by ``sitecustomize.py`` at the start of each of
their processes.

* ``none``: nothing is uploaded (:meth:`.staging.HostRing.copy` returns at once). The device's
  tables stay as they were at start-up: no token is steered. With ``BENCH_OP_OFF=all`` beside
  ``hotwire_host_only``: what the uploads cost.
* ``copies``: each span is a copy by a copy engine (the driver's ``cuMemcpyAsync`` from the pinned
  buffer, on the current stream), as hotwire uploaded before session 29, instead of the upload
  kernel (:mod:`.upload_triton`); a copy expands nothing, so the V2 runner's token map is expanded
  on the host (:attr:`.staging.HostRing.expands` False). Beside ``hotwire``: what the kernel gains
  where the GPU is busy.
"""

import ctypes
import os

import torch

from hotwire.engine_plugin import driver_launch, staging

how = os.environ.get("BENCH_UPLOADS")

if how == "none":
    staging.HostRing.copy = lambda self, spans, expansion=None: None
elif how == "copies":
    _memcpy = driver_launch.libcuda().cuMemcpyAsync
    _memcpy.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
    _copy = staging.HostRing.copy

    def copy(self, spans, expansion=None):
        if self._desc is None:
            return _copy(self, spans, expansion)
        assert expansion is None, "a copy engine expands nothing (HostRing.expands is False)"
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        src = self._host[self._i].data_ptr()
        for start, stop, dst, at in spans:
            rc = _memcpy(dst.address + 4 * at, src + 4 * start, 4 * (stop - start), stream)
            assert rc == 0, f"cuMemcpyAsync: CUresult {rc}"

    staging.HostRing.copy = copy
    staging.HostRing.expands = property(lambda self: False)
elif how:
    raise ValueError(f"BENCH_UPLOADS={how!r}: none or copies")
