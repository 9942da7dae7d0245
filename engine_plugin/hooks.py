"""Where hotwire meets vLLM: method wrappers on the model runners, applied at module import.

vLLM calls ``register()`` in every process, but only once per process tree when
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, possibly before the runner modules are imported. So the
patches are applied by a post-import hook the moment a target module is imported (or at once,
if it already is). Targets are found by capability — a class with the method — never by
vLLM version string.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import arrival, graph_switch, idle_graphs, salts, staging
from .core_sync import CoreSync
from .engine import Steerer
from .state_rows import StateBatch

log = logging.getLogger("vllm.hotwire")


def _steerer(runner: Any) -> Steerer | None:
    return runner.__dict__.get("_hotwire")


def _after_load(runner: Any, result: Any, args: tuple, kwargs: dict) -> None:
    if "_hotwire" not in runner.__dict__:
        runner._hotwire = Steerer.attach(runner)


def _before_execute(runner: Any, args: tuple, kwargs: dict) -> None:
    st = _steerer(runner)
    if st is not None:
        st.on_schedule(args[0] if args else kwargs["scheduler_output"])


def _after_v1_prepare(runner: Any, result: Any, args: tuple, kwargs: dict) -> None:
    """V1 runner (GPU and CPU): the batch order is ``input_batch.req_ids``, token counts
    come from the ``query_start_loc`` the runner just filled (differenced keeping the GIL: batches
    may pass 500 requests, ``staging.diff``)."""
    st = _steerer(runner)
    if st is not None:
        n = runner.input_batch.num_reqs
        st.on_batch(runner.input_batch.req_ids[:n], staging.diff(runner.query_start_loc.np[: n + 1]))


def _after_v2_prepare(runner: Any, batch: Any, args: tuple, kwargs: dict) -> None:
    """V2 runner: ``prepare_inputs`` returns the settled batch, its entries' request state rows on
    the host and the device (``idx_mapping``) and their token starts (``query_start_loc``)."""
    st = _steerer(runner)
    if st is None:
        return
    if st.router.states is not None:
        try:
            by_state = StateBatch(batch.idx_mapping_np, batch.num_scheduled_tokens, batch.num_tokens,
                                  batch.idx_mapping.data_ptr(), batch.query_start_loc.data_ptr())
        except AttributeError as e:  # a runner with state rows whose batch says less: by request id
            log.error("hotwire: %s's batch lacks what routing by state rows reads (%s); routing it by "
                      "request id from now on", type(runner).__name__, e)
            st.router.by_request_id()
        else:
            st.on_states(by_state, runner.req_states.req_id_to_index)
            return
    st.on_batch(batch.req_ids, batch.num_scheduled_tokens)


@contextlib.contextmanager
def _warming_up(worker: Any):
    """The worker's compile and warm-up (``compile_or_warm_up_model``): its steps are vLLM's own,
    run before the engine core's sync starts, and may bring requests (V2's kernel warm-up does)."""
    runner = getattr(worker, "model_runner", None)
    st = None if runner is None else _steerer(runner)
    if st is None:
        yield
        return
    before, st.warming = st.warming, True  # a subclass's warm-up may call its base class's
    try:
        yield
    finally:
        st.warming = before


def _patch_worker(cls: type) -> None:
    _wrap(cls, "compile_or_warm_up_model", around=_warming_up)


def _after_core_kv_init(core: Any, result: Any, args: tuple, kwargs: dict) -> None:
    """Every rank has loaded its model and sized its KV cache: start deciding the engine's steps.

    (vLLM loads general plugins at the top of ``EngineCore.__init__``, so a patch of ``__init__``
    itself would miss the first engine; the methods it calls later are looked up when called.)
    """
    if "_hotwire" in core.__dict__:
        return
    try:
        core._hotwire = CoreSync.start(core)
    except Exception:  # hotwire must never keep an engine from serving
        log.exception("hotwire: could not start the engine core's sync; serving without steering")
        core._hotwire = None


def _before_core_step(core: Any, args: tuple, kwargs: dict) -> None:
    """Route the scheduler's output through the sync (wrapped on the instance, once: the
    scheduler is made after the KV cache, and its class depends on the configuration)."""
    sync = core.__dict__.get("_hotwire")
    if sync is None or getattr(core.scheduler.schedule, "__hotwire__", False):
        return
    schedule = core.scheduler.schedule

    @functools.wraps(schedule)
    def scheduled(*a, **k):
        out = schedule(*a, **k)
        sync.on_schedule(out)
        return out

    scheduled.__hotwire__ = True
    core.scheduler.schedule = scheduled


def _graph_wrappers() -> list[Any]:
    """Every live ``CUDAGraphWrapper`` (vLLM keeps a weak set of them)."""
    module = sys.modules.get("vllm.compilation.cuda_graph")
    instances = getattr(getattr(module, "CUDAGraphWrapper", None), "_all_instances", None)
    return [] if instances is None else list(instances)


def _doubled(fn: Callable, *, holders: Callable[[Any], list[Any]], safe: Callable[[Any], bool],
             again: Callable[[inspect.BoundArguments], None] = lambda bound: None) -> Callable:
    """``fn``, one capture pass of vLLM's, with the op's kernels in its graphs switched per step
    (:mod:`.graph_switch`), then run a second time without the op (:mod:`.idle_graphs`); ``again``
    may change the second call's arguments."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        def first_pass():  # vLLM's own: its graphs hold the op, switched per step (.graph_switch)
            with graph_switch.capturing():
                return fn(self, *args, **kwargs)

        if not idle_graphs.wanted or not safe(self):
            return first_pass()
        bound = sig.bind(self, *args, **kwargs)
        again(bound)
        return idle_graphs.capture_twice(first_pass, lambda: fn(*bound.args, **bound.kwargs), lambda: holders(self))

    wrapper.__hotwire__ = True
    return wrapper


