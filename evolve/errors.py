"""Exceptions that map to an exit code and a one-line message."""

from __future__ import annotations

from evolve import exitcodes


class EvolveError(Exception):
    """An error that ends the command with a clear one-line message."""

    exit_code = exitcodes.ERROR


class ConfigError(EvolveError):
    """Bad configuration: unknown key, wrong type, unreadable file."""

    exit_code = exitcodes.CONFIG


class UsageError(EvolveError):
    exit_code = exitcodes.USAGE


class LedgerError(EvolveError):
    """The ledger refused an append (e.g. a non-increasing cycle number)."""
