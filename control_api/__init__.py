"""Control service: catalog, slots and the mailbox writer, over FastAPI."""
