"""One engine core and its ranks, joined as vLLM joins them, on CPU tables with a real mailbox.

:class:`CoreSync` is the only mailbox reader (its thread's period is :meth:`CoreSync.poll`,
run here before each step); each step's scheduler output goes through the core's
``on_schedule`` (which decides the step: :class:`~hotwire.engine_plugin.step_decision.StepDecision`)
and then to each rank's (:class:`Steerer`). ``Step`` carries the two fields of vLLM's
``SchedulerOutput`` that hotwire reads.
"""

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from hotwire.engine_plugin.admission import Admission
from hotwire.engine_plugin.core_sync import CoreSync
from hotwire.engine_plugin.counters import Counters
from hotwire.engine_plugin.delta import PendingDelta
from hotwire.engine_plugin.engine import Steerer
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.routing import Router
from hotwire.engine_plugin.steering import ArmedModel, SteeringTables
from hotwire.engine_plugin.stream_bound import StreamBudget
from hotwire.shared.mailbox import ControlMailbox, EngineMailbox, Fingerprint

H, SLOTS, REQUESTS, ENTRIES = 8, 6, 3, 2
ARMED = (1, 3)


@dataclass
class Step:
    """The two fields of vLLM's ``SchedulerOutput`` hotwire reads, plus what the core attaches."""

    scheduled_new_reqs: list = field(default_factory=list)
    finished_req_ids: set = field(default_factory=set)


def new_req(req_id: str, extra_args, prompt_len: int = 3):
    return SimpleNamespace(req_id=req_id, sampling_params=SimpleNamespace(extra_args=extra_args),
                           prompt_token_ids=list(range(prompt_len)))


def make_rank(device: str, armed=ARMED, states: int | None = None) -> Steerer:
    """A rank; with ``states`` routed by the V2 runner's request state rows (``Steerer.on_states``)."""
    tables = SteeringTables(slots=SLOTS, hidden=H, armed=len(armed), requests=REQUESTS, entries=ENTRIES,
                            max_tokens=64, dtype=torch.float32, device=torch.device(device))
    return Steerer(Router(ArmedModel(tables, armed), states=states), tables, Counters())


class Rig:
    def __init__(self, tmp_path, device: str = "cpu", states: int | None = None):
        box = EngineMailbox.create(str(tmp_path / "e.mbx"), Fingerprint("m", 4, H, "float32"), SLOTS)
        box.set_armed(list(ARMED), entries=ENTRIES)
        self.counters = Counters()
        self.counters.mailbox = box
        registry = Registry(SLOTS)
        admission = Admission(registry, armed=ARMED, entries=ENTRIES, requests=REQUESTS,
                              budget=StreamBudget.of(torch.float32), counters=self.counters)
        self.core = CoreSync(box, PendingDelta(H, torch.float32), registry, admission, self.counters)
        self.rank = make_rank(device, states=states)
        self.tables, self.router = self.rank.tables, self.rank.router
        self.control = ControlMailbox.attach(str(tmp_path / "e.mbx"))

    def step(self, new=(), finished=()) -> Step:
        """A period of the core's mailbox thread, then one engine step: the core decides, the
        rank follows."""
        out = Step([new_req(*r) for r in new], set(finished))
        self.core.poll()
        self.core.on_schedule(out)
        self.rank.on_schedule(out)
        return out

    def idle(self) -> None:
        """A period of the core's mailbox thread while no step runs, with its heartbeat (which
        writes the references and counters)."""
        self.core.poll(beat=True)

    @property
    def registry(self) -> Registry:
        """The slot bindings and references: the engine core's (ranks hold none)."""
        return self.core.registry

