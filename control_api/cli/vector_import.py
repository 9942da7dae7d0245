"""``hotwire vectors import PATH``: vectors in the formats people already have, through the API.

Reads ``PATH`` with :mod:`hotwire.shared.importers` (a brainscope export, a hidden-directions
dictionary, a GGUF control vector, a directory of vector files, the features ``--features`` picks
of an SAE: SAELens, Gemma Scope, Neuronpedia records), then uploads every vector (with its
source's metadata) and stores the preset each source implies, named after its vector.
``--layers`` and ``--scale`` put the operator's intent over the source's (a GGUF file names no
layer choice and its strength 1 is llama.cpp's, not a tuned value): every preset then steers
those layers at that scale, and ``--layers`` gives a preset to a vector whose source implies
none. All
of ``PATH`` is read and checked before anything is sent, as the control API would check it: a
bad item (a file, its manifest entry, its metadata) is named and skipped whole, vector and
preset, and the others are imported (exit 7 once they are); a source that cannot be read at
all, or has no good item, imports nothing. Uploads are in order, vectors first; a refused one
stops the import there with the server's error (what was sent before it stays).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from hotwire.shared.importers import ImportedVector, ImportResult, VectorImportError, import_path
from hotwire.shared.importers.result import checked_preset, layer_of

from ..layer_lists import format_layers
from .arguments import parse_features, parse_layers, parse_name, parse_scale
from .client import ControlApiError, ControlClient, add_client_options, client_command


def configure(actions: argparse._SubParsersAction) -> None:
    sub = actions.add_parser(
        "import", help="import vectors and their presets: a brainscope export, a "
                       "hidden-directions dictionary, a GGUF control vector, vector files, or "
                       "SAE features (SAELens, Gemma Scope, Neuronpedia)",
        description="Upload every vector at PATH and store the presets its format implies (a "
                    "brainscope passport, a hidden-directions recommended layer, a GGUF's "
                    "layers, a Neuronpedia default strength), each named after its vector. "
                    "Layer numbers and SAE hook points are mapped to vLLM's 0-based decoder "
                    "layers (see hotwire.shared.importers).")
    sub.add_argument("path", type=Path, help="a directory, a .gguf file, a Gemma Scope .npz, or "
                                             "Neuronpedia .json/.jsonl[.gz] records")
    sub.add_argument("--features", type=parse_features, metavar="I,J,...",
                     help="SAE features to import by index, e.g. 1234,5678 or 10-12; each "
                          "becomes vector <sae>.<index> (an SAE needs it; Neuronpedia records "
                          "are picked by index)")
    sub.add_argument("--sae-name", type=parse_name,
                     help="the <sae> of the feature ids (default: the SAE's folder name, a "
                          "record's source)")
    sub.add_argument("--id-prefix", default="",
                     help="put before every vector id and preset name, e.g. qwen3-4b.")
    sub.add_argument("--model-layers", type=int, metavar="N",
                     help="the model's decoder layers (GGUF needs it; default: the attached "
                          "engine's)")
    sub.add_argument("--layers", type=parse_layers, metavar="RANGES",
                     help="the layers every preset steers, e.g. 13-25 (default: the source's; a "
                          "GGUF file's are all it has directions for); a vector without a preset "
                          "gets one")
    sub.add_argument("--scale", type=parse_scale,
                     help="the scale every preset steers with (default: the source's; 1 for a "
                          "GGUF file, llama.cpp's strength)")
    sub.add_argument("--replace", action="store_true",
                     help="replace vectors (their pins are kept) and presets that exist")
    add_client_options(sub)
    sub.set_defaults(run=_import)


def read_source(path: Path, n_layers: int | None, id_prefix: str,
                features: list[int] | None = None, sae_name: str | None = None) -> ImportResult:
    """Every good item at ``path``, and the bad ones' problems; ``file_error`` when none is
    good (listing every problem)."""
    try:
        result = import_path(path, n_layers=n_layers, id_prefix=id_prefix, features=features,
                             sae_name=sae_name)
    except VectorImportError as e:
        raise ControlApiError(0, "file_error", str(e)) from None
    if not result.vectors and result.problems:
        raise ControlApiError(0, "file_error", f"nothing imported, {_listed(result.problems)}")
    if not result.vectors:
        raise ControlApiError(0, "file_error", f"{path}: no vectors found")
    return result


def choose(vector: ImportedVector, layers: list[int] | None, scale: float | None,
           n_layers: int | None) -> ImportedVector:
    """``vector`` with its preset steering ``layers`` at ``scale``, each where given (the rest of
    every entry as the source has it); a vector whose source implies no preset gets
    ``[{"id", "layer" | "layers", "scale"}]`` when ``layers`` is given. :class:`ValueError` for a
    layer the model lacks or the vector has no row for (a GGUF file's are those it names)."""
    if layers is None and (scale is None or vector.preset is None):
        return vector
    if layers is not None:
        chosen = sorted({layer_of(layer, "--layers", vector.source, n_layers) for layer in layers})
        rows = vector.layers if vector.layers is not None else (
            range(vector.tensor.shape[0]) if vector.tensor.ndim == 2 else None)
        missing = [layer for layer in chosen if rows is not None and layer not in rows]
        if missing:
            raise ValueError(f"{vector.source}: --layers {format_layers(missing)}: the vector has "
                             f"no row there (it has {format_layers(rows)})")
    entries = vector.preset.entries if vector.preset is not None else ({"id": vector.id},)
    made = []
    for entry in entries:
        entry = dict(entry)
        if layers is not None:
            entry.pop("layer", None)
            entry.pop("layers", None)
            entry.update({"layer": chosen[0]} if len(chosen) == 1 else {"layers": chosen})
        if scale is not None or "scale" not in entry:
            entry["scale"] = 1.0 if scale is None else scale
        made.append(entry)
    picked = ([f"layers {format_layers(chosen)}"] if layers is not None else []) + \
        ([f"scale {scale:g}"] if scale is not None else [])
    source = vector.preset.description if vector.preset is not None else \
        f"{vector.source.name}: no preset in the source"
    return replace(vector, preset=checked_preset(
        tuple(made), f"{source}; {' and '.join(picked)} chosen at import", vector.source))


def preset_summary(entries: list[dict[str, Any]]) -> str:
    """What a preset steers: ``happy on layers 13-25 at scale 1``, entry by entry."""
    def one(entry: dict[str, Any]) -> str:
        layers = entry.get("layers", entry.get("layer"))
        where = (f"layers {format_layers(layers)}" if isinstance(layers, list) else
                 f"layers {layers}" if layers == "all" else f"layer {layers}")
        return f"{entry.get('id')} on {where} at scale {entry.get('scale', 1.0):g}"

    return "; ".join(one(entry) for entry in entries)


def _listed(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n  " + "\n  ".join(problems)


def engine_layers(client: ControlClient) -> int | None:
    """The attached engine's decoder layers (rank 0), or ``None`` without one (the uploads
    will say so; a GGUF file asks for --model-layers first)."""
    try:
        engine = client.slots().get("engine")
    except ControlApiError as e:
        if e.status == 503:
            return None
        raise
    return None if engine is None else int(engine["n_layers"])


@client_command
def _import(client: ControlClient, args: argparse.Namespace) -> None:
    n_layers = args.model_layers if args.model_layers is not None else engine_layers(client)
    result = read_source(args.path, n_layers, args.id_prefix, args.features, args.sae_name)
    chosen = []
    for vector in result.vectors:
        try:
            chosen.append(choose(vector, args.layers, args.scale, n_layers))
        except ValueError as e:
            result.problems.append(str(e))
    if not chosen:
        raise ControlApiError(0, "file_error", f"nothing imported, {_listed(result.problems)}")
    result.vectors = chosen
    pinned = {v["id"]: v["pinned"] for v in client.vectors()} if args.replace else {}
    for vector in result.vectors:
        info = client.push_array(vector.id, vector.tensor, layers=vector.layers,
                                 pin=pinned.get(vector.id, False), replace=args.replace,
                                 metadata=vector.metadata)
        where = "resident" if info["resident"] else info["state"].replace("_", " ")
        print(f"vector {info['id']}: {'x'.join(map(str, info['shape']))}, generation "
              f"{info['generation']}, {where}")
    for vector in result.vectors:
        if vector.preset is not None:
            preset = client.store_preset(vector.id, vector.preset.entries, replace=args.replace,
                                         description=vector.preset.description)
            print(f"preset {preset['name']}: {preset_summary(preset['entries'])} "
                  f"({preset['description']})")
        elif args.scale is not None:
            print(f"preset {vector.id}: none (its source names no layer; --layers gives it one)")
    if result.problems:
        raise ControlApiError(0, "file_error", f"imported the rest; skipped {_listed(result.problems)}")
