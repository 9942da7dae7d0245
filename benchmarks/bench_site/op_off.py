"""Benchmark only: keeps the op off the GPU where hotwire would run it, for the server kinds that
set ``BENCH_OP_OFF`` (``server_kinds.py``: ``hotwire_host_only``, ``hotwire_graphs_only``,
``hotwire_dispatched``, ``hotwire_triton_launch``); imported by ``sitecustomize.py`` at the start of each of their processes.
``BENCH_OP_OFF`` says where the op stays off:

* ``all``: every step replays the graphs without the op and a step run without a graph launches
  none (``idle_graphs.select`` is always told "idle"), while the router still admits, stages and
  uploads as deployed. Beside ``hotwire``: what the op costs on the GPU; beside plugin-free: what
  steering's host work costs.
* ``eager``: steered steps replay the graphs with the op as deployed, but once vLLM has captured
  its graphs a step run without one (more tokens than the largest capture size) launches none.
  Beside ``hotwire``: what the op's launches from Python cost in those steps.
* ``dispatch``: the op runs as deployed, but every call goes through torch's dispatcher, as
  before ``steer_op._call_past_the_dispatcher``. Beside ``hotwire``: what going past it gains.
* ``triton_launch``: the op runs as deployed, but Triton launches its kernel every time, as
  before session 32, never the CUDA driver (``steer_triton.launch``). Beside ``hotwire``: what the
  driver's launch gains in steps run without a graph.
* ``graph``: the layers are armed (their class, their anchors bound) but their forward never
  calls the op, so the compiled graph has none. Beside ``hotwire``: what the op's place in the
  compiled graph costs, launches or not.
* ``bare_op``: as ``graph``, but the forward calls a bare in-place op on the layer's output
  (``hotwire_bench::touch_(Tensor(a!) x)``, which does nothing): an op node where hotwire's is,
  without the positions and the anchor. Beside ``graph`` and ``hotwire``: whether the op node
  itself or what flows into it costs.
* ``noop_impl``: hotwire's op in the graph with all its inputs, but every call returns at once,
  while vLLM captures graphs too (no Triton kernel is ever compiled or captured). Beside
  ``bare_op``: whether the op's inputs cost.
* ``no_launch``: hotwire's op as deployed, deciding per call whether to steer, but its Triton
  kernel is never launched, not even while vLLM captures graphs. Beside ``noop_impl`` and
  ``hotwire``: whether the op's Python or its kernel in the captured graphs costs.

Each setting salts vLLM's compile-cache key (``salts.compile_salt``): ``graph`` and ``bare_op``
trace other code than hotwire's, which a cache entry written by a deployed engine
would otherwise replace (session 27's first call measured two such engines as the armed one).
"""

import os

import torch

from hotwire.engine_plugin import engine, idle_graphs, salts, steer_op, steering

where = os.environ.get("BENCH_OP_OFF")
_salt = salts.compile_salt
salts.compile_salt = lambda vllm_config: f"{_salt(vllm_config)};bench_op_off={where}"
if where == "all":
    _select = idle_graphs.select
    idle_graphs.select = lambda idle: _select(True)
elif where == "graph":
    steering.steer = lambda layer, x, residual, positions: x
elif where == "bare_op":
    _LIB = torch.library.Library("hotwire_bench", "DEF")  # kept: the op lives as long as its library
    _LIB.define("touch_(Tensor(a!) x) -> ()")
    _LIB.impl("touch_", lambda x: None, "CompositeExplicitAutograd")
    torch.library.register_fake("hotwire_bench::touch_")(lambda x: None)
    _touch = torch.ops.hotwire_bench.touch_.default

    def _touched(layer, x, residual, positions):
        _touch(x)
        return x

    steering.steer = _touched
elif where == "noop_impl":
    steer_op._steering = lambda anchor: None
elif where == "no_launch":
    from hotwire.engine_plugin import steer_triton

    steer_triton.launch = lambda *args, **kwargs: None
elif where == "dispatch":
    steer_op.steer_._op = steer_op.steer_._op.__wrapped__
elif where == "triton_launch":
    from hotwire.engine_plugin import steer_triton

    class _NoDriver(dict):
        def get(self, key, default=None):
            return None  # no driver launch for any specialisation: Triton's, every call

    steer_triton._LAUNCHES = _NoDriver()
elif where == "eager":
    captured = False
    _report, _steering = engine.Steerer.report_capture, steer_op._steering

    def report_capture(self) -> None:
        global captured
        captured = True
        _report(self)

    engine.Steerer.report_capture = report_capture
    steer_op._steering = lambda anchor: None if captured else _steering(anchor)
