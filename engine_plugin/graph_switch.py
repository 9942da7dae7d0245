"""The op's kernels inside captured CUDA graphs, switched off on the layers no request of the step
steers.

Why: a step run without a graph launches the op only on the layers the step's steered requests
have entries on (:class:`.steer_op.StepState` ``live``), but a captured graph replays one op
kernel per armed layer on every steered step: 36 kernels of 1.6-2.9 µs at the 8B shape with
every layer armed, 1.3 % of a decode step, where a request steers two layers
(``docs/performance.md``, "Decode: what the current op costs"). CUDA can switch a kernel node of
an instantiated graph off and on again (``cuGraphNodeSetEnabled``: a disabled node runs as an
empty one) without a recapture (invariant 4). A kernel on a layer no request steers writes
nothing, so switching it off changes no bit: the graph then runs what a graph-less step runs.

How the nodes are found: during hotwire's capture passes (:func:`capturing`), vLLM's
``torch.cuda.CUDAGraph()`` is a :class:`KeptGraph` (``keep_graph=True``: node handles must
outlive the capture). While one captures, the op launches on every armed layer, live or not (a
capture made while serving must hold them all; capturing runs nothing), and right after it
launches on a capturing stream (:func:`note`) the stream's capture state names the node just
added, which is kept with its layer once the driver confirms it is a kernel node running one of
the op's own compiled kernels (anything else stays on: an unknown node is never switched). At the capture's end a graph holding any such node
becomes a :class:`SwitchedGraph`, whose ``replay`` first brings its nodes in line with the live
layers of its engine's step state, and only when that set changed since its last replay (an
identity check on the frozenset: :meth:`.steer_op.StepState.route_layers` keeps it while
unchanged). A driver call that fails switches every node of that graph back on for good (said
once): the graph then runs as captured, as without this module.

Measured (``docs/performance.md``, "Session 36" and "Session 37"): correct (the GPU suite, V1 and
V2); replays timed with CUDA events (``benchmarks/disabled_nodes.py``, H100, 36 layers) say a
switched-off node still costs about 0.8 µs where a live op kernel with nothing to write costs about
1.8, so a steered step gains about 1 µs a layer nobody steers, and an idle step still wants graphs
without the op (:mod:`.idle_graphs`); served tokens/s at the 8B shape did not move. Hence off by
default.

Contract: :func:`want` turns it on (``HOTWIRE_GRAPH_SWITCH=1``); :func:`capturing` wraps one
capture pass of vLLM's (graphs captured outside one are untouched); :data:`recording` is true while
a kept graph captures, and the op then calls :func:`note` after each launch; :data:`STATS` says
what was found.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vllm.hotwire")

wanted = False  # a steerer in this process asked for switched graphs (HOTWIRE_GRAPH_SWITCH)
recording = False  # a KeptGraph is capturing: the op notes the node of each launch
_pending: dict[int, list[tuple[int, Any, int]]] = {}  # graph being captured -> [(node, step state, layer pos)]

_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
_KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL


def want(on: bool) -> None:
    global wanted
    wanted = on


@dataclass
class Stats:
    graphs: int = 0  # graphs captured holding op kernels hotwire switches
    nodes: int = 0  # op kernels found in them
    unswitched: int = 0  # op launches during capture whose node could not be confirmed (stay on)
    failed: int = 0  # graphs whose switching failed at replay (every node back on)


STATS = Stats()


class Driver:
    """The CUDA driver calls this module makes, with the GIL held; built once (:func:`driver`)."""

    def __init__(self, cuda: ctypes.PyDLL):
        p, u32, size = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
        self._info, self._edges = _capture_info(cuda)
        self._type = cuda.cuGraphNodeGetType
        self._type.argtypes = (p, ctypes.POINTER(ctypes.c_int))
        self._params = getattr(cuda, "cuGraphKernelNodeGetParams_v2", None) or cuda.cuGraphKernelNodeGetParams
        self._params.argtypes = (p, p)
        self.set_enabled = cuda.cuGraphNodeSetEnabled
        self.set_enabled.argtypes = (p, p, u32)
        self.set_enabled.restype = self._type.restype = self._params.restype = ctypes.c_int
        self._status, self._id, self._graph = ctypes.c_int(), ctypes.c_uint64(), p()
        self._deps, self._n, self._edge_data = ctypes.POINTER(p)(), size(), p()

    def last_node(self, stream: int) -> tuple[int, int] | None:
        """``(graph, node)``: the graph ``stream`` is capturing into and the one node its next work
        will depend on (the one just added); None when it is not capturing or depends on several."""
        args = [stream, ctypes.byref(self._status), ctypes.byref(self._id), ctypes.byref(self._graph),
                ctypes.byref(self._deps)]
        if self._edges:
            args.append(ctypes.byref(self._edge_data))
        if self._info(*args, ctypes.byref(self._n)) != 0 or self._status.value != _ACTIVE or self._n.value != 1:
            return None
        return self._graph.value, self._deps[0]

    def kernel_function(self, node: int) -> int | None:
        """The function a kernel node runs; None for another kind of node."""
        kind = ctypes.c_int(-1)
        if self._type(node, ctypes.byref(kind)) != 0 or kind.value != _KERNEL:
            return None
        params = (ctypes.c_uint64 * 16)()  # CUDA_KERNEL_NODE_PARAMS(_v2): the function is its first word
        return params[0] if self._params(node, params) == 0 else None


def _capture_info(cuda: ctypes.PyDLL) -> tuple[Any, bool]:
    """``cuStreamGetCaptureInfo`` with edge data (CUDA 12.3+) or without it, and which one: by its
    versioned name, else as the driver hands out CUDA 12.3's version of it."""
    p, ptr = ctypes.c_void_p, ctypes.POINTER
    common = (p, ptr(ctypes.c_int), ptr(ctypes.c_uint64), ptr(p), ptr(ptr(p)))
    with_edges = ctypes.PYFUNCTYPE(ctypes.c_int, *common, p, ptr(ctypes.c_size_t))
    fn = getattr(cuda, "cuStreamGetCaptureInfo_v3", None)
    if fn is not None:
        fn.argtypes, fn.restype = (*common, p, ptr(ctypes.c_size_t)), ctypes.c_int
        return fn, True
    fn = getattr(cuda, "cuStreamGetCaptureInfo_v2", None)
    if fn is not None:
        fn.argtypes, fn.restype = (*common, ptr(ctypes.c_size_t)), ctypes.c_int
        return fn, False
    address, status = p(), ctypes.c_int()
    get = cuda.cuGetProcAddress_v2  # (symbol, pfn, cudaVersion, flags, symbolStatus)
    get.argtypes, get.restype = (ctypes.c_char_p, ptr(p), ctypes.c_int, ctypes.c_uint64, ptr(ctypes.c_int)), ctypes.c_int
    if get(b"cuStreamGetCaptureInfo", ctypes.byref(address), 12030, 0, ctypes.byref(status)) != 0 or not address.value:
        raise AttributeError("cuStreamGetCaptureInfo")
    return with_edges(address.value), True


