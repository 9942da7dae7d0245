"""Which importer a path needs; ids unique across a directory.

A ``.gguf`` file is a control vector. A directory is every vector file in it
(:mod:`.plain`); with a ``manifest.json`` that lists ``vectors`` (brainscope's export) or
``directions`` (a hidden-directions dictionary), the files it lists are read with their metadata
and presets by that format's importer, and the others as plain files. A file in the directory
that is a link leading out of it is a problem, never read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from . import brainscope, hidden_directions, plain
from .result import ImportResult, VectorImportError, inside, read_manifest

MANIFEST = "manifest.json"
FORMATS = {"vectors": brainscope.import_export, "directions": hidden_directions.import_dictionary}


def import_path(path: Path, *, n_layers: int | None = None, id_prefix: str = "") -> ImportResult:
    """The vectors (and presets) at ``path``. ``n_layers``: the model's decoder layers, needed
    for GGUF and used to check per-layer tensors. :class:`VectorImportError` when nothing at
    ``path`` can be read; a bad item is a line in ``problems``, the rest still import."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        try:
            result = ImportResult([plain.read_file(path, n_layers=n_layers, id_prefix=id_prefix)])
        except ValueError as e:
            raise VectorImportError(str(e)) from None
    elif path.is_dir():
        result = _import_dir(path, n_layers, id_prefix)
    elif path.exists():
        raise VectorImportError(f"{path}: expected a directory (vector files, a brainscope "
                                "export, a hidden-directions dictionary) or a .gguf file")
    else:
        raise VectorImportError(f"{path}: no such file or directory")
    _check(result)
    return result


def _import_dir(root: Path, n_layers: int | None, id_prefix: str) -> ImportResult:
    result, listed = ImportResult(), set()
    if (root / MANIFEST).exists():
        try:
            manifest = read_manifest(inside(root, root / MANIFEST))
        except ValueError as e:
            raise VectorImportError(str(e)) from None
        kinds = [key for key in FORMATS if key in manifest]
        if len(kinds) != 1:
            raise VectorImportError(f"{root / MANIFEST}: neither a brainscope export (a `vectors` "
                                    "list) nor a hidden-directions dictionary (a `directions` "
                                    "list)")
        try:
            result, listed = FORMATS[kinds[0]](root, manifest, n_layers=n_layers,
                                               id_prefix=id_prefix)
        except ValueError as e:
            raise VectorImportError(str(e)) from None
    result.extend(plain.import_files(root, n_layers=n_layers, id_prefix=id_prefix, skip=listed))
    return result


def _check(result: ImportResult) -> None:
    """Ids unique: two files giving one id are both problems."""
    twice = {vid for vid, n in Counter(v.id for v in result.vectors).items() if n > 1}
    result.problems += [f"{v.source}: id {v.id!r} is given by more than one file"
                        for v in result.vectors if v.id in twice]
    result.vectors = [v for v in result.vectors if v.id not in twice]
