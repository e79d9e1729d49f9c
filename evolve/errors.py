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


class UnsafePathError(EvolveError, OSError):
    """A directory or file evolve writes is a symlink it did not create (docs/DESIGN.md §2.0).

    An ``OSError`` (errno ELOOP) too, so a writer that logs an I/O error and goes on (a run log)
    does so here as well, while one that must not go on ends the command with this one line.
    """

    def __init__(self, path: object) -> None:
        import errno

        why = f"refusing to write through the symlink {path} (evolve follows no links below its roots)"
        super().__init__(errno.ELOOP, why, str(path))

    def __str__(self) -> str:
        return str(self.args[1]) if len(self.args) > 1 else super().__str__()
