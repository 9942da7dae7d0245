"""hotwire in vLLM's OpenAI API server: what a request asks for is checked before the engine sees it.

:mod:`.install` puts :mod:`.middleware` into the server's app; :mod:`.plan` rewrites a request
(specs as JSON objects, presets as spec items or model names) and takes the engine's admission
decision on it from the engine's mailbox (:mod:`.engine_view`), which becomes the ``x-hotwire``
header (:mod:`.verdict`) or, in strict mode, a 400; :mod:`.presets` reads presets from the
control API and :mod:`.models` lists them as models; :mod:`.settings` holds the environment.
"""
