"""The HTTP service: the FastAPI app, its routers, settings, auth, metrics, and the one place
domain errors become HTTP statuses and error bodies (:mod:`.http_errors`)."""