def _no_warmups(bound: inspect.BoundArguments) -> None:
    """The idle pass of a V1 capture skips the warm-up runs: the first pass made them."""
    if "num_warmups" in bound.signature.parameters:
        bound.arguments["num_warmups"] = 0


def _runner_doubling_safe(runner: Any) -> bool:
    why = idle_graphs.doubling_unsafe(runner)
    if why is not None and not runner.__dict__.get("_hotwire_said_unsafe"):
        runner._hotwire_said_unsafe = True
        log.info("hotwire: no graphs without the op for this engine (%s): idle steps keep one launch per "
                 "armed layer", why)
    return why is None


def _patch_v1_capture(cls: type) -> None:
    """V1 runner: each graph descriptor's capture, doubled; the totals logged after the capture."""
    fn = cls.__dict__.get("_warmup_and_capture")
    if fn is not None and not getattr(fn, "__hotwire__", False):
        cls._warmup_and_capture = _doubled(fn, holders=lambda runner: _graph_wrappers(),
                                           safe=_runner_doubling_safe, again=_no_warmups)
    _wrap(cls, "capture_model", after=_after_capture)


def _patch_v2_capture(module: ModuleType) -> None:
    """V2 runner: its graph manager's whole capture (FULL and PIECEWISE), doubled."""
    cls = getattr(module, "ModelCudaGraphManager", None)
    fn = None if cls is None else cls.__dict__.get("capture")
    if fn is not None and not getattr(fn, "__hotwire__", False):
        cls.capture = _doubled(fn, holders=lambda manager: [*_graph_wrappers(), manager],
                               safe=lambda manager: not getattr(manager, "use_breakable_cg", False))


def _after_capture(runner: Any, result: Any, args: tuple, kwargs: dict) -> None:
    st = _steerer(runner)
    if st is not None:
        st.report_capture()


def _patch_core(module: ModuleType) -> None:
    cls = module.EngineCore
    ok = _wrap(cls, "_initialize_kv_caches", after=_after_core_kv_init)
    ok &= _wrap(cls, "step", before=_before_core_step)
    _wrap(cls, "step_with_batch_queue", before=_before_core_step)
    if not ok:
        log.error("hotwire: %s.EngineCore lacks _initialize_kv_caches/step; steering is off",
                  module.__name__)


