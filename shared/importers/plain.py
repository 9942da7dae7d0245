"""A directory of vector files, one vector each, named after the file (``<id>.<suffix>``):
``.safetensors`` (one tensor), ``.pt`` (a tensor saved with ``torch.save``, read with
``weights_only=True``), ``.gguf`` (a control vector, :mod:`.gguf_control`). Rows of a 2-D
tensor are decoder layers from 0, as hotwire's. Other files are not vectors and are passed over.
"""

from __future__ import annotations

from pathlib import Path

from hotwire.shared.wire import decode_safetensors

from .gguf_control import read_control_vector
from .result import ImportedVector, ImportResult, as_vector, inside, read_pt, vector_id

SUFFIXES = (".safetensors", ".pt", ".gguf")


def import_files(root: Path, *, n_layers: int | None, id_prefix: str,
                 skip: set[str] = frozenset()) -> ImportResult:
    """Every vector file in ``root`` but those named in ``skip``, by name; a link out of
    ``root`` is a problem, not read."""
    result = ImportResult()
    for path in sorted(root.iterdir()):
        if path.suffix not in SUFFIXES or path.name in skip or not path.is_file():
            continue
        try:
            result.vectors.append(read_file(inside(root, path), n_layers=n_layers,
                                            id_prefix=id_prefix))
        except ValueError as e:
            result.problems.append(str(e))
    return result


def read_file(path: Path, *, n_layers: int | None, id_prefix: str) -> ImportedVector:
    """One vector file; :class:`ValueError` names it and says what is wrong."""
    vid = vector_id(path.stem, id_prefix, path)
    if path.suffix == ".gguf":
        return read_control_vector(path, vid, n_layers)
    if path.suffix == ".pt":
        tensor = read_pt(path)
    else:
        try:
            tensor = decode_safetensors(path.read_bytes())
        except OSError as e:
            raise ValueError(f"{path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return ImportedVector(vid, as_vector(tensor, path, n_layers), None,
                          {"imported_from": path.suffix.lstrip("."), "file": path.name}, path)
