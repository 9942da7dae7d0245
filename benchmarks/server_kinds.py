"""The servers a served benchmark can start by name (``--servers`` of ``serve_throughput.py`` and
``profile_serve.py``): what each one runs, and the :class:`serving.Server` that runs it.

Most differ from ``hotwire`` in one setting, so that a ratio between two of them measures that
setting: how many layers are armed, the second set of CUDA graphs, the plugin loaded with nothing
armed, a load that steers nothing, specs refused at admission, steering without the op on the GPU, a
compile of its own for a plugin-free server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from bench_site import step_phases
from serving import Server


class Kind(NamedTuple):
    """What a server runs: hotwire loaded and armed (``plugin``: it steers, keeps a mailbox and
    publishes counters), ``--enforce-eager``, the original hotwire-vllm instead, and the settings
    it adds (:data:`STEERED` and :data:`OWN_DIR` in a value are filled in when the server is made)."""

    plugin: bool
    eager: bool = False
    original: bool = False
    env: dict[str, str] | None = None
    steers: bool = True  # its load carries the run's specs (False: the same requests, none steered)
    refused: bool = False  # its load's specs name vectors it does not hold: parsed, salted, refused
    foreign: bool = False  # its load's specs travel under an extra_args key hotwire never reads
    gpu_steers: bool = True  # the op runs on the GPU wherever hotwire runs it (False: bench_site/op_off.py)


STEERED = "<steered layers>"  # the layers the benchmark's requests steer, known once the model is built
FOREIGN_KEY = "hotwire_bench_unread"  # an extra_args key no plugin reads
OWN_DIR = "<own folder>"  # a folder of the server's own in the run's work folder
BENCH_SITE = str(step_phases.BENCH_SITE)  # a sitecustomize: the op off the GPU somewhere, step phases

KINDS = {
    "plugin_free": Kind(False),
    "hotwire": Kind(True),
    "hotwire_2": Kind(True, env={"HOTWIRE_LAYERS": STEERED}),  # armed only on the steered layers
    "hotwire_one_graph": Kind(True, env={"HOTWIRE_IDLE_GRAPHS": "0"}),  # one graph set, the op in each
    # the op's kernels in the graphs of steered steps switched to the steered layers (engine_plugin/graph_switch.py)
    "hotwire_switched": Kind(True, env={"HOTWIRE_GRAPH_SWITCH": "1"}),
    "hotwire_again": Kind(True),  # hotwire's own B/B control: where its cores are, what it costs
    # hotwire as it is, sent the same requests with no spec: what the plugin costs while nobody steers
    "hotwire_unsteered": Kind(True, steers=False),
    # the same armed on fewer layers (the two the benchmark steers; the first 14): beside
    # hotwire_unsteered and plugin-free, what each armed layer costs while nobody steers
    "hotwire_unsteered_2": Kind(True, env={"HOTWIRE_LAYERS": STEERED}, steers=False),
    "hotwire_unsteered_14": Kind(True, env={"HOTWIRE_LAYERS": "0-13"}, steers=False),
    # the same with one graph set: every step replays the graphs with the op, nothing is routed; beside
    # hotwire_unsteered, what replaying the op's graphs costs; beside hotwire, what steering's host work costs
    "hotwire_one_graph_unsteered": Kind(True, env={"HOTWIRE_IDLE_GRAPHS": "0"}, steers=False),
    # hotwire sent the same specs naming vectors it does not hold: each is parsed and salted on the
    # engine core's input thread and refused at admission (counted, logged), then runs unsteered;
    # beside hotwire_unsteered and hotwire, what a spec's arrival costs apart from routing and the op
    "hotwire_refused": Kind(True, refused=True),
    # hotwire_refused without hotwire's API-server middleware (bench_site/frontend_off.py): beside
    # hotwire_refused, what the middleware's parse and admission decision per request cost
    "hotwire_refused_no_frontend": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_FRONTEND": "off"},
                                        refused=True),
    # hotwire sent the same spec texts under another extra_args key (FOREIGN_KEY): each request
    # carries the same dict through vLLM, which hotwire neither parses, salts nor admits; beside
    # hotwire_unsteered and hotwire_refused, what the dict costs apart from hotwire's own work on it
    "hotwire_foreign_spec": Kind(True, foreign=True),
    # hotwire steering on the host as deployed (admission, routing, uploads) while every step replays
    # the graphs without the op (bench_site/op_off.py): beside hotwire, what the op costs on the
    # GPU; beside plugin-free, what steering's host work costs
    "hotwire_host_only": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_OP_OFF": "all"}, gpu_steers=False),
    # hotwire_host_only uploading nothing (bench_site/uploads.py): beside it, what the routing's uploads cost
    "hotwire_no_uploads": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_OP_OFF": "all", "BENCH_UPLOADS": "none"},
                               gpu_steers=False),
    # hotwire whose routing uploads are the copy engine's copies, as before session 29, not the upload
    # kernel (bench_site/uploads.py): beside hotwire, what the kernel gains where the GPU is busy
    "hotwire_copy_uploads": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_UPLOADS": "copies"}),
    # hotwire whose steps run without a CUDA graph launch no op (bench_site/op_off.py): beside
    # hotwire, what the op's launches from Python cost there
    "hotwire_graphs_only": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_OP_OFF": "eager"}, gpu_steers=False),
    # hotwire whose op calls all go through torch's dispatcher, as before steer_op._call_past_the_dispatcher
    # (bench_site/op_off.py): beside hotwire, what going past it gains
    "hotwire_dispatched": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_OP_OFF": "dispatch"}),
    # hotwire whose op kernel Triton launches every time, as before session 32, never the CUDA driver
    # (bench_site/op_off.py): beside hotwire, what the driver's launch gains in steps run without a graph
    "hotwire_triton_launch": Kind(True, env={"PYTHONPATH": BENCH_SITE, "BENCH_OP_OFF": "triton_launch"}),
    # hotwire loaded with no layer armed: its API-server middleware, its request and config patches,
    # and nothing that steers (no tables, no op, no routing, no mailbox)
    "hotwire_unarmed": Kind(False, env={"VLLM_PLUGINS": "hotwire", "HOTWIRE_LAYERS": ""}),
    "eager": Kind(True, eager=True),
    "original": Kind(False, original=True),
    "plugin_free_2": Kind(False),  # the A/A control: the method's own null
    # plugin-free again, compiled on its own: vLLM keys its compile cache on the configuration's hash
    # (which two plugin-free servers share and hotwire's salt changes), inductor and Triton theirs on
    # the graph and the kernel; with caches of its own this server never reads what another compiled
    "plugin_free_own_compile": Kind(False, env={"VLLM_CACHE_ROOT": f"{OWN_DIR}/vllm",
                                                "TORCHINDUCTOR_CACHE_DIR": f"{OWN_DIR}/inductor",
                                                "TRITON_CACHE_DIR": f"{OWN_DIR}/triton"}),
}


def load_of(name: str, make: dict) -> dict:
    """The load-generator arguments (``serving.bodies``) for server ``name``: the run's, without specs
    for a kind that does not steer, naming unknown vectors for one that refuses them, under a key
    hotwire does not read for a foreign one."""
    kind = KINDS[name]
    if not kind.steers:
        return {**make, "fraction": 0.0}
    if kind.foreign:
        return {**make, "spec_key": FOREIGN_KEY}
    return {**make, "unknown_ids": True} if kind.refused else make


def refusing(name: str) -> str | None:
    """The reason server ``name`` refuses its load's specs for (``serving.check_steering``), or None."""
    return "unknown_id" if KINDS[name].refused else None


def make_server(name: str, work: Path, model: Path, engine: dict, steered: str, cpus: list[int] | None,
                original: dict[str, str] | None = None, gpu: str | None = None) -> Server:
    """The server of kind ``name`` (``steered``: the steered layers as ``HOTWIRE_LAYERS`` writes
    them; ``original``: the original's environment, for ``original``; ``gpu``: the one GPU it sees (a
    ``CUDA_VISIBLE_DEVICES`` entry), else every GPU this process sees)."""
    kind = KINDS[name]
    # in nvidia-smi's order (PCI bus), which its readings of the GPU (gpu_busy.py) are indexed by
    device = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if kind.original:
        return Server(name, work, model, engine, plugin=False, vectors=work / "vectors-pt", cpus=cpus,
                      env={**(original or {}), **device})
    own = str(work / f"{name}-own")
    env = {**{k: v.replace(STEERED, steered).replace(OWN_DIR, own) for k, v in (kind.env or {}).items()}, **device}
    if "PYTHONPATH" in env and os.environ.get("PYTHONPATH"):  # in front of this run's
        env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
    return Server(name, work, model, {**engine, "enforce_eager": True} if kind.eager else engine, plugin=kind.plugin,
                  vectors=work / "vectors", cpus=cpus, env=env)
