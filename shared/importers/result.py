"""What every importer returns: vectors in hotwire's conventions, each with an optional preset.

``tensor`` rows follow the control API's and the engine's rule (:func:`hotwire.shared.wire.
check_vector`): a ``[hidden]`` vector serves any layer, row ``i`` of a ``[n_layers, hidden]``
vector is the vector for vLLM's 0-based decoder layer ``i``, whose output (the residual stream
the next layer receives) hotwire steers. An importer maps its format's layer numbering onto that
once, and says how in its docstring.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hotwire.shared.metadata import metadata_problem
from hotwire.shared.spec import ID_PATTERN, SpecError, parse_spec, valid_id

F32_MAX = float(np.finfo(np.float32).max)


class VectorImportError(ValueError):
    """A source that cannot be imported at all (unreadable or malformed index, unknown kind);
    the message names the path and what is wrong."""


@dataclass(frozen=True)
class ImportedPreset:
    """The recipe a source ships for its vector: spec entries, and what they came from."""

    entries: tuple[dict[str, Any], ...]
    description: str


@dataclass(frozen=True)
class ImportedVector:
    """One vector as its source gives it; :class:`ValueError` naming the file when its metadata
    is not what the control API stores (so an import never fails half way on it)."""

    id: str
    tensor: np.ndarray  # float32, [hidden] or [n_layers, hidden]
    layers: tuple[int, ...] | None  # rows worth materialising; None: every armed layer
    metadata: dict[str, Any]  # what the source said about the vector (JSON values)
    source: Path  # the file it came from, for messages
    preset: ImportedPreset | None = None  # stored under the vector's id as its name

    def __post_init__(self) -> None:
        problem = metadata_problem(self.metadata)
        if problem is not None:
            raise ValueError(f"{self.source}: its metadata {problem}")


@dataclass
class ImportResult:
    """Vectors that imported, and one line per item that did not (``path: why``). An importer
    never stops at a bad item: the engine and the CLI import the rest and name each bad one."""

    vectors: list[ImportedVector] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def extend(self, other: ImportResult) -> None:
        self.vectors += other.vectors
        self.problems += other.problems


def vector_id(name: str, prefix: str, where: Path) -> str:
    """``prefix + name`` if that is a valid id, else :class:`ValueError` naming ``where``."""
    candidate = prefix + name
    if not valid_id(candidate):
        raise ValueError(f"{where}: {candidate!r} is not a valid vector id ({ID_PATTERN}); "
                         "rename the file or change --id-prefix")
    return candidate


def scale_of(value: Any, what: str, where: Path) -> float:
    """A source's number that becomes a spec's ``scale``: a JSON number (not a boolean) finite in
    float32, else :class:`ValueError` naming ``where``."""
    if type(value) not in (int, float):
        raise ValueError(f"{where}: {what} must be a number, got {_clip(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number) or abs(number) > F32_MAX:
        raise ValueError(f"{where}: {what} {_clip(value)} is not finite in float32 (|{what}| < 3.4e38)")
    return number


def layer_of(value: Any, what: str, where: Path, n_layers: int | None) -> int:
    """A source's decoder layer: an int (not a boolean) ``>= 0`` and, when the model is known,
    one it has; else :class:`ValueError` naming ``where``."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{where}: {what} must be a decoder layer (an int >= 0), got {_clip(value)}")
    if n_layers is not None and value >= n_layers:
        raise ValueError(f"{where}: {what} {_clip(value)} is not a layer of the model (it has "
                         f"{n_layers}: 0..{n_layers - 1})")
    return value


def _clip(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def inside(root: Path, path: Path) -> Path:
    """``path``, a name in ``root``; :class:`ValueError` when it is a link that leads out of
    ``root`` (an export directory's files are its own; a link could read any file)."""
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(root.resolve()):
            raise ValueError(f"{path}: a link to {target}, outside {root}; not followed")
    return path


def checked_preset(entries: tuple[dict[str, Any], ...], description: str,
                   where: Path) -> ImportedPreset:
    """The preset, if the engine parses its entries as a spec, else :class:`ValueError`."""
    try:
        parse_spec(list(entries))
    except SpecError as e:
        raise ValueError(f"{where}: the preset it implies does not parse ({e})") from None
    return ImportedPreset(entries, description)


def read_manifest(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; NaN and infinities are refused (metadata must be plain JSON)."""
    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(path.read_text(), parse_constant=no_constant)
    except OSError as e:
        raise VectorImportError(f"{path}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise VectorImportError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise VectorImportError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_pt(path: Path) -> np.ndarray:
    """A float tensor saved with ``torch.save``, read with ``weights_only=True`` (nothing but
    tensors is unpickled), as float32 numpy."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path}: reading .pt files needs torch (pip install torch)") from None
    try:
        t = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file, a pickle of something else: all one answer
        raise ValueError(f"{path}: not a tensor file torch can load safely ({e})") from None
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        what = f"a {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{path}: holds {what}, not a float tensor")
    return t.detach().float().numpy()


def as_vector(array: np.ndarray, where: Path, n_layers: int | None) -> np.ndarray:
    """``array`` as float32 ``[hidden]`` or ``[n_layers, hidden]`` with finite values, else
    :class:`ValueError` naming ``where``. The hidden size is checked later, against the model."""
    array = np.asarray(array, dtype=np.float32)
    if array.ndim not in (1, 2) or array.size == 0:
        raise ValueError(f"{where}: shape {list(array.shape)} is neither [hidden] nor "
                         "[n_layers, hidden]")
    if array.ndim == 2 and n_layers is not None and array.shape[0] != n_layers:
        raise ValueError(f"{where}: {array.shape[0]} rows, but the model has {n_layers} layers")
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: holds NaN or infinite values")
    return np.ascontiguousarray(array)
