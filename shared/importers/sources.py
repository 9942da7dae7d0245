"""Which importer a path needs; ids unique across a directory.

A ``.gguf`` file is a control vector. A ``.npz`` file is a Gemma Scope SAE; a ``.json``,
``.jsonl`` or ``.jsonl.gz`` file holds Neuronpedia records. A directory holding ``cfg.json``
and ``sae_weights.safetensors`` is a SAELens SAE, one holding ``params.npz`` a Gemma Scope SAE;
SAEs import the features ``features`` picks. Any other directory is every vector file in it
(:mod:`.plain`); with a ``manifest.json`` that lists ``vectors`` (brainscope's export) or
``directions`` (a hidden-directions dictionary), the files it lists are read with their metadata
and presets by that format's importer, and the others as plain files. A file in the directory
that is a link leading out of it is a problem, never read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from . import brainscope, gemma_scope, hidden_directions, neuronpedia, plain, sae_lens
from .result import ImportResult, VectorImportError, inside, read_manifest

MANIFEST = "manifest.json"
FORMATS = {"vectors": brainscope.import_export, "directions": hidden_directions.import_dictionary}


def import_path(path: Path, *, n_layers: int | None = None, id_prefix: str = "",
                features: Sequence[int] | None = None, sae_name: str | None = None) -> ImportResult:
    """The vectors (and presets) at ``path``. ``n_layers``: the model's decoder layers, needed
    for GGUF and used to check per-layer tensors and layers. ``features``: the SAE features to
    import (an SAE needs them; Neuronpedia records are picked by index); ``sae_name``: the
    ``<sae>`` of their ids ``<sae>.<index>`` (default: the SAE's folder, the record's source).
    :class:`VectorImportError` when nothing at ``path`` can be read; a bad item is a line in
    ``problems``, the rest still import."""
    path = Path(path)
    sae = _sae_reader(path)
    if features is not None and sae is None:
        raise VectorImportError(f"{path}: --features picks an SAE's features (a SAELens folder, "
                                "a Gemma Scope params.npz, Neuronpedia records)")
    try:
        if sae is not None:
            result = sae(path, n_layers=n_layers, id_prefix=id_prefix, features=features,
                         sae_name=sae_name)
        elif path.is_file() and path.suffix == ".gguf":
            result = ImportResult([plain.read_file(path, n_layers=n_layers, id_prefix=id_prefix)])
        elif path.is_dir():
            result = _import_dir(path, n_layers, id_prefix)
        elif path.exists():
            raise VectorImportError(f"{path}: expected a directory (vector files, a brainscope "
                                    "export, a hidden-directions dictionary, an SAE), a .gguf "
                                    "file, a Gemma Scope .npz or Neuronpedia .json/.jsonl records")
        else:
            raise VectorImportError(f"{path}: no such file or directory")
    except VectorImportError:
        raise
    except ValueError as e:
        raise VectorImportError(str(e)) from None
    _check(result)
    return result


def _sae_reader(path: Path) -> Callable[..., ImportResult] | None:
    """The importer of the SAE or Neuronpedia records at ``path``, or None."""
    if path.is_dir() and sae_lens.is_sae_lens(path):
        return sae_lens.import_sae
    if path.is_dir() and (path / gemma_scope.PARAMS).is_file():
        return lambda p, **kw: gemma_scope.import_params(inside(p, p / gemma_scope.PARAMS), **kw)
    if path.is_file() and path.suffix == ".npz":
        return gemma_scope.import_params
    if neuronpedia.is_neuronpedia(path):
        return neuronpedia.import_records
    return None


def _import_dir(root: Path, n_layers: int | None, id_prefix: str) -> ImportResult:
    result, listed = ImportResult(), set()
    if (root / MANIFEST).exists():
        manifest = read_manifest(inside(root, root / MANIFEST))
        kinds = [key for key in FORMATS if key in manifest]
        if len(kinds) != 1:
            raise VectorImportError(f"{root / MANIFEST}: neither a brainscope export (a `vectors` "
                                    "list) nor a hidden-directions dictionary (a `directions` "
                                    "list)")
        result, listed = FORMATS[kinds[0]](root, manifest, n_layers=n_layers,
                                           id_prefix=id_prefix)
    result.extend(plain.import_files(root, n_layers=n_layers, id_prefix=id_prefix, skip=listed))
    return result


def _check(result: ImportResult) -> None:
    """Ids unique: two files giving one id are both problems."""
    twice = {vid for vid, n in Counter(v.id for v in result.vectors).items() if n > 1}
    result.problems += [f"{v.source}: id {v.id!r} is given by more than one file"
                        for v in result.vectors if v.id in twice]
    result.vectors = [v for v in result.vectors if v.id not in twice]
