"""Which kernels does inductor generate differently with hotwire loaded?

Invariant 1 rests on the plugin leaving every generated kernel as it is without the plugin:
the steering op is opaque, so the only new kernel should be its own. This runs the batch of
``hotwire verify`` through a plugin-free and an armed engine (each in its own process, compiling
cold, with ``TORCH_LOGS=output_code``), collects the Triton kernels inductor wrote for each, and
reports the distinct kernels found in one engine only (names without inductor's numbering,
sources compared whole), with the counts of kernels compiled beside.

It also compares the Python that launches them: the lines of every compiled graph's ``call``
(inductor's wrapper code, which a step run without a CUDA graph executes on the host), with
buffer, argument, symbol and kernel numbering taken out, counted per engine. Besides the op's own
call on each armed layer (and the ``del`` lines that free its arguments), a line that one engine
runs more often than the other is host work the plugin added or removed
(``wrapper_lines_differing``; each engine's wrapper code in OUTDIR/wrapper-<engine>.py).

    python3 benchmarks/kernel_diff.py --model DIR [--dummy] [--engine-args JSON] --out OUTDIR

Writes OUTDIR/kernel_diff.json and, for each engine, the sources of its kernels the other lacks
(OUTDIR/only-<engine>.py); the engines' logs stay in a temporary directory (they are large).
Exit status 0 when both engines generated the same set of kernel sources, 1 when they differ.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from hotwire.tools.verify import probe_batch, probe_engine

# inductor's output code: async_compile.triton('triton_per_fused_add_mean_3', '''<source>''', ...)
_KERNEL = re.compile(r"async_compile\.triton\('(\w+)', '''(.*?)'''", re.S)
_LOG_PREFIX = re.compile(r"^.*?\[__output_code\] ?", re.M)  # "[rank0]:V1130 15:23:11.248 9494 graph.py:2552] "
# a compiled graph's wrapper: ``def call(self, args):`` (in inductor's Runner) up to its ``return``
_CALL = re.compile(r"^( *)def call\(self, args\):\n(.*?)^\1    return ", re.S | re.M)
_NAMES = re.compile(r"\b(buf|arg|s|u|ps|tmp)\d+(?:_\d+)?\b")  # buf12, arg3_1, s72: inductor's numbering
_KERNEL_NAMES = re.compile(r"\b((?:triton|cpp)_\w+?)_\d+\b")  # triton_poi_fused_add_3
_OWN = ("hotwire.steer_",)  # the op's call: one per armed layer, expected


def kernels(log: str) -> collections.Counter:
    """Kernel sources in an output-code log, with inductor's numbering taken out of the names."""
    found = collections.Counter()
    for name, src in _KERNEL.findall(_LOG_PREFIX.sub("", log)):
        base = re.sub(r"_\d+$", "", name)
        found[(base, src.replace(name, base))] += 1
    return found


def wrapper_lines(log: str) -> collections.Counter:
    """The lines of every compiled graph's ``call`` in an output-code log (comments and blank lines
    left out), numbering taken out, counted."""
    found = collections.Counter()
    for _, body in _CALL.findall(_LOG_PREFIX.sub("", log)):
        for line in body.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                found[_KERNEL_NAMES.sub(r"\1", _NAMES.sub(r"\1", line))] += 1
    return found


def differing(free: collections.Counter, armed: collections.Counter) -> list[dict]:
    """Wrapper lines run a different number of times by the two engines, most different first;
    left out: the op's own call, the ``del`` of an argument, and the unpacking of a graph's
    arguments (the op's tables are more of them)."""
    lines = [line for line in set(free) | set(armed)
             if free[line] != armed[line] and not any(o in line for o in _OWN)
             and not line.startswith("del ") and not line.endswith("= args")]
    return [{"line": line, "plugin_free": free[line], "hotwire": armed[line]}
            for line in sorted(lines, key=lambda l: (-abs(armed[l] - free[l]), l))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dummy", action="store_true", help="random weights (load_format=dummy)")
    p.add_argument("--engine-args", type=json.loads, default={})
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from transformers import AutoConfig

    batch = probe_batch(AutoConfig.from_pretrained(args.model).get_text_config().vocab_size, 8)
    engine = {**probe_engine(8, dummy=args.dummy, eager=False), **args.engine_args}
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="hotwire-kernel-diff-"))
    found, wrappers = {}, {}
    for name, plugin in (("plugin-free", False), ("hotwire", True)):
        work = tmp / name
        work.mkdir(exist_ok=True)
        (work / "job.json").write_text(json.dumps({"model": args.model, "engine": engine, "plugin": plugin,
                                                   "rounds": [batch]}))
        env = {**os.environ, "TORCH_LOGS": "output_code", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_CACHE_ROOT": str(work / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
               "HOTWIRE_MAILBOX": str(work / "engine.mbx")}
        with open(work / "engine.log", "w") as log:
            rc = subprocess.run([sys.executable, "-m", "hotwire.tools.jobs", str(work / "job.json"),
                                 str(work / "out.json")], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise SystemExit(f"kernel_diff: the {name} engine failed (exit {rc}); see {work / 'engine.log'}")
        log = (work / "engine.log").read_text()
        found[name], wrappers[name] = kernels(log), wrapper_lines(log)
        (args.out / f"wrapper-{name}.py").write_text("\n\n".join(body for _, body in
                                                                 _CALL.findall(_LOG_PREFIX.sub("", log))))
    free, armed = set(found["plugin-free"]), set(found["hotwire"])
    only = {"plugin_free_only": sorted(k for k, _ in free - armed), "hotwire_only": sorted(k for k, _ in armed - free)}
    for name, extra in (("plugin-free", free - armed), ("hotwire", armed - free)):
        (args.out / f"only-{name}.py").write_text("".join(f"# {k}\n{src}\n\n" for k, src in sorted(extra)))
    report = {"model": args.model, "engine": engine,
              "compiled": {k: sum(v.values()) for k, v in found.items()},
              "distinct": {k: len(v) for k, v in found.items()}, "same": free == armed, **only,
              "op_calls": sum(n for line, n in wrappers["hotwire"].items() if any(o in line for o in _OWN)),
              "wrapper_lines_differing": differing(wrappers["plugin-free"], wrappers["hotwire"])}
    (args.out / "kernel_diff.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if free == armed else 1


if __name__ == "__main__":
    sys.exit(main())
