"""One rank's steering state: tables and router, kept in step by the engine core's deltas.

vLLM calls (through :mod:`.hooks`):
  * ``Steerer.attach(runner)`` right after ``load_model`` — before profiling, compile and capture;
  * ``on_schedule(scheduler_output)`` at the top of ``execute_model`` — the step's slot-table
    delta from the engine core (:mod:`.core_sync`), then finished and new requests;
  * ``on_batch(req_ids, num_tokens)`` after the runner has settled the step's batch.

A rank never reads the mailbox: every change arrives with the step it belongs to, so all ranks
of a TP/PP engine change at the same step (invariant 9), and bank rows are written only on the
runner's thread, never during CUDA-graph capture. Both hooks add their time to the process's
``host_ns`` counter (``hotwire_engine_host_seconds`` in the control API's metrics when the rank
shares the engine core's process, the one-GPU layout).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from .admission import Admission, entry_limit, request_args
from .config import HotwireConfig
from .counters import Counters, process_counters
from .gate_report import GateReport
from .registry import Registry
from .routing import Router
from .steering import SteeringTables, arm, decoder_layers

log = logging.getLogger("vllm.hotwire")


class Steerer:
    def __init__(self, router: Router, tables: SteeringTables, counters: Counters):
        self.router, self.tables, self.counters = router, tables, counters
        self._heard_core = False

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
        requests = 2 * int(vllm_config.scheduler_config.max_num_seqs)
        max_tokens = int(getattr(runner, "max_num_tokens", vllm_config.scheduler_config.max_num_batched_tokens))
        tables = SteeringTables(slots=cfg.slots, hidden=hidden, armed=len(armed), requests=requests,
                                entries=cfg.entries, max_tokens=max_tokens, dtype=dtype,
                                device=torch.device(runner.device))
        projecting = cfg.projecting_layers(n_layers)  # the engine core's too: the same admissions
        armed_model = arm(found, armed, tables, projecting)
        # Armed layers of every stage arrive with the engine core's first delta; until then, ours.
        admission = Admission(Registry(cfg.slots), armed=armed, entries=cfg.entries, requests=requests,
                              limit=entry_limit(dtype), counters=None, projecting=projecting)
        log.info("hotwire: armed %d/%d decoder layers of %s %s; tables %.1f MiB on %s "
                 "(%d slots, %d request rows, %d entries/layer)",
                 len(armed), n_layers, type(model).__name__, armed, tables.nbytes / 2**20, runner.device,
                 cfg.slots, requests, cfg.entries)
        if len(armed) > 4:
            log.info("hotwire: each armed layer adds one kernel launch per decode step (about 1.6 us on an "
                     "H200); set HOTWIRE_LAYERS to the layers you steer to pay only for those")
        counters = process_counters()
        return cls(Router(armed_model, admission, GateReport(tables.gate_counts, counters)), tables, counters)

    # -- per step -------------------------------------------------------------------------------
    def on_schedule(self, scheduler_output: Any) -> None:
        """The step's delta, then finished and new requests (vLLM has not touched its batch yet)."""
        t = time.perf_counter_ns()
        if hasattr(scheduler_output, "hotwire"):
            self._heard_core = True
            delta = scheduler_output.hotwire
            if delta is not None:
                admission = self.router.admission
                if delta.armed is not None:
                    admission.armed = frozenset(delta.armed)
                delta.apply(admission.registry, self.tables.bank)
        elif not self._heard_core:
            self._heard_core = True  # say it once
            log.error("hotwire: the engine core did not load hotwire (is it installed there, and "
                      "VLLM_PLUGINS not filtering it out?); this rank serves without steering")
        new, finished = scheduler_output.scheduled_new_reqs, scheduler_output.finished_req_ids
        if self.router.report is not None:
            self.router.report.poll()
        if new or finished:
            self.router.finish(finished)
            for req in new:
                self.router.admit(*request_args(req))
        self.counters.host_ns += time.perf_counter_ns() - t

    def on_batch(self, req_ids: list[str], num_tokens: np.ndarray) -> None:
        t = time.perf_counter_ns()
        self.router.route(req_ids, num_tokens)
        self.counters.host_ns += time.perf_counter_ns() - t
