"""What a switched-off op kernel costs inside a CUDA graph: GPU time per replay, not kernel sums.

Why: ``kernel_time.py`` (session 36, H200, Qwen3 0.6B shape) found that with
``HOTWIRE_GRAPH_SWITCH=1`` the op's kernels of the layers nobody steers are gone (55 -> 6 µs a
step), but the fused add + RMS-norm kernel that follows each switched-off node grew by 1.3-2 µs a
launch (+37-57 µs a step), even in a graph whose op nodes were all off: the sum of kernel
durations then says the switch gains nothing. A sum of durations cannot tell a kernel that works
longer from one whose start is timed earlier while it waits on its predecessor; the time the GPU
takes to replay the graph can. This captures a layer stack shaped like a decode step (per layer
``out = x @ W``, the op on ``out``, then a compiled ``h += out; x = rms_norm(h)``), and times
replays with CUDA events, round-robin, for:

* ``no_op``: the stack captured without the op (the graphs ``idle_graphs`` captures);
* ``op_on``: with the op, every node on (a steered step without the switch);
* ``op_off``: the same graph, every op node switched off (``graph_switch``; no layer live);
* ``op_2``: the same graph, two layers' nodes on (what a steered step of the benchmarks runs).

For each it also sums kernel durations (``torch.profiler``) over the same replays, so both
measures stand side by side. Tokens are routed to no request: the op's kernel reads its rows and
writes nothing, as on a layer no token steers.

    python benchmarks/disabled_nodes.py --out benchmarks/results/disabled-nodes.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from hotwire.engine_plugin import graph_switch, steer_op
from kernel_time import device_kernels

CONFIGS = ("no_op", "op_on", "op_off", "op_2")


@torch.compile(dynamic=False)
def add_norm(h: torch.Tensor, out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[T, H] residual updated in place by ``out``; returns the next layer's input, [T, H]."""
    h.add_(out)
    return F.rms_norm(h, (h.shape[-1],), w, 1e-6)


def stack(layers: int, tokens: int, hidden: int) -> tuple[Callable[[bool], None], steer_op.StepState]:
    """A forward of ``layers`` layers on [tokens, hidden] bf16 and the step state of its op."""
    dev, bf16 = "cuda", torch.bfloat16
    step = steer_op.StepState(None, layers)
    bank = torch.randn(2, hidden, device=dev, dtype=bf16)
    route = torch.zeros(2, layers, 4, 8, dtype=torch.int32, device=dev)  # [R+1, A, K, 8]: no entries
    tok_row = torch.zeros(tokens, dtype=torch.int32, device=dev)  # every token on the null row
    anchors = [torch.nn.Parameter(torch.empty(1, device=dev)) for _ in range(layers)]
    armed = [steer_op.ArmedLayer(bank, route[:, pos], tok_row, step, pos) for pos in range(layers)]
    for anchor, layer in zip(anchors, armed):
        steer_op.bind(anchor, layer)
    ws = [torch.randn(hidden, hidden, device=dev, dtype=bf16) / hidden**0.5 for _ in range(layers)]
    norm_w = torch.ones(hidden, device=dev, dtype=bf16)
    h = torch.randn(tokens, hidden, device=dev, dtype=bf16)
    x = F.rms_norm(h, (hidden,), norm_w)
    pos_ = torch.arange(tokens, device=dev)

    def forward(with_op: bool) -> None:
        y = x
        for i in range(layers):
            out = y @ ws[i]  # [T, H]
            if with_op:
                torch.ops.hotwire.steer_(out, None, pos_, anchors[i])
            y = add_norm(h, out, norm_w)

    forward.layers = armed  # the op's binding is weak: the layers live as long as the forward
    return forward, step


def capture(forward, with_op: bool) -> torch.cuda.CUDAGraph:
    with torch.inference_mode():  # compile and warm up outside the capture, in the capture's mode
        for _ in range(3):
            forward(with_op)
    torch.cuda.synchronize()
    with graph_switch.capturing() if with_op else contextlib.nullcontext(), torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(with_op)
    return graph


def time_replays(graph, n: int) -> float:
    """µs per replay, CUDA events around ``n`` back-to-back replays."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def kernel_sums(graph, n: int) -> dict[str, float]:
    """µs per replay of each kernel name, summed from the profiler's device activity."""

    def replays():
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()

    sums = {name: us / n for name, (us, _) in device_kernels(replays).items()
            if not name.startswith(("Memcpy", "Memset"))}
    if not sums:
        raise SystemExit("the profile holds no device kernels (CUPTI off?)")
    return sums


def measure(layers: int, tokens: int, hidden: int, rounds: int, replays: int) -> dict:
    graph_switch.want(True)
    forward, step = stack(layers, tokens, hidden)
    plain, switched = capture(forward, False), capture(forward, True)
    assert type(switched).__name__ == "SwitchedGraph", "the op's nodes were not found"
    live = {"no_op": (), "op_on": tuple(range(layers)), "op_off": (), "op_2": (layers // 3, 2 * layers // 3)}
    graphs = {"no_op": plain, "op_on": switched, "op_off": switched, "op_2": switched}

    def ready(c):
        step.route_layers(live[c])
        graphs[c].replay()  # brings the nodes in line with the live set
        torch.cuda.synchronize()

    us: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(rounds):
        for c in CONFIGS if r % 2 == 0 else reversed(CONFIGS):
            ready(c)
            us[c].append(time_replays(graphs[c], replays))
    kernels = {}
    for c in CONFIGS:
        ready(c)
        kernels[c] = kernel_sums(graphs[c], 50)
    med = {c: statistics.median(v) for c, v in us.items()}
    base = kernels["no_op"]
    top = {c: sorted(((n, round(kernels[c].get(n, 0) - base.get(n, 0), 2)) for n in base.keys() | kernels[c].keys()),
                     key=lambda t: -abs(t[1]))[:4] for c in CONFIGS[1:]}
    return {"layers": layers, "tokens": tokens, "hidden": hidden,
            "replay_us": {c: round(v, 2) for c, v in med.items()},
            "replay_spread": {c: round((max(v) - min(v)) / med[c], 4) for c, v in us.items()},
            "replay_over_no_op": {c: round(med[c] / med["no_op"], 4) for c in CONFIGS},
            "kernel_sum_us": {c: round(sum(k.values()), 2) for c, k in kernels.items()},
            "kernel_delta_vs_no_op": top}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[28, 36])
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rows = []
    for layers in a.layers:
        for tokens in a.tokens:
            row = measure(layers, tokens, a.hidden, a.rounds, a.replays)
            print(json.dumps(row), flush=True)
            rows.append(row)
    a.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                 "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
