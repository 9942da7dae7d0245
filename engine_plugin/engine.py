"""One model runner's steering state: tables, registry, router and mailbox, glued to vLLM's steps.

vLLM calls (through :mod:`.hooks`):
  * ``Steerer.attach(runner)`` right after ``load_model`` — before profiling, compile and capture;
  * ``on_schedule(scheduler_output)`` at the top of ``execute_model`` — mailbox, arrivals, finishes;
  * ``on_batch(req_ids, num_tokens)`` after the runner has settled the step's batch.

Both add their time to ``counters.host_ns`` (``hotwire_engine_host_seconds`` in the control API's
metrics): hotwire's share of a host-bound engine's step, measured where it is paid.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import numpy as np
import torch

from hotwire.shared.mailbox import ANY_LAYER, EngineMailbox, Fingerprint

from . import startup
from .config import HotwireConfig
from .counters import Counters
from .registry import Registry
from .routing import Router
from .steering import SteeringTables, arm, decoder_layers
from .sync import MailboxSync, write_rows

log = logging.getLogger("vllm.hotwire")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _mailbox_path(cfg: HotwireConfig, vllm_config: Any) -> str | None:
    """This engine's mailbox, or None when runtime registration cannot be kept consistent.

    With tensor or pipeline parallelism every rank needs the same vectors at the same step, and a
    per-host mailbox read by each rank at its own step boundary cannot promise that: one rank
    steering a request that another does not would corrupt its output. Such engines steer with
    startup vectors only (identical on every rank). Data-parallel ranks are separate engines,
    each with its own mailbox.
    """
    par = vllm_config.parallel_config
    if par.tensor_parallel_size * par.pipeline_parallel_size > 1:
        log.warning("hotwire: tensor/pipeline parallel engine: runtime registration (mailbox) is off; "
                    "steering uses startup vectors (HOTWIRE_VECTORS), loaded alike on every rank")
        return None
    dp_rank = getattr(par, "data_parallel_rank", 0) if getattr(par, "data_parallel_size", 1) > 1 else 0
    return cfg.mailbox if dp_rank == 0 else f"{cfg.mailbox}.dp{dp_rank}"


StartupRow = tuple[int, str, int, np.ndarray]  # (slot, vector id, layer, float32 row)


class Steerer:
    def __init__(self, router: Router, sync: MailboxSync | None, counters: Counters):
        self.router, self.sync, self.counters = router, sync, counters

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
        armed_model = arm(found, armed, tables)
        counters, registry = Counters(), Registry(cfg.slots)
        router = Router(armed_model, registry, requests, counters)
        fp = Fingerprint(str(vllm_config.model_config.model), n_layers, hidden, _dtype_name(dtype))
        loaded = cls._load_startup(cfg, fp, armed, tables.bank, registry)
        sync = cls._open_mailbox(cfg, vllm_config, fp, armed, loaded, tables.bank, registry, counters)
        log.info("hotwire: armed %d/%d decoder layers of %s %s; tables %.1f MiB on %s "
                 "(%d slots, %d request rows, %d entries/layer); %d startup rows; mailbox %s",
                 len(armed), n_layers, type(model).__name__, armed, tables.nbytes / 2**20, runner.device,
                 cfg.slots, requests, cfg.entries, len(loaded), sync.box.path if sync else "off")
        if len(armed) > 4:
            log.info("hotwire: each armed layer adds one kernel launch per decode step (about 1.6 us on an "
                     "H200); set HOTWIRE_LAYERS to the layers you steer to pay only for those")
        return cls(router, sync, counters)

    @staticmethod
    def _load_startup(cfg: HotwireConfig, fp: Fingerprint, armed: list[int], bank: torch.Tensor,
                      registry: Registry) -> list[StartupRow]:
        """Load ``HOTWIRE_VECTORS`` into the first slots: ``[(slot, id, layer, row)]``."""
        if not cfg.vectors_dir:
            return []
        rows: list[StartupRow] = []
        for vector_id, vec in startup.load_dir(cfg.vectors_dir, fp.shape):
            wanted = [(ANY_LAYER, vec[0])] if len(vec) == 1 else [(i, vec[i]) for i in armed]
            if len(rows) + len(wanted) > cfg.slots:
                log.error("hotwire: no room for startup vector %r (%d slots)", vector_id, cfg.slots)
                continue
            rows += [(len(rows) + j, vector_id, layer, row) for j, (layer, row) in enumerate(wanted)]
        if rows:
            with torch.inference_mode():
                write_rows(bank, [r[0] for r in rows], np.stack([r[3] for r in rows]))
            for slot, vector_id, layer, row in rows:
                registry.bind(slot, vector_id, layer, gen=1, absmax=float(np.abs(row).max(initial=0.0)))
            log.info("hotwire: startup vectors %s", sorted({r[1] for r in rows}))
        return rows

    @staticmethod
    def _open_mailbox(cfg: HotwireConfig, vllm_config: Any, fp: Fingerprint, armed: list[int],
                      loaded: list[StartupRow], bank: torch.Tensor, registry: Registry,
                      counters: Counters) -> MailboxSync | None:
        path = _mailbox_path(cfg, vllm_config) if cfg.mailbox else None
        if path is None:
            return None
        try:
            box = EngineMailbox.create(path, fp, cfg.slots, group=cfg.mailbox_gid())
        except (OSError, ValueError) as e:
            log.error("hotwire: cannot create mailbox %s (%s); runtime registration is off", path, e)
            return None
        for slot, vector_id, layer, row in loaded:
            box.publish_startup(slot, vector_id, layer, row)
        box.set_armed(armed)  # last: the control API writes nothing before it sees armed layers
        counters.mailbox = box
        sync = MailboxSync(box, bank, registry, counters)
        sync.start()
        return sync

    # -- per step -------------------------------------------------------------------------------
    def on_schedule(self, scheduler_output: Any) -> None:
        """Mailbox changes, then finished and new requests (vLLM has not touched its batch yet)."""
        t = time.perf_counter_ns()
        new = scheduler_output.scheduled_new_reqs
        finished = scheduler_output.finished_req_ids
        if self.sync is None:
            self._admit(new, finished)
        else:
            with self.sync.lock:
                if not self.sync.paused:
                    self.sync.apply()
                self._admit(new, finished)
                self.sync.publish_changed_refs()
        self.counters.host_ns += time.perf_counter_ns() - t

    def capturing(self):
        """Context for CUDA-graph capture: no bank writes from any thread meanwhile."""
        return self.sync.pause() if self.sync is not None else contextlib.nullcontext()

    def _admit(self, new: list, finished: set) -> None:
        if not (new or finished):
            return
        self.router.finish(finished)
        for req in new:
            sp = req.sampling_params
            prompt_len = len(req.prompt_token_ids) if req.prompt_token_ids is not None else 0
            self.router.admit(req.req_id, sp.extra_args if sp is not None else None, prompt_len)

    def on_batch(self, req_ids: list[str], num_tokens: np.ndarray) -> None:
        t = time.perf_counter_ns()
        self.router.route(req_ids, num_tokens)
        self.counters.steps += 1
        self.counters.host_ns += time.perf_counter_ns() - t

    def close(self) -> None:
        if self.sync is not None:
            self.sync.stop()

