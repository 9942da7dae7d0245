"""One rank's steering state: tables and router, kept in step by the engine core's deltas.

vLLM calls (through :mod:`.hooks`):
  * ``Steerer.attach(runner)`` right after ``load_model`` — before profiling, compile and capture;
  * ``on_schedule(scheduler_output)`` at the top of ``execute_model`` — the engine core's
    decision for the step (:mod:`.step_decision`): its slot-table delta, then finished requests
    and the ones the core admitted;
  * ``on_batch(req_ids, num_tokens)`` after the runner has settled the step's batch, or
    ``on_states(batch, state_of)`` with the V2 runner, whose requests keep fixed state rows
    (:mod:`.state_rows`);
  * ``warming`` set while the worker compiles and warms up (``compile_or_warm_up_model``), whose
    kernel warm-up runs steps that bring requests before the engine core's sync has started.

A rank never reads the mailbox nor parses a spec: every change and admission arrives with the
step it belongs to, so all ranks of a TP/PP engine change at the same step (invariant 9), and
bank rows are written only on the runner's thread, never during CUDA-graph capture. Both hooks add their time to the process's
``host_ns`` counter and their own (``hotwire_engine_host_seconds`` and
``hotwire_engine_hook_host_seconds`` in the control API's metrics when the rank shares the engine
core's process, the one-GPU layout), and to ``host_ns_changed`` in steps in which requests arrived
or left, or the batch's requests changed (:meth:`Steerer.on_batch`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from . import graph_switch, idle_graphs
from .config import HotwireConfig
from .counters import Counters, process_counters
from .gate_report import GateReport
from .routing import Router
from .state_rows import StateBatch
from .steering import SteeringTables, anchors, arm, decoder_layers

log = logging.getLogger("vllm.hotwire")


def _state_rows(runner: Any) -> int | None:
    """How many request state rows the runner keeps (the V2 runner's ``RequestState``), None for a
    runner without fixed ones (V1 moves its requests to fill holes)."""
    req_states = getattr(runner, "req_states", None)
    rows = getattr(req_states, "max_num_reqs", None)
    return rows if isinstance(rows, int) and isinstance(getattr(req_states, "req_id_to_index", None), dict) else None


def _steps_in_flight(vllm_config: Any) -> int:
    """How many steps vLLM may have queued on the device at once (async scheduling: 2; pipeline
    parallel: one per stage, plus one with the V2 runner), where the routing uploads of the
    oldest must still be readable (:class:`.staging.HostRing`)."""
    pp = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1))
    return max(2, pp + 1, int(getattr(vllm_config, "max_concurrent_batches", 0)))


class Steerer:
    def __init__(self, router: Router, tables: SteeringTables, counters: Counters):
        self.router, self.tables, self.counters = router, tables, counters
        self._heard_core = False
        self._changed = False  # requests arrived or left at this step
        self._step_ns = 0  # this rank's on_schedule time at this step
        self.warming = False  # vLLM's warm-up steps are running: no decision is due from the core

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def attach(cls, runner: Any) -> "Steerer | None":
        cfg = HotwireConfig.from_env()
        vllm_config = runner.vllm_config
        text = vllm_config.model_config.hf_text_config
        n_layers, hidden = int(text.num_hidden_layers), int(text.hidden_size)
        dtype = vllm_config.model_config.dtype
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        found = decoder_layers(model)
        armed = [i for i in cfg.armed_layers(n_layers) if i in found]
        if not armed:
            log.warning("hotwire: found no decoder layers to arm in %s (HOTWIRE_LAYERS=%s; hotwire arms "
                        "*DecoderLayer modules whose forward takes vLLM's positions); serving without steering",
                        type(model).__name__, cfg.layers)
            return None
        paths = anchors(found, armed, torch.device(runner.device))
        if len(paths) < len(armed):
            log.warning("hotwire: decoder layers %s have no parameter of their own on %s to anchor the op to "
                        "(shared with another layer, or offloaded to host memory); they stay unarmed",
                        [i for i in armed if i not in paths], runner.device)
            armed = list(paths)
            if not armed:
                return None
        requests = 2 * int(vllm_config.scheduler_config.max_num_seqs)
        max_tokens = int(getattr(runner, "max_num_tokens", vllm_config.scheduler_config.max_num_batched_tokens))
        tables = SteeringTables(slots=cfg.slots, hidden=hidden, armed=len(armed), requests=requests,
                                entries=cfg.entries, max_tokens=max_tokens, dtype=dtype,
                                device=torch.device(runner.device))
        armed_model = arm(found, paths, tables, cfg.projecting_layers(n_layers))
        log.info("hotwire: armed %d/%d decoder layers of %s %s; tables %.1f MiB on %s "
                 "(%d slots, %d request rows, %d entries/layer)",
                 len(armed), n_layers, type(model).__name__, armed, tables.nbytes / 2**20, runner.device,
                 cfg.slots, requests, cfg.entries)
        idle_graphs.want(cfg.idle_graphs)
        graph_switch.want(cfg.graph_switch)
        if len(armed) > 4:
            steps = ("every step in which a request is steered" if cfg.idle_graphs else
                     "every decode step (HOTWIRE_IDLE_GRAPHS=0: idle ones too)")
            log.info("hotwire: each armed layer adds time to every step run without a full CUDA graph "
                     "(large or mixed prefill batches), steered or not, and one kernel launch to %s; at high "
                     "concurrency that costs served throughput (docs/performance.md): set HOTWIRE_LAYERS to "
                     "the layers you steer", steps)
        counters = process_counters()
        router = Router(armed_model, GateReport(tables.gate_counts, counters), depth=_steps_in_flight(vllm_config) + 1,
                        states=_state_rows(runner))
        if router.tables.route.is_cuda:
            log.info("hotwire: routing uploads: %s%s; batches routed by %s", router.uploads,
                     "" if router.direct else " (each lets the GIL go), not the upload kernel",
                     "request id" if router.states is None else "the runner's request state rows, each token's "
                     f"row expanded on the {'GPU' if router.expands else 'host'}")
        return cls(router, tables, counters)

    # -- per step -------------------------------------------------------------------------------
    def on_schedule(self, scheduler_output: Any) -> None:
        """The engine core's decision for the step: the slot rows into the bank, then finished and
        admitted requests (vLLM has not touched its batch yet)."""
        t = time.perf_counter_ns()
        decision = getattr(scheduler_output, "hotwire", None)
        if decision is not None:
            self._heard_core = True
            if decision.delta is not None:
                decision.delta.apply(None, self.tables.bank)
        elif not self._heard_core and not self.warming and scheduler_output.scheduled_new_reqs:
            # a served step that brings requests without a decision: the core has no hotwire.
            # (vLLM's runs before the core's sync starts bring none, or are warm-ups: the V2
            # runner profiles through execute_model with an empty scheduler output, and its
            # kernel warm-up sends requests of its own.)
            self._heard_core = True  # say it once
            log.error("hotwire: the engine core did not load hotwire (is it installed there, and "
                      "VLLM_PLUGINS not filtering it out?); this rank serves without steering")
        finished = scheduler_output.finished_req_ids
        if self.router.report is not None:
            self.router.report.poll()
        self._changed = bool(scheduler_output.scheduled_new_reqs or finished)
        if self._changed:
            self.router.finish(finished)
            for req_id, admitted in decision.admitted if decision is not None else ():
                self.router.admit(req_id, admitted)
            if self.router.states is not None:
                self.router.states.arrived([r.req_id for r in scheduler_output.scheduled_new_reqs])
        ns, c = time.perf_counter_ns() - t, self.counters
        self._step_ns = ns
        c.host_ns += ns
        c.host_ns_schedule += ns
        if self._changed:
            c.host_ns_changed += ns

    def on_batch(self, req_ids: list[str], num_tokens: np.ndarray) -> None:
        """Route the settled batch. A batch whose requests changed in a step the scheduler reported
        no arrival or finish counts as a changed step all the same: under async scheduling a
        request at its ``max_tokens`` leaves the batch a step before it is reported finished."""
        t = time.perf_counter_ns()
        self._routed(self.router.route(req_ids, num_tokens), t)

    def on_states(self, batch: StateBatch, state_of: dict[str, int]) -> None:
        """:meth:`on_batch` for the V2 runner: its batch by request state rows, and its
        ``req_id_to_index`` (:meth:`.routing.Router.route_states`)."""
        t = time.perf_counter_ns()
        self._routed(self.router.route_states(batch, state_of), t)

    def _routed(self, moved: bool, t: int) -> None:
        idle_graphs.select(not self.router.steering)
        ns, c = time.perf_counter_ns() - t, self.counters
        c.host_ns += ns
        c.host_ns_batch += ns
        if self._changed:
            c.host_ns_changed += ns
        elif moved:  # the step so far was counted steady: the core's hook and this rank's, then this
            c.steps_changed += 1
            c.host_ns_changed += c.core_step_ns + self._step_ns + ns

    def report_capture(self) -> None:
        """After vLLM's graph capture: what the graphs without the op cost, and in how many graphs
        the op's kernels are switched per step (once per capture)."""
        s = idle_graphs.STATS
        if s.graphs:
            log.info("hotwire: captured %d graphs without the op for idle steps in %.1f s, %.2f GiB "
                     "(vLLM's own: %.1f s, %.2f GiB)", s.graphs, s.seconds, s.bytes / 2**30, s.first_seconds,
                     s.first_bytes / 2**30)
        g = graph_switch.STATS
        if g.graphs or g.unswitched:
            log.info("hotwire: the op's kernels switched per step to the layers requests steer in %d captured "
                     "graphs (%d kernels)%s", g.graphs, g.nodes,
                     f"; {g.unswitched} launches whose graph node was not found run on every steered step"
                     if g.unswitched else "")
