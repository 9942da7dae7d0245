"""Vector wire format: decode uploads (safetensors, raw base64) and check them against a model.

Everything here is numpy only, so the control API needs no torch. Vectors travel as
``(hidden,)`` (one vector for any layer) or ``(n_layers, hidden)`` (one row per layer) and are
normalised to float32 here; the engine casts to the model dtype when it loads a row.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass

import numpy as np
from safetensors import SafetensorError, deserialize
from safetensors.numpy import save as _save_numpy

# Accepted element types; anything else (ints, bools, complex, fp8) is refused.
_DTYPES = {
    "float32": "F32", "fp32": "F32", "F32": "F32",
    "float16": "F16", "fp16": "F16", "F16": "F16", "half": "F16",
    "bfloat16": "BF16", "bf16": "BF16", "BF16": "BF16",
    "float64": "F64", "fp64": "F64", "F64": "F64",
}
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
# base64 is decoded this many characters at a time: one call on 64 MiB holds the GIL ~0.3 s.
_B64_CHUNK = 2**20
# Largest finite value of each model dtype, to refuse vectors that would overflow on the cast.
_MODEL_MAX = {"float32": np.finfo(np.float32).max, "float16": 65504.0, "bfloat16": 3.3895e38}


class VectorError(ValueError):
    """An upload that cannot become a vector. ``code`` is stable; ``status`` is the HTTP status."""

    def __init__(self, code: str, detail: str, status: int = 422):
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


@dataclass(frozen=True)
class ModelShape:
    """What a vector must match: the engine's model fingerprint."""

    n_layers: int
    hidden: int
    dtype: str  # torch-style name: "bfloat16", "float16", "float32"


def dtype_max(model_dtype: str) -> float:
    """The largest finite value of a model dtype (torch-style name; float32's when unknown)."""
    return float(_MODEL_MAX.get(model_dtype, _MODEL_MAX["float32"]))


def dtype_code(name: str) -> str:
    try:
        return _DTYPES[name]
    except KeyError:
        raise VectorError("bad_dtype", f"dtype {name!r} is not a float type "
                          f"(use one of float32, float16, bfloat16, float64)") from None


def from_bytes(buf: bytes | bytearray, code: str, shape: tuple[int, ...]) -> np.ndarray:
    """Little-endian values of safetensors type ``code`` (``F32``, ``BF16``...), as float32 of
    ``shape``; :class:`VectorError` when the byte count does not match."""
    n = math.prod(shape)  # exact: numpy's product wraps around (2**32 * 2**32 == 0)
    if len(buf) != n * ITEMSIZE[code]:
        raise VectorError("bad_shape", f"{len(buf)} bytes do not hold shape {list(shape)} of {code}")
    if code == "BF16":  # bfloat16 is the top half of a float32
        bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32)
    else:
        arr = np.frombuffer(buf, dtype={"F32": "<f4", "F16": "<f2", "F64": "<f8"}[code])
    return arr.astype(np.float32).reshape(shape)


def decode_base64(data: str, dtype: str, shape: list[int]) -> np.ndarray:
    """Raw little-endian values, base64-encoded, of the given dtype and shape."""
    code = dtype_code(dtype)
    if not shape or len(shape) > 2 or any(int(d) <= 0 for d in shape):
        raise VectorError("bad_shape", f"shape {shape} must be [hidden] or [n_layers, hidden]")
    try:
        buf = _b64decode(data)
    except (binascii.Error, ValueError) as e:
        raise VectorError("bad_encoding", f"data is not valid base64: {e}") from None
    return from_bytes(buf, code, tuple(int(d) for d in shape))


def _b64decode(data: str) -> bytes:
    """Strict base64, decoded in slices so that a thread doing it lets the others run."""
    if len(data) <= _B64_CHUNK:
        return base64.b64decode(data, validate=True)
    parts = []
    for start in range(0, len(data), _B64_CHUNK):
        chunk = data[start:start + _B64_CHUNK]
        if start + _B64_CHUNK < len(data) and "=" in chunk:
            raise ValueError("padding before the end of the data")
        parts.append(base64.b64decode(chunk, validate=True))
    return b"".join(parts)


def decode_safetensors(blob: bytes, key: str | None = None) -> np.ndarray:
    """The one tensor of a safetensors file (or the one named ``key``)."""
    return read_safetensors(blob, key)[0]


def read_safetensors(blob: bytes, key: str | None = None) -> tuple[np.ndarray, str]:
    """:func:`decode_safetensors`, and the tensor's element type as stored (``"bfloat16"``...)."""
    try:
        tensors = dict(deserialize(blob))
    except (SafetensorError, ValueError) as e:
        raise VectorError("bad_encoding", f"not a safetensors file: {e}") from None
    if key is None:
        if len(tensors) != 1:
            raise VectorError("bad_shape", f"safetensors file holds {len(tensors)} tensors "
                              f"({sorted(tensors)}); name one with `key`")
        key = next(iter(tensors))
    if key not in tensors:
        raise VectorError("bad_shape", f"no tensor {key!r} in file (has {sorted(tensors)})")
    t = tensors[key]
    if t["dtype"] not in ITEMSIZE:
        raise VectorError("bad_dtype", f"tensor dtype {t['dtype']} is not a float type")
    return from_bytes(t["data"], t["dtype"], tuple(t["shape"])), DTYPE_NAMES[t["dtype"]]


def encode_safetensors(vector: np.ndarray, key: str = "vector") -> bytes:
    return _save_numpy({key: np.ascontiguousarray(vector, dtype=np.float32)})


def check_vector(vector: np.ndarray, model: ModelShape) -> np.ndarray:
    """Return ``vector`` as float32 ``(1, hidden)`` or ``(n_layers, hidden)``, or raise.

    Row ``i`` of a 2-D vector is the vector for decoder layer ``i``; a 1-D vector serves any layer.
    """
    if vector.ndim == 1:
        vector = vector[None, :]
    if vector.ndim != 2 or vector.shape[1] != model.hidden or vector.shape[0] not in (1, model.n_layers):
        raise VectorError("bad_shape", f"shape {list(vector.shape)} does not match the model: "
                          f"expected [{model.hidden}] or [{model.n_layers}, {model.hidden}]")
    if not np.isfinite(vector).all():
        raise VectorError("not_finite", "vector holds NaN or infinite values")
    limit = _MODEL_MAX.get(model.dtype, _MODEL_MAX["float32"])
    if np.abs(vector).max(initial=0.0) > limit:
        raise VectorError("not_finite", f"values overflow the model dtype {model.dtype}")
    return np.ascontiguousarray(vector, dtype=np.float32)
