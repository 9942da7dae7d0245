"""Neuronpedia vectors: a feature record as Neuronpedia's API returns it and its exports hold it.

A record (the webapp's ``Neuron`` row) carries ``modelId``, ``layer`` (the source id, e.g.
``20-neuronpedia-resid-pre``), ``index``, ``vector`` (the values), ``vectorLabel``, ``hookName``
and ``vectorDefaultSteerStrength``. Read from:

- a ``.json`` file: one record, a list of them, or the answer of ``POST /api/vector/get``
  (``{"vector": record}``, as the ``neuronpedia`` client reads it);
- a ``.jsonl`` or ``.jsonl.gz`` file: one record per line, as the exports
  (``v1/<model>/<source>/features/batch-N.jsonl.gz``) hold them.

Records without values (SAE features, whose direction lives in their SAE's weights: import those
with the SAE's own files) are passed over, and counted. ``--features`` picks records by
``index``.

``hookName`` is ``blocks.<L>.<hook type>``: the webapp's ``/api/vector/new`` builds it from
``layerNumber`` and ``hookType``, which is ``hook_resid_pre`` (the one type it takes; the
client also names ``hook_resid_post``). Layers map as :mod:`.sae_features` says: ``resid_pre``
L is hotwire ``layer: L - 1``. Neuronpedia steers by adding ``strength * vector`` at that hook
on every position (its inference server's ``SIMPLE_ADDITIVE`` method; ``normalize_steering``
off by default), so a record's default strength becomes a preset named after the vector:
``{"id", "layer", "scale": vectorDefaultSteerStrength}``. The label goes into the metadata.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .result import (ImportedVector, ImportResult, as_vector, checked_preset, scale_of,
                     vector_id)
from .sae_features import hook_layer, name_of

SUFFIXES = (".json", ".jsonl", ".jsonl.gz")
URL = "https://www.neuronpedia.org"


def is_neuronpedia(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIXES)


def import_records(path: Path, *, n_layers: int | None, id_prefix: str,
                   features: Sequence[int] | None, sae_name: str | None) -> ImportResult:
    """The file's records that carry a vector (those ``features`` picks, when given)."""
    result, without = ImportResult(), 0
    wanted = None if features is None else {str(f) for f in features}
    for where, record in _records(path):
        if isinstance(record, ValueError):
            result.problems.append(str(record))
            continue
        if not isinstance(record, dict):
            result.problems.append(f"{where}: a record must be a JSON object")
            continue
        if wanted is not None and str(record.get("index")) not in wanted:
            continue
        if not record.get("vector"):
            without += 1
            continue
        try:
            result.vectors.append(_vector(record, where, path, n_layers, id_prefix, sae_name))
        except ValueError as e:
            result.problems.append(str(e))
    if without:
        result.problems.append(f"{path}: {without} record(s) have no vector values (SAE features "
                               "keep their direction in their SAE's weights: import the SAE's own "
                               "files with --features)")
    return result


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for every record in the file; a line of a ``.jsonl`` file that is not
    JSON comes as a :class:`ValueError` in place of its record."""
    try:
        if path.name.endswith(".json"):
            value = json.loads(path.read_text(), parse_constant=_no_constant)
            if isinstance(value, dict) and isinstance(value.get("vector"), dict):
                value = value["vector"]  # POST /api/vector/get's answer
            for i, record in enumerate(value if isinstance(value, list) else [value]):
                yield (f"{path}[{i}]" if isinstance(value, list) else str(path)), record
            return
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as lines:
            for n, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        record = json.loads(line, parse_constant=_no_constant)
                    except ValueError as e:
                        record = ValueError(f"{path}:{n}: not JSON ({e})")
                    yield f"{path}:{n}", record
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:  # JSON, gzip and decoding errors
        raise ValueError(f"{path}: not Neuronpedia records ({e})") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _vector(record: dict[str, Any], where: str, path: Path, n_layers: int | None,
            id_prefix: str, sae_name: str | None) -> ImportedVector:
    hook = record.get("hookName")
    layer = hook_layer(hook, where, n_layers)
    values = record["vector"]
    if not isinstance(values, list) or not all(type(v) in (int, float) for v in values):
        raise ValueError(f"{where}: `vector` must be a list of numbers")
    source, index = str(record.get("layer") or "neuronpedia"), str(record.get("index", ""))
    vid = vector_id(f"{sae_name or name_of(source)}.{name_of(index)}", id_prefix, Path(where))
    label = record.get("vectorLabel") or _explanation(record)
    metadata = {"imported_from": "neuronpedia", "model": record.get("modelId"), "source": source,
                "index": index, "hook_name": hook, "layer": layer, "label": label,
                "default_steer_strength": record.get("vectorDefaultSteerStrength"),
                "url": f"{URL}/{record.get('modelId')}/{source}/{index}"}
    preset = None
    if record.get("vectorDefaultSteerStrength") is not None:
        strength = scale_of(record["vectorDefaultSteerStrength"], "vectorDefaultSteerStrength",
                            Path(where))
        preset = checked_preset(({"id": vid, "layer": layer, "scale": strength},),
                                f"Neuronpedia: {label or vid}, default strength {strength:g} at "
                                f"{hook}", Path(where))
    return ImportedVector(vid, as_vector(values, Path(where), None), None,
                          {k: v for k, v in metadata.items() if v is not None}, path, preset)


def _explanation(record: dict[str, Any]) -> str | None:
    """The first auto-interp explanation's text, where a feature record carries them."""
    explanations = record.get("explanations")
    if isinstance(explanations, list) and explanations and isinstance(explanations[0], dict):
        text = explanations[0].get("description")
        return text if isinstance(text, str) else None
    return None
