"""Durable on-disk state: atomic JSON, the append-only ledger, session state, markers, the fire lock."""
