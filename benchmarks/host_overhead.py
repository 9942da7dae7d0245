"""Host work hotwire adds per engine step, at batch 256 with 256 distinct steered requests.

Times the plugin's own host code paths with the real Router/Registry/tables (on CUDA when
available, else CPU), outside vLLM so nothing else is in the numbers:

* ``admit``        per arriving request: the engine core's input thread parses its spec (a text not
                   seen before) and makes its prefix-cache salt, the step thread resolves it, the
                   rank stages its routing row (once per request)
* ``admit_seen_spec`` the same for a spec text seen before (parsed once, then cached)
* ``commit``       per step with arrivals: one batched write of the staged rows
* ``route_steady`` per decode step of an unchanged batch (the common case: no copy at all)
* ``route_churn``  per step when the batch changed (one request swapped): rebuild + one upload
* ``idle``         per step with no steered request in flight
* ``upload_launch`` (CUDA) one launch of the routing's upload kernel as the routing makes it (by the
                   driver, ``engine_plugin/driver_launch.py``), moving nothing;
                   ``upload_launch_by_triton`` the same launch by Triton's own launcher
* ``op_*``         one call of the op on an armed layer in a step run without a CUDA graph (more
                   tokens than the largest capture size: inductor's code calls it once per armed
                   layer): ``op_idle_step`` in a step nobody steers, ``op_layer_not_live`` in a
                   steered step on a layer no request has an entry on (both return before any
                   launch: the dispatch alone), ``op_layer_live`` on a steered layer (the kernel's
                   launch too, by the driver on CUDA: ``engine_plugin/steer_triton.py``; 512
                   tokens); ``op_layer_live_by_triton`` (CUDA) the same by Triton's own launcher

Each is reported twice (medians): ``host_us``, until the call returns, which is what holds up the
engine's scheduling thread (device work is queued asynchronously), and ``with_device_us``, until
the device has finished it too (one ``synchronize``, about 10 us on the H200, included).

    python benchmarks/host_overhead.py --out benchmarks/results/host-overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from hotwire.engine_plugin import idle_graphs, salts, steer_op
from hotwire.engine_plugin.admission import Admission
from hotwire.engine_plugin.stream_bound import StreamBudget
from hotwire.engine_plugin.counters import Counters
from hotwire.engine_plugin.registry import Registry
from hotwire.engine_plugin.routing import Router
from hotwire.engine_plugin.steer_op import steer_
from hotwire.engine_plugin.steering import ArmedModel, SteeringTables
from hotwire.shared.mailbox import ANY_LAYER

BATCH, LAYERS, HIDDEN = 256, 36, 2560  # Qwen3 4B shape


def _timed(fn, repeat: int) -> tuple[float, float]:
    """Median microseconds of one call: until it returns (what holds up the engine's scheduling
    thread; the device's queue drained before each call) and until the device is done too."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    host, total = [], []
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e6)
        sync()
        total.append((time.perf_counter() - t) * 1e6)
    return statistics.median(host), statistics.median(total)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(1)  # host work runs on the engine's one scheduling thread
    tables = SteeringTables(slots=1024, hidden=HIDDEN, armed=LAYERS, requests=2 * BATCH, entries=4,
                            max_tokens=8192, dtype=torch.bfloat16, device=device)
    registry = Registry(1024)
    for s in range(BATCH):
        registry.bind(s, f"v{s}", ANY_LAYER, gen=1, absmax=1.0, norm=1.0)
    admission = Admission(registry, armed=range(LAYERS), entries=4, requests=2 * BATCH,
                          budget=StreamBudget.of(torch.bfloat16), counters=Counters())
    router = Router(ArmedModel(tables, tuple(range(LAYERS))))

    def admit(rid: str, extra: dict) -> None:
        """What a one-GPU engine does per arriving request: the engine core salts and admits, the
        rank stages."""
        salts.request_salt(SimpleNamespace(extra_args=extra), 32)
        router.finish((rid,))
        admission.finish((rid,))
        router.admit(rid, admission.admit(rid, extra, prompt_len=32))

    admit_repeat = max(5, args.repeat // 20)
    # every request of every repeat its own spec text: parsed texts are cached, and the figure is
    # for requests that each bring a new one
    specs = [[{"hotwire": json.dumps([{"id": f"v{j}", "layer": 12, "scale": 1.0 + j / BATCH + r},
                                      {"id": f"v{(j + 1) % BATCH}", "layer": 24, "scale": -0.5}])}
              for j in range(BATCH)] for r in range(admit_repeat + 1)]
    ids = [f"req-{j}" for j in range(BATCH)]
    ones = np.ones(BATCH, dtype=np.int32)
    fresh = iter(specs)

    def admit_all():
        for rid, extra in zip(ids, next(fresh)):
            admit(rid, extra)

    timings = {"admit_per_request": [t / BATCH for t in _timed(admit_all, admit_repeat)]}

    def admit_seen():
        for rid, extra in zip(ids, specs[0]):  # the first repeat's texts: parsed, in the cache
            admit(rid, extra)

    timings["admit_per_request_seen_spec"] = [t / BATCH for t in _timed(admit_seen, admit_repeat)]
    admit_all()
    k_words = router.tables.route.shape[2] * router.tables.route.shape[3]  # a layer's words in a request row
    staged = {1 + j: [(12 * k_words, array("i", (1 + j, 0, 2**31 - 1, 0, 1065353216, 0, 0, 0))),
                      (24 * k_words, array("i", (2 + j, 0, 2**31 - 1, 0, -1090519040, 0, 0, 0)))]
              for j in range(BATCH)}  # two adds, on layers 12 and 24
    timings["commit_256_arrivals"] = _timed(lambda: (router._staged.update(staged), router.commit()),
                                            max(5, args.repeat // 20))
    router.route(ids, ones)
    timings["route_steady"] = _timed(lambda: router.route(ids, ones), args.repeat)
    flip = [ids, ids[1:] + ids[:1]]  # same requests, another order: the map must be rebuilt
    state = {"i": 0}

    def churn():
        state["i"] ^= 1
        router.route(flip[state["i"]], ones)

    timings["route_churn"] = _timed(churn, args.repeat)
    router.finish(ids)
    admission.finish(ids)
    router.route(ids, ones)
    timings["idle"] = _timed(lambda: router.route(ids, ones), args.repeat)

    if device.type == "cuda":
        from hotwire.engine_plugin import staging, upload_triton

        desc = torch.zeros(upload_triton.HEADER + 3, dtype=torch.int64, pin_memory=True)
        desc[0] = 1  # one segment, of no words
        at = staging._device_address()(desc.data_ptr())
        launch = upload_triton.launcher(at, torch.cuda.current_device())
        timings["upload_launch"] = _timed(lambda: launch(at, 1), args.repeat)
        timings["upload_launch_by_triton"] = _timed(lambda: upload_triton.launch(at, 1), args.repeat)

    x = torch.zeros(512, HIDDEN, dtype=torch.bfloat16, device=device)  # a step's layer output
    positions = torch.arange(512, device=device)
    anchor = torch.nn.Parameter(torch.ones(HIDDEN, device=device), requires_grad=False)  # a norm's weight
    steer_op.bind(anchor, tables.layers[0])

    def op_call() -> None:
        steer_(x, None, positions, anchor)

    with torch.inference_mode():  # as vLLM's forward runs: the op's call skips the dispatcher there
        idle_graphs.select(True)
        timings["op_idle_step"] = _timed(op_call, args.repeat)
        idle_graphs.select(False)
        tables.step.route_layers([1])
        timings["op_layer_not_live"] = _timed(op_call, args.repeat)
        tables.step.route_layers([0])
        op_call()  # compiles the kernel on CUDA
        timings["op_layer_live"] = _timed(op_call, args.repeat)
        if device.type == "cuda":
            from hotwire.engine_plugin import steer_triton

            by_driver = dict(steer_triton._LAUNCHES)
            steer_triton._LAUNCHES.update(dict.fromkeys(by_driver))  # None: Triton launches each
            timings["op_layer_live_by_triton"] = _timed(op_call, args.repeat)
            steer_triton._LAUNCHES.update(by_driver)

    result = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "batch": BATCH, "layers": LAYERS, "entries_per_request": 2,
        "host_us": {k: round(h, 1) for k, (h, _) in timings.items()},
        "with_device_us": {k: round(d, 1) for k, (_, d) in timings.items()},
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
