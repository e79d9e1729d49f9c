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


def _exists(path: object) -> bool:
    import os

    try:
        os.stat(path)  # type: ignore[arg-type]
    except OSError:
        return False
    return True


def permission_text(exc: OSError, state_dir: object | None = None) -> str:
    """A permission error said as what it is: which directory, whose it is, and the fix.

    The failing name is often a temp file evolve was creating (an atomic write) or a name relative to
    a directory descriptor, which tells an operator nothing: the directory that refused it is named
    instead (``state_dir`` when the name is relative), with its owner and mode.
    """
    import os
    import stat
    from pathlib import Path

    name = exc.filename if isinstance(exc.filename, str) else None
    path = Path(name) if name else None
    if path is None or not path.is_absolute():
        if state_dir is None:
            return f"permission denied: {exc.strerror or exc}{': ' + name if name else ''}"
        path = Path(str(state_dir)) / (name or ".")
    temp = path.name.startswith(".") and path.name.endswith(".tmp")
    target = path if _exists(path) and not temp and path.name != "." else path.parent
    while not _exists(target) and target != target.parent:
        target = target.parent
    try:
        mode = f"mode {stat.S_IMODE(os.stat(target).st_mode):04o}"
    except OSError:
        mode = "mode unknown"
    # The state directory as a whole is what to hand over: one chown, not a file at a time.
    state = next((p for p in (target, *target.parents) if p.name == "evolve" and p.parent.name == ".agents"), target)
    owner, me = owner_name(target), owner_name(None)
    reading = target == path and not os.path.isdir(target)
    what = f"cannot read or write {target}" if reading else f"cannot create or read files in {target}"
    return (f"permission denied: {what} (owned by {owner}, {mode}); evolve runs as {me}: run evolve as {owner}, "
            f"or give {me} the state directory: `sudo chown -R {me} {state}`")


def owner_name(path: object | None) -> str:
    """The user owning ``path`` (None: this process's user), by name when it has one, else ``uid N``."""
    import os
    import pwd

    try:
        uid = os.geteuid() if path is None else os.stat(path).st_uid  # type: ignore[arg-type]
    except OSError:
        return "another user"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