def _wrap(cls: type, name: str, *, before: Callable | None = None, after: Callable | None = None,
          around: Callable[[Any], contextlib.AbstractContextManager] | None = None) -> bool:
    """Wrap ``cls.name`` (defined on ``cls`` itself) once; False when the class has no such method."""
    fn = cls.__dict__.get(name)
    if fn is None or getattr(fn, "__hotwire__", False):
        return fn is not None

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if before is not None:
            before(self, args, kwargs)
        with around(self) if around is not None else contextlib.nullcontext():
            result = fn(self, *args, **kwargs)
        if after is not None:
            after(self, result, args, kwargs)
        return result

    wrapper.__hotwire__ = True
    setattr(cls, name, wrapper)
    return True


def _patch_runner(cls: type, prepare: str, after_prepare: Callable) -> None:
    """Arm a model runner class: tables after load, requests per step, routing once the batch
    is settled."""
    ok = (_wrap(cls, "load_model", after=_after_load)
          & _wrap(cls, "execute_model", before=_before_execute)
          & _wrap(cls, prepare, after=after_prepare))
    if not ok:
        log.error("hotwire: %s.%s lacks load_model/execute_model/%s; steering is off",
                  cls.__module__, cls.__name__, prepare)


def _patch_fastapi(module: ModuleType) -> None:
    """vLLM's OpenAI API server: its app gets hotwire's middleware (:mod:`.frontend`)."""
    from .frontend.install import patch_fastapi

    patch_fastapi(module)


def _patch_cpu(module: ModuleType) -> None:
    # Inherits execute_model/_prepare_inputs from the V1 runner; overrides load_model.
    _wrap(module.CPUModelRunner, "load_model", after=_after_load)


def _patch_standalone_cpu(module: ModuleType) -> None:
    # vLLM 0.34's runner for CPUs without Triton: V2's interface, on a class of its own
    _patch_runner(module.StandaloneCPUModelRunner, "prepare_inputs", _after_v2_prepare)


def _patch_gpu_worker(module: ModuleType) -> None:
    _patch_worker(module.Worker)


def _patch_cpu_worker(module: ModuleType) -> None:
    _patch_worker(module.CPUWorker)  # overrides compile_or_warm_up_model


def _patch_v1(module: ModuleType) -> None:
    _patch_runner(module.GPUModelRunner, "_prepare_inputs", _after_v1_prepare)
    _patch_v1_capture(module.GPUModelRunner)


def _patch_v2(module: ModuleType) -> None:
    _patch_runner(module.GPUModelRunner, "prepare_inputs", _after_v2_prepare)
    _wrap(module.GPUModelRunner, "capture_model", after=_after_capture)


TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "vllm.v1.worker.gpu_model_runner": _patch_v1,
    "vllm.v1.worker.gpu.model_runner": _patch_v2,
    "vllm.v1.worker.gpu.cudagraph_utils": _patch_v2_capture,
    "vllm.v1.worker.cpu_model_runner": _patch_cpu,
    "vllm.v1.worker.cpu.standalone_model_runner": _patch_standalone_cpu,
    "vllm.v1.worker.gpu_worker": _patch_gpu_worker,
    "vllm.v1.worker.cpu_worker": _patch_cpu_worker,
    "vllm.v1.engine.core": _patch_core,
    "vllm.v1.request": arrival.patch_request,
    "vllm.config.vllm": salts.patch_config_hash,
    "fastapi.applications": _patch_fastapi,
}


def _apply(patch: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Patch ``module``; a patch that fails (a vLLM whose code differs from what hotwire knows)
    is logged and skipped: it must not fail vLLM's import of its own module, nor vLLM's start."""
    try:
        patch(module)
    except Exception:
        log.exception("hotwire: could not patch %s for this vLLM (%s); the parts of hotwire that need it are off",
                      module.__name__, getattr(sys.modules.get("vllm"), "__version__", "version unknown"))


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the patch for that module."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]):
        self._inner, self._patch = inner, patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _apply(self._patch, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, name, path, target=None):
        if name not in TARGETS or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, TARGETS[name])
        return spec


def install() -> None:
    """Patch the target modules already imported, and the rest as they are imported."""
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())
    for name, patch in TARGETS.items():
        module = sys.modules.get(name)
        if module is not None:
            _apply(patch, module)
