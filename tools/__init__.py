"""User tools and test/benchmark helpers: ``hotwire demo``, ``hotwire verify``, the one-engine job
runner (:mod:`.jobs`), model builders (:mod:`.tiny_model`, :mod:`.smollm2`) and the contrast-vector
recipe (:mod:`.contrast`).

Nothing here runs inside vLLM: the engine plugin (:mod:`hotwire.engine_plugin`) holds only what
does. These modules start engines, in their own processes, and compare what they serve.
"""
