"""Importers for steering vectors in the formats people already have (CPU only, no GPU code).

:func:`import_path` reads a GGUF control vector (llama.cpp, repeng), a brainscope export, a
hidden-directions dictionary, a directory of plain vector files, or chosen features of a sparse
autoencoder (SAELens, Gemma Scope, Neuronpedia records) into :class:`ImportedVector` s in
hotwire's conventions, each with the preset its source implies. Used by ``hotwire vectors
import`` (uploads through the control API, creates the presets) and by the engine's startup
vectors (``HOTWIRE_VECTORS``).

How each format numbers layers, checked against its own code (each module's docstring cites
it) and against a transformers forward in ``tests/test_importers.py`` and
``tests/test_sae_importers.py``, as vLLM's 0-based decoder layer ``L`` whose output hotwire
steers:

=================  =================================================  =================
format             where its direction lives                          hotwire ``layer``
=================  =================================================  =================
brainscope         ``calibrated.layer`` L: hook on layers[L]          L
hidden-directions  ``recommended_layer`` L: hook on layers[L]         L
GGUF               ``direction.N``: added to block N's output         N (N >= 1)
SAELens            ``blocks.L.hook_resid_post``: block L's output     L
SAELens            ``blocks.L.hook_resid_pre``: block L's input       L - 1 (L >= 1)
Gemma Scope        ``layer_L`` of a ``-res`` release (resid_post)     L
Neuronpedia        ``hookName`` ``blocks.L.hook_resid_pre``           L - 1 (L >= 1)
=================  =================================================  =================
"""

from .result import ImportedPreset, ImportedVector, ImportResult, VectorImportError
from .sources import import_path

__all__ = ["ImportResult", "ImportedPreset", "ImportedVector", "VectorImportError", "import_path"]
