"""GGUF control vectors, as llama.cpp reads them and repeng writes them.

The format: one F32 1-D tensor per layer, named ``direction.<N>``, ``hidden`` values each (repeng
adds ``general.architecture = "controlvector"``, ``controlvector.model_hint`` and
``controlvector.layer_count``; llama.cpp reads no key at all). What ``N`` means is settled by
llama.cpp's own code, read at ggml-org/llama.cpp:

- ``common/common.cpp``, ``common_control_vector_load_one``: ``direction.N`` is added into a
  flat buffer at offset ``n_embd * (N - 1)``; ``N == 0``, a name without a number, a non-F32 or
  non-1-D tensor, or lengths that differ make the whole file invalid.
- ``src/llama-adapter.cpp``, ``llama_adapter_cvec::apply``: for ``il = 1 .. n_layer - 1``,
  ``tensors[il]`` is filled from offset ``n_embd * (il - 1)``; there is never a tensor for
  layer 0. So ``tensors[il]`` holds ``direction.il``: the two ``- 1`` cancel.
- ``src/models/qwen3.cpp`` (and every model graph): ``cur = build_cvec(cur, il)`` right after
  the FFN's residual add, i.e. ``tensors[il]`` is added to block ``il``'s output, the stream
  block ``il + 1`` receives. llama.cpp's blocks are numbered from 0, as vLLM's decoder layers.

Hence ``direction.N`` steers vLLM decoder layer ``N`` (hotwire ``layer: N``), unchanged. repeng
agrees: it reads ``hidden_states[layer + 1]`` (the output of decoder layer ``layer``) and writes
it as ``direction.<layer>``. llama.cpp applies every direction at strength 1 (times its
``--control-vector-scaled`` factor), so the preset is one entry, scale 1, over the file's layers.

Refused, as llama.cpp refuses them: ``direction.0`` (llama.cpp's loader calls it invalid),
tensors not named ``direction.<N>``, non-F32 or non-1-D tensors, unequal lengths. Also refused:
``N >= n_layers`` (llama.cpp ignores such a direction silently; here it means a file for another
model). Two tensors naming one layer add up, as in llama.cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .result import ImportedVector, as_vector, checked_preset

PREFIX = "direction."


def read_control_vector(path: Path, vector_id: str, n_layers: int | None) -> ImportedVector:
    """The file as one ``[n_layers, hidden]`` vector (zero rows where it has no direction),
    materialised on the layers it has, with a preset applying it there at scale 1.
    :class:`ValueError` names the file and what is wrong."""
    if n_layers is None:
        raise ValueError(f"{path}: a GGUF control vector needs the model's layer count (the "
                         "engine's; with the CLI, an attached engine or --model-layers)")
    try:
        import gguf
    except ImportError:
        raise ValueError(f"{path}: reading GGUF needs the gguf package (pip install gguf)") \
            from None
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct.error, OSError, ...
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from None
    directions: dict[int, np.ndarray] = {}
    for tensor in reader.tensors:
        layer = _layer_of(path, tensor.name)
        if int(tensor.tensor_type) != int(gguf.GGMLQuantizationType.F32):
            raise ValueError(f"{path}: {tensor.name} is {tensor.tensor_type.name}; llama.cpp "
                             "reads F32 directions only")
        dims = [int(d) for d in tensor.shape]
        while len(dims) > 1 and dims[-1] == 1:
            dims.pop()
        if len(dims) != 1:
            raise ValueError(f"{path}: {tensor.name} has shape {dims}; a direction is 1-D")
        if layer >= n_layers:
            raise ValueError(f"{path}: {tensor.name} names layer {layer}, but the model has "
                             f"{n_layers} (0..{n_layers - 1}): a file for another model?")
        row = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
        if directions and row.size != next(iter(directions.values())).size:
            raise ValueError(f"{path}: {tensor.name} has {row.size} values, the others "
                             f"{next(iter(directions.values())).size}")
        directions[layer] = directions.get(layer, 0) + row
    if not directions:
        raise ValueError(f"{path}: no direction.<layer> tensors")
    hidden = next(iter(directions.values())).size
    stacked = np.zeros((n_layers, hidden), dtype=np.float32)
    for layer, row in directions.items():
        stacked[layer] = row
    layers = tuple(sorted(directions))
    metadata = {"imported_from": "gguf", "file": path.name, **_fields(reader)}
    recipe = checked_preset(({"id": vector_id, "layers": list(layers), "scale": 1.0},),
                    f"GGUF control vector {path.name}: layers {_span(layers)}, strength 1 as "
                    "llama.cpp applies it", path)
    return ImportedVector(vector_id, as_vector(stacked, path, n_layers), layers, metadata, path,
                          recipe)


def _layer_of(path: Path, name: str) -> int:
    number = name[len(PREFIX):] if name.startswith(PREFIX) else ""
    if not number.isdigit():
        raise ValueError(f"{path}: tensor {name!r} is not named direction.<layer>")
    if int(number) == 0:
        raise ValueError(f"{path}: direction.0 is invalid (llama.cpp's layers start at 1: there "
                         "is no control vector for layer 0)")
    return int(number)


def _fields(reader: Any) -> dict[str, Any]:
    """The file's scalar key/values (strings and numbers), for the vector's metadata."""
    import gguf

    out: dict[str, Any] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or len(f.types) != 1 or not f.data:
            continue
        value = f.parts[f.data[0]]
        if f.types[0] == gguf.GGUFValueType.STRING:
            out[name] = bytes(value).decode("utf-8", errors="replace")
        elif f.types[0] not in (gguf.GGUFValueType.ARRAY,):
            scalar = value.tolist()[0]
            if isinstance(scalar, (bool, int)) or np.isfinite(scalar):
                out[name] = scalar
    return out


def _span(layers: tuple[int, ...]) -> str:
    return f"{layers[0]}-{layers[-1]}" if layers == tuple(range(layers[0], layers[-1] + 1)) \
        else ",".join(map(str, layers))