@functools.cache
def driver() -> Driver | None:
    """The driver calls, or None where they cannot be had (said once in the log)."""
    from .driver_launch import libcuda

    try:
        return Driver(libcuda())
    except (OSError, AttributeError) as e:
        log.info("hotwire: the op's kernels stay on in every captured graph (the CUDA driver: %s)", e)
        return None


def note(layer: Any, device: int) -> None:
    """The op just launched ``layer``'s kernel (an :class:`.steer_op.ArmedLayer`) on the current
    stream of ``device`` while a kept graph captures: keep the node with the layer."""
    from .steer_triton import kernel_functions
    import torch

    d = driver()
    try:  # never fail a capture: a node not found stays on
        found = None if d is None or layer.step is None else d.last_node(torch._C._cuda_getCurrentRawStream(device))
        function = None if found is None else d.kernel_function(found[1])
        if function and function in kernel_functions():
            graph, node = found
            _pending.setdefault(graph, []).append((node, layer.step, layer.pos))
            return
    except Exception:
        log.exception("hotwire: finding the op's node in a graph being captured failed")
    STATS.unswitched += 1


@functools.cache
def _kept_class() -> type | None:
    """The graph class of capture passes; None where this torch cannot make one (said once)."""
    import torch

    if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
        log.info("hotwire: the op's kernels stay on in every captured graph (this torch cannot hand out a "
                 "graph's executable: CUDAGraph.raw_cuda_graph_exec)")
        return None

    class KeptGraph(torch.cuda.CUDAGraph):
        """vLLM's ``torch.cuda.CUDAGraph()`` during a capture pass: kept, so the op's nodes can be
        switched; instantiated at the capture's end, as a graph not kept is."""

        def __new__(cls, keep_graph: bool = True):
            return super().__new__(cls, True)

        def __init__(self, keep_graph: bool = True):
            super().__init__(True)

        def capture_begin(self, *args, **kwargs):
            global recording
            super().capture_begin(*args, **kwargs)
            recording = True

        def capture_end(self):
            global recording
            try:
                super().capture_end()
            finally:
                recording = False
            try:
                graph = self.raw_cuda_graph()
            except RuntimeError:  # this torch did not keep it: instantiated and dropped as usual
                _pending.clear()
                return
            self.instantiate()
            found = _pending.pop(graph, None)  # only where driver() was had (note)
            if found:
                self.__class__ = SwitchedGraph
                self._switch = Switch(self.raw_cuda_graph_exec(), found, driver().set_enabled)
                STATS.graphs += 1
                STATS.nodes += len(self._switch.nodes)

    class SwitchedGraph(KeptGraph):
        """A kept graph holding op kernels: each replay first switches them to the live layers."""

        _switch: Switch

        def replay(self):
            switch = self._switch
            if switch.seen is not switch.step.live:
                switch.sync()
            super().replay()

    try:
        KeptGraph()
    except Exception as e:  # a torch whose graphs take keep_graph otherwise
        log.info("hotwire: the op's kernels stay on in every captured graph (torch cannot keep a graph: %s)", e)
        return None
    return KeptGraph


