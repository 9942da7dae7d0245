"""Control service: catalog, slots and the mailbox writer, over FastAPI; and the ``hotwire`` CLI.

Laid out by job, each layer importing only those below it (``tests/test_layout.py`` checks):

- :mod:`.errors` (the domain's errors, a code and a message each) and :mod:`.layer_lists`:
  under everything.
- :mod:`.store`: catalog storage (SQLite, or PostgreSQL shared by replicas).
- :mod:`.slots`: the slot protocol against the engines' mailboxes (uses the store).
- :mod:`.api`: the HTTP service (uses slots and store; maps domain errors to HTTP).
- :mod:`.cli`: the command line, a client of the API over HTTP (imports none of the above).
"""
