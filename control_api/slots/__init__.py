"""The slot protocol against the engines' mailboxes: which catalog vectors sit in which slots of
each engine (data-parallel rank), uploads written through the two-phase eviction protocol, and
the reconcile pass that keeps every table holding the catalog. Uses the catalog (:mod:`..store`);
knows nothing of HTTP."""