class Switch:
    """The op's nodes of one instantiated graph (``exec``), each with its layer's position in the
    tables of one engine's step state, and whether each is on; ``set_enabled(exec, node, on)`` is
    the driver's ``cuGraphNodeSetEnabled``."""

    def __init__(self, exec_: int, nodes: list[tuple[int, Any, int]], set_enabled: Callable[[int, int, int], int]):
        self.exec, self.set_enabled = exec_, set_enabled
        self.step = nodes[0][1]
        self.nodes = [(node, pos) for node, step, pos in nodes if step is self.step]
        self.on = [True] * len(self.nodes)  # as captured
        self.seen: frozenset[int] | None = None  # the live set the nodes match
        self.broken = False  # a driver call failed: every node on, for good

    def sync(self) -> None:
        """Each node on exactly where its layer is live; on a driver error every node back on, for
        good."""
        live = self.step.live
        if not self.broken:
            for i, (node, pos) in enumerate(self.nodes):
                on = pos in live
                if on != self.on[i]:
                    if self.set_enabled(self.exec, node, on) != 0:
                        self._fail()
                        break
                    self.on[i] = on
        self.seen = live

    def _fail(self) -> None:
        self.broken = True
        STATS.failed += 1
        ok = all([self.set_enabled(self.exec, node, 1) == 0 for node, _ in self.nodes])  # each tried
        self.on = [True] * len(self.nodes)
        if ok:
            log.warning("hotwire: switching the op's kernels in a captured graph failed; they run on every "
                        "steered step in that graph, as captured")
        else:
            log.error("hotwire: switching the op's kernels in a captured graph failed, and so did switching "
                      "them back on: requests steered in steps that replay that graph lose some of their steering")


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """vLLM's graphs made within are kept and switched (when :data:`wanted` and torch can keep a
    graph); ``torch.cuda.CUDAGraph`` is vLLM's own again afterwards, and captures still pending
    are dropped."""
    import torch

    original = torch.cuda.CUDAGraph
    kept = _kept_class() if wanted and driver() is not None else None
    if kept is None:
        yield
        return
    torch.cuda.CUDAGraph = kept
    try:
        yield
    finally:
        torch.cuda.CUDAGraph = original
        _pending.clear()

