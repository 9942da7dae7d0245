"""Vectors loaded at engine start from ``HOTWIRE_VECTORS``: a directory or a ``.gguf`` file.

A directory holds ``<id>.safetensors`` (one tensor), ``<id>.pt`` (a tensor, read with
``torch.load(weights_only=True)``; nothing else is unpickled) or ``<id>.gguf`` (a control
vector) files, each ``(hidden,)`` or ``(n_layers, hidden)``; it may be a brainscope export or a
hidden-directions dictionary (a ``manifest.json``), and ``HOTWIRE_VECTORS`` may name one GGUF
control vector file (llama.cpp, repeng). :mod:`hotwire.shared.importers` reads them all, in
hotwire's layer numbering. A bad file is logged by name and skipped; the engine still starts.

The engine keeps vectors only: a preset a file implies (a brainscope passport, a recommended
layer, a GGUF's layers) is logged as the spec to use, since presets live in the control API's
catalog (``hotwire vectors import`` creates both there).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from hotwire.shared.importers import VectorImportError, import_path
from hotwire.shared.wire import ModelShape, check_vector

log = logging.getLogger("vllm.hotwire")


def load_dir(source: str, model: ModelShape) -> list[tuple[str, np.ndarray]]:
    """``[(id, float32 [1 or n_layers, hidden])]`` for every good vector at ``source`` (a
    directory or a ``.gguf`` file), sorted by id."""
    try:
        result = import_path(Path(source), n_layers=model.n_layers)
    except VectorImportError as e:
        log.error("hotwire: HOTWIRE_VECTORS=%s: %s; no startup vectors", source, e)
        return []
    for problem in result.problems:
        log.error("hotwire: skipping %s", problem)
    out = []
    for vector in result.vectors:
        try:
            out.append((vector.id, check_vector(vector.tensor, model)))
        except ValueError as e:  # another model's hidden size, or values the dtype cannot hold
            log.error("hotwire: skipping %s: %s", vector.source, e)
            continue
        if vector.preset is not None:
            log.info("hotwire: startup vector %r comes with a preset (%s): steer with %s",
                     vector.id, vector.preset.description, json.dumps(list(vector.preset.entries)))
    return sorted(out, key=lambda item: item[0])
