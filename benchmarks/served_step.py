"""hotwire's host work per served step, as a one-GPU engine does it, without vLLM.

Why: ``host_overhead.py`` times each path alone, hot, and served steps cost 3-5 times that (session
33: the core's hook 74 µs a step served at 256 in flight, its parts a few µs each on their own),
because a served step finds hotwire's code and data evicted by ~20 ms of vLLM's own work. This
replays the load ``serve_throughput.py`` sends (C requests in flight, half of them steered with a
spec of their own: two adds on layers n/3 and 2n/3; ``max_tokens`` uniform in 64-192; a finished
request replaced at once, its 128-token prompt in one step) through the real hooks: the engine
core's ``CoreSync.on_schedule`` (its counters mirrored into a mailbox file, as served), the rank's
``Steerer.on_schedule`` and ``Steerer.on_batch`` (routing, and its upload on CUDA), or with
``--runner v2`` ``Steerer.on_states`` (the V2 runner's batch by request state rows, taken and freed
as vLLM 0.25.1 does, decodes first; on CUDA the token map expanded by the upload kernel), and reports each one's median µs over steady steps (no request
came or went) and changed ones, with the caches evicted before each step (``cold``: a 32 MiB
array written) or not (``warm``), and with each spec resolved as its request arrived
(``ahead``, :mod:`hotwire.engine_plugin.arrival`, done before the step as vLLM's input thread does
it while the step thread waits) or at its step (``at_step``).

    python benchmarks/served_step.py --out benchmarks/results/served-step.json [--runner v2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from hotwire.engine_plugin import salts
from hotwire.engine_plugin.admission import Admission
from hotwire.engine_plugin.core_sync import CoreSync
from hotwire.engine_plugin.counters import Counters
from hotwire.engine_plugin.delta import PendingDelta
from hotwire.engine_plugin.engine import Steerer
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.routing import Router
from hotwire.engine_plugin.state_rows import StateBatch
from hotwire.engine_plugin.steering import ArmedModel, SteeringTables
from hotwire.engine_plugin.stream_bound import StreamBudget
from hotwire.shared.mailbox import ANY_LAYER, EngineMailbox, Fingerprint

LAYERS, HIDDEN, PROMPT = 28, 1024, 128  # Qwen3 0.6B shape
HOOKS = ("core", "rank_schedule", "rank_batch")


class RunnerStates:
    """The V2 runner's request state rows as vLLM 0.25.1 keeps them: freed by finished requests,
    then taken by new ones from the last freed; its batch with decodes first, and on CUDA that
    batch's state rows and token starts as device tensors (made before the timed hook, as vLLM's
    ``prepare_inputs`` makes them; kept while the upload kernel may still read them)."""

    def __init__(self, rows: int, device: torch.device):
        self.free, self.index, self.device = list(range(rows)), {}, device
        self._kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def batch(self, finished: set[str], batch: list[SimpleNamespace], prompt: int) -> StateBatch:
        for req_id in finished:
            self.free.append(self.index.pop(req_id))
        for r in batch:
            if r.new:
                self.index[r.req_id] = self.free.pop()
        order = sorted(batch, key=lambda r: r.new)  # decodes (one token) first, as V2 sorts by token count
        states = np.fromiter((self.index[r.req_id] for r in order), np.int32, len(order))
        counts = np.fromiter((prompt if r.new else 1 for r in order), np.int32, len(order))
        if self.device.type != "cuda":
            return StateBatch(states, counts, int(counts.sum()), 0, 0)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        self._kept = [*self._kept[-7:], (torch.from_numpy(states).to(self.device), torch.from_numpy(starts).to(self.device))]
        return StateBatch(states, counts, int(counts.sum()), self._kept[-1][0].data_ptr(), self._kept[-1][1].data_ptr())


def run(concurrency: int, steps: int, cold: bool, ahead: bool, device: torch.device, seed: int = 0,
        runner: str = "v1") -> dict:
    """Median µs of each hook over steady and changed steps, after a warm-up of 200 steps."""
    c = concurrency
    tables = SteeringTables(slots=1024, hidden=HIDDEN, armed=LAYERS, requests=2 * c, entries=4, max_tokens=8192,
                            dtype=torch.bfloat16, device=device)
    registry = Registry(1024)
    for s in range(c):
        registry.bind(s, f"v{s}", ANY_LAYER, gen=1, absmax=1.0, norm=1.0)
    counters = Counters()
    mailbox_dir = tempfile.TemporaryDirectory()  # as served: the engine counters mirrored into a mailbox
    counters.mailbox = EngineMailbox.create(f"{mailbox_dir.name}/engine.mbx",
                                            Fingerprint("served-step", LAYERS, HIDDEN, "bfloat16"), 1024)
    admission = Admission(registry, armed=range(LAYERS), entries=4, requests=2 * c,
                          budget=StreamBudget.of(torch.bfloat16), counters=counters)
    core = CoreSync(None, PendingDelta(HIDDEN, torch.bfloat16), registry, admission, counters)
    states = RunnerStates(c, device) if runner == "v2" else None
    rank = Steerer(Router(ArmedModel(tables, tuple(range(LAYERS))), states=c if states else None), tables, counters)
    rng, numbers = random.Random(seed), itertools.count(1)

    def arrive() -> SimpleNamespace:
        """A request as vLLM's input thread makes it: every other one steered, salted, resolved ahead."""
        n, extra = next(numbers), None
        if n % 2:
            extra = {"hotwire": json.dumps([
                {"id": f"v{n % c}", "layer": LAYERS // 3, "scale": 1.0 + n / 7},
                {"id": f"v{(n + 1) % c}", "layer": 2 * LAYERS // 3, "scale": -0.5 - n / 11}])}
            salts.request_salt(SimpleNamespace(extra_args=extra), PROMPT)
            if ahead:
                core.prepare(extra, PROMPT)
        return SimpleNamespace(req_id=f"cmpl-{n}-0", sampling_params=SimpleNamespace(extra_args=extra),
                               prompt_token_ids=range(PROMPT), left=rng.randint(64, 192), new=True)

    batch = [arrive() for _ in range(c)]
    junk = np.zeros(32 * 2**20, np.uint8)
    times: dict[str, list[tuple[float, float, float]]] = {"steady": [], "changed": []}
    finished: set[str] = set()
    for step in range(steps + 200):
        arrivals = [r for r in batch if r.new]
        out = SimpleNamespace(finished_req_ids=finished, scheduled_new_reqs=arrivals)
        ids = [r.req_id for r in batch]
        prompt = PROMPT if step else 1  # the first step admits all C: one token each, within vLLM's budget
        counts = np.fromiter((prompt if r.new else 1 for r in batch), np.int32, len(batch))
        by_state = states.batch(finished, batch, prompt) if states is not None else None
        if cold:
            junk += 1
        t0 = time.perf_counter_ns()
        core.on_schedule(out)
        t1 = time.perf_counter_ns()
        rank.on_schedule(out)
        t2 = time.perf_counter_ns()
        if by_state is None:
            rank.on_batch(ids, counts)
        else:
            rank.on_states(by_state, states.index)
        t3 = time.perf_counter_ns()
        if step >= 200:
            times["changed" if arrivals or finished else "steady"].append(
                ((t1 - t0) / 1e3, (t2 - t1) / 1e3, (t3 - t2) / 1e3))
        for r in batch:
            r.left, r.new = r.left - 1, False
        finished = {r.req_id for r in batch if r.left <= 0}
        batch = [r for r in batch if r.left > 0]
        batch += [arrive() for _ in finished]
    if device.type == "cuda":
        torch.cuda.synchronize()
    mailbox_dir.cleanup()
    return {kind: {"steps": len(t), **{h: round(statistics.median(x[i] for x in t), 1) for i, h in enumerate(HOOKS)},
                   "all": round(statistics.median(sum(x) for x in t), 1)}
            for kind, t in times.items() if t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--runner", choices=("v1", "v2"), default="v1",
                    help="route as with the V1 runner (by request id) or the V2 runner (by request state rows)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(1)  # host work runs on the engine's one scheduling thread
    results = {f"{'cold' if cold else 'warm'}_{'ahead' if ahead else 'at_step'}":
               run(args.concurrency, args.steps, cold, ahead, device, runner=args.runner)
               for cold in (True, False) for ahead in (False, True)}
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "runner": args.runner, "concurrency": args.concurrency, "layers": LAYERS, "steps": args.steps,
              "median_us": results, "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
