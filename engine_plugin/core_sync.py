"""The engine core's side of hotwire: the one place an engine reads its mailbox and decides.

vLLM's engine core schedules every step and sees every request, so the decision of what the
slot table holds at a step is taken here, once for all ranks (invariant 9).

A daemon thread reads the mailbox whenever it is written (:mod:`.file_watch`; every
:data:`POLL_S` where writes cannot be watched): it applies the consistent pending entries to a
:class:`.delta.PendingDelta` (acked at once: they take effect at the next step, and nothing is
admitted before it), keeps the versions the prefix-cache salt reads, writes the per-slot
references while a retirement waits on them (every :data:`POLL_S`), and keeps the heartbeat
(references, counters and step times, every :data:`HEARTBEAT_S`). At each ``Scheduler.schedule()``, on the engine's step thread:

1. apply the delta gathered so far to the registry;
2. run the step's finishes and arrivals through :class:`.admission.Admission`, which holds the
   per-slot references of the requests in flight: the thread publishes them before it acks a
   retirement, so the ack carries references that are exact (invariant 6);
3. send both to every rank with the step (:class:`.step_decision.StepDecision`, attribute
   ``hotwire`` of the ``SchedulerOutput``).

A steered request's spec is resolved once already as vLLM makes the request, on its input thread
(:meth:`CoreSync.prepare`, from :mod:`.arrival`), so that step 2 usually finds it resolved.

The step thread makes no system call: measured in a served engine on the H200, a ``pread`` of
the mailbox on every step and a ``pwrite`` on every step that changed the references made the
step thread give up the GIL to vLLM's output thread and wait to get it back, tens to hundreds of
microseconds a step (``docs/performance.md``). So that a request sent after an
upload's answer still sees the upload, the control API answers only once the applied generation
has reached it (``control_api.slots.rank.Rank.await_applied``). Nothing
read from the file is trusted (invariant 8): an entry the mailbox finds corrupt is rejected
(logged, counted, acked as holding nothing, its slot unbound); a file that becomes unreadable
(truncated, say) stops the sync with one error line and a counter, and the engine keeps serving
with the vectors it holds (restart it to restore registration). Startup vectors
(``HOTWIRE_VECTORS``) are read here too and reach the ranks in the first step's delta, so they
are needed on the engine core's node only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import numpy as np

from hotwire.shared.mailbox import (ACTIVE, ANY_LAYER, HEARTBEAT_S, EngineMailbox, Fingerprint,
                                    MailboxError, SlotEntry, dp_mailbox_path)

from . import arrival, salts, startup
from .admission import Admission, Admitted, request_args
from .config import HotwireConfig
from .counters import Counters, process_counters
from .delta import PendingDelta
from .file_watch import FileWatch
from .registry import Registry
from .step_decision import NOTHING, StepDecision
from .stream_bound import StreamBudget

log = logging.getLogger("vllm.hotwire")

POLL_S = 0.02  # the mailbox thread's period where it cannot wait for writes, or while a retirement waits


def armed_layers(worker: Any) -> list[int]:
    """The decoder layers hotwire armed on one rank (run on every worker by ``collective_rpc``)."""
    runner = getattr(worker, "model_runner", None)
    steerer = None if runner is None else runner.__dict__.get("_hotwire")
    return [] if steerer is None else list(steerer.router.armed.layers)


def mailbox_path(cfg: HotwireConfig, vllm_config: Any) -> str | None:
    """This engine's mailbox: one per engine core, so data-parallel rank N has ``<path>.dpN``.

    vLLM runs the DP ranks of a dense model as independent engines (each with
    ``data_parallel_size`` 1); ``data_parallel_index`` still says which rank it is.
    """
    if cfg.mailbox is None:
        return None
    par = vllm_config.parallel_config
    dp_rank = getattr(par, "data_parallel_index", None)
    if dp_rank is None:
        dp_rank = par.data_parallel_rank if getattr(par, "data_parallel_size", 1) > 1 else 0
    return dp_mailbox_path(cfg.mailbox, dp_rank)


class CoreSync:
    def __init__(self, box: EngineMailbox | None, pending: PendingDelta, registry: Registry,
                 admission: Admission, counters: Counters):
        self.box, self.pending, self.registry = box, pending, registry
        self.admission, self.counters = admission, counters
        self.lock = threading.Lock()
        self.broken: str | None = None if box is not None else "no mailbox"
        self._done = -1  # target generation fully applied; skip the scan while it is unchanged
        # vector versions as acked (the prefix-cache salt's, :mod:`.salts`): replaced, never changed
        self.versions: dict[str, str] = box.versions() if box is not None else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hotwire-mailbox", daemon=True)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def start(cls, core: Any) -> "CoreSync | None":
        """Attach to a constructed ``EngineCore`` (model loaded on every rank): None when no rank
        armed a layer (the model serves unsteered; the ranks said why)."""
        cfg = HotwireConfig.from_env()
        vllm_config = core.vllm_config
        armed = sorted(set().union(*core.model_executor.collective_rpc(armed_layers)))
        if not armed:
            return None
        text = vllm_config.model_config.hf_text_config
        dtype = vllm_config.model_config.dtype
        fp = Fingerprint(str(vllm_config.model_config.model), int(text.num_hidden_layers),
                         int(text.hidden_size), str(dtype).removeprefix("torch."))
        registry, counters = Registry(cfg.slots), process_counters()
        admission = Admission(registry, armed=armed, entries=cfg.entries,
                              requests=2 * int(vllm_config.scheduler_config.max_num_seqs),
                              budget=StreamBudget.of(dtype), counters=counters,
                              projecting=cfg.projecting_layers(int(text.num_hidden_layers)))
        pending = PendingDelta(fp.hidden, dtype)
        loaded = cls._load_startup(cfg, fp, armed, pending)
        box = cls._open_mailbox(cfg, vllm_config, fp, armed, loaded)
        counters.mailbox = box
        sync = cls(box, pending, registry, admission, counters)
        salts.use_versions(lambda: sync.versions)
        arrival.use_core(sync.prepare)
        if box is not None:
            sync._thread.start()
        par = vllm_config.parallel_config
        log.info("hotwire: engine core steers %d layers %s over TP=%d PP=%d; %d startup rows; mailbox %s",
                 len(armed), armed, par.tensor_parallel_size, par.pipeline_parallel_size, len(loaded),
                 box.path if box is not None else "off")
        return sync

    @staticmethod
    def _load_startup(cfg: HotwireConfig, fp: Fingerprint, armed: list[int],
                      pending: PendingDelta) -> list[tuple[int, str, int, np.ndarray]]:
        """``HOTWIRE_VECTORS`` into the first slots, queued for the first step: ``[(slot, id, layer, row)]``."""
        if not cfg.vectors_dir:
            return []
        rows: list[tuple[int, str, int, np.ndarray]] = []
        for vector_id, vec in startup.load_dir(cfg.vectors_dir, fp.shape):
            wanted = [(ANY_LAYER, vec[0])] if len(vec) == 1 else [(i, vec[i]) for i in armed]
            if len(rows) + len(wanted) > cfg.slots:
                log.error("hotwire: no room for startup vector %r (%d slots)", vector_id, cfg.slots)
                continue
            rows += [(len(rows) + j, vector_id, layer, row) for j, (layer, row) in enumerate(wanted)]
        for slot, vector_id, layer, row in rows:
            pending.bind(slot, vector_id, layer, 1, row)
        if rows:
            log.info("hotwire: startup vectors %s", sorted({r[1] for r in rows}))
        return rows

    @staticmethod
    def _open_mailbox(cfg: HotwireConfig, vllm_config: Any, fp: Fingerprint, armed: list[int],
                      loaded: list[tuple[int, str, int, np.ndarray]]) -> EngineMailbox | None:
        path = mailbox_path(cfg, vllm_config)
        if path is None:
            return None
        try:
            box = EngineMailbox.create(path, fp, cfg.slots, group=cfg.mailbox_gid())
            for slot, vector_id, layer, row in loaded:
                box.publish_startup(slot, vector_id, layer, row)
            # what the engine admits by, for the API server's strict mode; last: the control API
            # writes nothing before it sees armed layers
            box.set_armed(armed, entries=cfg.entries, projecting=cfg.projecting_layers(fp.n_layers))
        except (OSError, ValueError, MailboxError) as e:
            log.error("hotwire: cannot create mailbox %s (%s); runtime registration is off", path, e)
            return None
        return box

    # -- per step (the engine core's thread) ------------------------------------------------------
    def on_schedule(self, scheduler_output: Any) -> None:
        """Decide this step's slot table and admissions, and send them with the step."""
        t = time.perf_counter_ns()
        finished, new = scheduler_output.finished_req_ids, scheduler_output.scheduled_new_reqs
        # every step carries a decision: the ranks know the core decides. A steady step (no request
        # came or went, no change queued: a decode step between arrivals) has nothing to decide and
        # takes no lock; a change the mailbox thread queues meanwhile is taken at the next step, as
        # one queued just after the lock would be.
        scheduler_output.hotwire = self._decide(finished, new) if finished or new or self.pending else NOTHING
        ns, c = time.perf_counter_ns() - t, self.counters
        c.steps += 1
        c.core_step_ns = ns
        c.host_ns += ns
        c.host_ns_core += ns
        if finished or new:
            c.steps_changed += 1
            c.host_ns_changed += ns

    def _decide(self, finished: Any, new: Any) -> StepDecision:
        """The slot-binding change queued since the last step, applied; finished requests
        released; new ones admitted, in order."""
        with self.lock:
            delta = self.pending.take()
            if delta is not None:
                delta.apply(self.registry, None)
            self.admission.finish(finished)
            admitted = []
            for req in new:
                req_id, extra_args, prompt_len = request_args(req)
                result = self.admission.admit(req_id, extra_args, prompt_len)
                if isinstance(result, Admitted):
                    admitted.append((req_id, result))
        return StepDecision(delta, tuple(admitted))

    def prepare(self, extra_args: dict[str, Any], prompt_len: int) -> None:
        """A steered request's spec resolved as vLLM makes the request (:mod:`.arrival`: on the
        input thread, while the step thread waits on the model), for its step to find."""
        with self.lock:
            self.admission.prepare(extra_args, prompt_len)

    # -- the mailbox (its thread) -----------------------------------------------------------------
    def poll(self, beat: bool = False) -> None:
        """One period of the mailbox thread: the control API's writes taken in when the target
        generation moved; the per-slot references written while a retirement waits on them, and
        with the heartbeat (``beat``), which also writes the counters and a sign of life. No
        system call is made with :attr:`lock` held: the step thread never waits on one."""
        with self._guard() as usable:
            if not usable:
                return
            if self.box.target_gen() != self._done:
                self._apply_pending()
            elif beat or (self.registry.refs_changed and self.box.retiring):
                self.box.publish(None, *self._refs())
            if beat:
                self.counters.heartbeat_ns = time.thread_time_ns()
                self.counters.publish_step_time()
                self.box.beat()

    def _refs(self) -> tuple[np.ndarray, np.ndarray]:
        """A copy of the per-slot references ``(inflight, last_used_ns)`` as the steps left them."""
        with self.lock:
            return tuple(a.copy() for a in self.registry.refs_to_publish())  # type: ignore[return-value]

    def _apply_pending(self) -> None:
        """Queue every consistent pending entry for the next step, then write the references, the
        acks, and the applied generation, in that order. The references are copied and the
        changes queued under one hold of :attr:`lock`: a request admitted before it is in the
        references, one admitted after it sees a retired slot unbound, so an acked retirement
        carries exact references (invariant 6)."""
        target, entries, torn = self.box.pending()
        with self.lock:
            inflight, last_used = (a.copy() for a in self.registry.refs_to_publish())
            for e in entries:
                self._queue(e)
        for e in entries:
            if e.problem is not None:
                log.error("hotwire: mailbox %s: slot %d rejected: %s", self.box.path, e.slot, e.problem)
        self.box.publish(None, inflight, last_used)
        for e in entries:
            self.box.ack(e)
        if torn:
            self.counters.add("mailbox_torn_reads", torn)
        self.versions = self.box.versions()  # before the applied generation: what a request sent after it sees
        if not torn:
            self.box.publish(target, inflight, last_used)
            self._done = target

    def _queue(self, e: SlotEntry) -> None:
        if e.problem is not None:
            self.pending.unbind(e.slot)
            self.counters.add("mailbox_rejected")
        elif e.state == ACTIVE:
            self.pending.bind(e.slot, e.vector_id, e.layer, e.gen, e.row)
            self.counters.add("mailbox_rows_applied")
        else:
            self.pending.unbind(e.slot)

    @contextlib.contextmanager
    def _guard(self):
        """Run a mailbox access, unless the file is already known unusable; on an error, stop
        the sync for good and keep the engine serving."""
        if self.broken is not None:
            yield False
            return
        try:
            yield True
        except (MailboxError, OSError, ValueError) as e:
            self.broken = str(e)
            self.counters.add("mailbox_errors")
            log.error("hotwire: mailbox %s is unusable (%s); runtime registration stopped, the engine "
                      "keeps serving with the vectors it holds; restart it to restore registration",
                      self.box.path, e)

    def _beat(self) -> None:
        """The mailbox thread: a period whenever the file is written (:class:`.file_watch.FileWatch`),
        at each heartbeat, and every :data:`POLL_S` while a retirement waits on references; every
        :data:`POLL_S` where the file cannot be watched. Each wake-up takes the GIL from the step
        thread, so an idle mailbox costs a heartbeat's worth of them, not one per period."""
        watch = FileWatch.open(self.box.path)
        beat_at = 0.0
        try:
            while not self._stop.is_set() and self.broken is None:
                due = time.monotonic() >= beat_at
                if due:
                    beat_at = time.monotonic() + HEARTBEAT_S
                self.poll(beat=due)
                if watch is None:
                    self._stop.wait(POLL_S)
                    continue
                watch.drain()  # this period's own writes; a write before here moved the target:
                if not self._target_moved():
                    watch.wait(POLL_S if self.box.retiring else beat_at - time.monotonic())
        finally:
            if watch is not None:
                watch.close()

    def _target_moved(self) -> bool:
        """Has the control API written since the last period took its writes in (or can the file
        no longer be read: the next period says so)?"""
        with self._guard() as usable:
            return not usable or self.box.target_gen() != self._done
        return True  # the read failed: the sync has stopped

    def close(self) -> None:
        self._stop.set()
