"""Catalog storage: the registered vectors and presets, in SQLite or a PostgreSQL database shared
by replicas (:mod:`.catalog` says which, and the contract both keep). Knows nothing of engines
or HTTP."""
