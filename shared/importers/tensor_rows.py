"""Chosen rows of a tensor in a weights file, read without loading the rest.

An SAE's decoder is ``[d_sae, d_in]``: 16k to 1M rows, hundreds of MB to GB, of which an import
wants a handful. safetensors files are read by their documented layout (an 8-byte little-endian
header length, a JSON header naming each tensor's ``dtype``, ``shape`` and ``data_offsets`` into
the byte buffer after it), ``.npz`` archives through each member's ``.npy`` header; either way
only the chosen rows' bytes are read. bfloat16 is read too (numpy has no such type).
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from hotwire.shared.wire import ITEMSIZE, VectorError, from_bytes

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on the JSON header


def safetensors_header(path: Path) -> dict[str, Any]:
    """The file's tensors (name -> ``{dtype, shape, data_offsets}``) and the offset their
    buffer starts at (``"__buffer__"``); :class:`ValueError` naming ``path`` if malformed."""
    with _open(path) as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (a {size}-byte header)")
        try:
            header = json.loads(f.read(size))
        except ValueError as e:
            raise ValueError(f"{path}: not a safetensors file (its header is not JSON: {e})") \
                from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    try:
        end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        raise ValueError(f"{path}: not a safetensors file (a tensor without data_offsets)") \
            from None
    if path.stat().st_size < 8 + size + end:
        raise ValueError(f"{path}: truncated: its header lists {8 + size + end} bytes, the file "
                         f"has {path.stat().st_size}")
    header["__buffer__"] = 8 + size
    return header


def safetensors_rows(path: Path, key: str, rows: Sequence[int]) -> np.ndarray:
    """Rows ``rows`` of tensor ``key`` (elements, for a 1-D one) as float32."""
    header = safetensors_header(path)
    entry = header.get(key)
    if not isinstance(entry, dict):
        names = sorted(k for k in header if k != "__buffer__")
        raise ValueError(f"{path}: no tensor {key!r} (it has {names})")
    try:
        code, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: tensor {key!r} has a malformed header entry") from None
    if code not in ITEMSIZE:
        raise ValueError(f"{path}: tensor {key!r} is {code}, not a float type")
    row_bytes = math.prod(shape[1:]) * ITEMSIZE[code]
    if not shape or end - begin != shape[0] * row_bytes:
        raise ValueError(f"{path}: tensor {key!r}: its offsets do not hold shape {list(shape)}")
    _check_rows(path, key, shape, rows)
    with _open(path) as f:
        return _read_rows(f, header["__buffer__"] + begin, row_bytes, rows,
                          lambda buf: from_bytes(buf, code, shape[1:]), path, key)


def npz_shape(path: Path, key: str) -> tuple[int, ...]:
    """The shape of array ``key`` of an ``.npz`` archive, read from its ``.npy`` header."""
    with _member(path, key) as f:
        return _npy_header(f, path, key)[0]


def npz_rows(path: Path, key: str, rows: Sequence[int]) -> np.ndarray:
    """Rows ``rows`` of array ``key`` of an ``.npz`` archive (``np.savez``) as float32. A
    stored (uncompressed) member is read in place; a compressed one is decompressed up to the
    last row asked for (rows are read in order, so it is never read twice)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    with _member(path, key) as f:
        shape, dtype = _npy_header(f, path, key)
        _check_rows(path, key, shape, rows)
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        found = _read_rows(f, f.tell(), row_bytes, [rows[i] for i in order], lambda buf: np.frombuffer(
            buf, dtype=dtype).astype(np.float32).reshape(shape[1:]), path, key)
    out = np.empty_like(found)
    out[order] = found
    return out


def npz_names(path: Path) -> list[str]:
    """The arrays an ``.npz`` archive holds."""
    try:
        with zipfile.ZipFile(path) as archive:
            return [n.removesuffix(".npy") for n in archive.namelist()]
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not an .npz archive ({e})") from None


@contextmanager
def _member(path: Path, key: str) -> Iterator[BinaryIO]:
    """Member ``<key>.npy``, opened: a stored one as the file itself, placed at its bytes."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not an .npz archive ({e})") from None
    with archive:
        try:
            info = archive.getinfo(f"{key}.npy")
        except KeyError:
            names = sorted(n.removesuffix(".npy") for n in archive.namelist())
            raise ValueError(f"{path}: no array {key!r} (it has {names})") from None
        if info.compress_type != zipfile.ZIP_STORED:
            with archive.open(info) as member:
                yield member
            return
        with _open(path) as f:
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"{path}: not an .npz archive (a local header is missing)")
            name_len, extra_len = struct.unpack("<HH", local[26:30])  # after 26 fixed bytes
            f.seek(info.header_offset + 30 + name_len + extra_len)
            yield _Window(f)


class _Window:
    """A stored member's bytes as a file whose offset 0 is the member's first byte."""

    def __init__(self, f: BinaryIO):
        self._f, self._start = f, f.tell()

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def seek(self, offset: int) -> None:
        self._f.seek(self._start + offset)

    def tell(self) -> int:
        return self._f.tell() - self._start


def _npy_header(f: BinaryIO, path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the ``.npy`` array at ``f``, left at its first value."""
    readers = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
    try:
        version = npy_format.read_magic(f)
        if version not in readers:
            raise ValueError(f"format version {version[0]}.{version[1]} is not read here")
        shape, fortran, dtype = readers[version](f)
    except ValueError as e:
        raise ValueError(f"{path}: {key}.npy is not an .npy array ({e})") from None
    if fortran and len(shape) > 1:
        raise ValueError(f"{path}: {key} is stored in Fortran order; save it C-ordered")
    if dtype.kind != "f":
        raise ValueError(f"{path}: {key} is {dtype}, not a float type")
    return tuple(shape), dtype


def _check_rows(path: Path, key: str, shape: Sequence[int], rows: Sequence[int]) -> None:
    if len(shape) not in (1, 2):
        raise ValueError(f"{path}: {key} has shape {list(shape)}; expected 1 or 2 dimensions")
    outside = sorted({r for r in rows if not 0 <= r < shape[0]})
    if outside:
        raise ValueError(f"{path}: {key} has {shape[0]} rows (0..{shape[0] - 1}); no row "
                         f"{', '.join(map(str, outside))}")


def _read_rows(f: BinaryIO, start: int, row_bytes: int, rows: Sequence[int], decode,
               path: Path, key: str) -> np.ndarray:
    out = []
    for row in rows:
        f.seek(start + row * row_bytes)
        buf = f.read(row_bytes)
        if len(buf) != row_bytes:
            raise ValueError(f"{path}: {key} is truncated (row {row} is past the end of the file)")
        try:
            out.append(decode(buf))
        except VectorError as e:
            raise ValueError(f"{path}: {key}: {e.detail}") from None
    return np.stack(out).astype(np.float32, copy=False) if out else np.zeros((0,), np.float32)


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
