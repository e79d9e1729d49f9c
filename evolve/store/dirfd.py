"""Directories evolve writes in, opened one component at a time without following symlinks.

A symlink planted inside ``.agents/`` (``runs/``, ``handoffs/``, ``.agents/evolve`` itself, the
queue's directory …) must not send evolve's writes outside the repository: a fire often runs as
root or a service account. So every writer opens the directory it writes in with :func:`open_dir`,
which walks the path from ``/`` (or the working directory, for a relative path) with
``O_DIRECTORY | O_NOFOLLOW`` on each component, and then creates, renames and unlinks by name
relative to that descriptor (``dir_fd=``). Nothing can swap a component for a link between the
check and the write: there is no separate check.

Roots. The paths evolve writes under are canonical when built: the repository is resolved
(``Paths.for_repo``), and a root the operator configures outside the repository (``EVOLVE_DIR``,
``EVOLVE_NEXTWORK``, ``[metrics] textfile_dir``; :func:`evolve.paths.operator_root`) is resolved
once, so a symlink the
operator made there (``/var/lib/evolve -> /srv/evolve``) is honoured. From there on no link is
followed, at any depth: a link that appears in such a path later was not the operator's choice.
An operator path under the repository is not resolved (an agent can plant links there).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from evolve.errors import UnsafePathError

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _step(fd: int, name: str, shown: Path, create: bool, mode: int) -> int:
    """Open ``name`` inside the directory ``fd`` as a directory, never through a symlink."""
    for _ in range(2):
        try:
            return os.open(name, _DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # a concurrent writer made it: fine
                os.mkdir(name, mode, dir_fd=fd)
        except OSError as exc:
            # Linux answers ELOOP for a link under O_NOFOLLOW; others ENOTDIR. Tell which it was.
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and is_link(fd, name):
                raise UnsafePathError(shown) from None
            raise
    return os.open(name, _DIR, dir_fd=fd)


def is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def open_dir(directory: Path, *, create: bool = True, mode: int = 0o777) -> int:
    """A descriptor on ``directory``, reached without following any symlink; missing components are
    created (``mode``, less the umask) when ``create``. Raises :class:`UnsafePathError` when a
    component is a symlink, ``FileNotFoundError`` when one is missing and not ``create``."""
    start = "/" if directory.is_absolute() else "."
    fd = os.open(start, _DIR)
    shown = Path(start)
    try:
        for name in directory.parts[1:] if directory.is_absolute() else directory.parts:
            if name in ("", "."):
                continue
            shown = shown / name
            nxt = _step(fd, name, shown, create, mode)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_dir(directory: Path, *, create: bool = True, mode: int = 0o777) -> Iterator[int]:
    fd = open_dir(directory, create=create, mode=mode)
    try:
        yield fd
    finally:
        os.close(fd)


def ensure_dir(directory: Path, *, mode: int = 0o777) -> Path:
    """``mkdir -p`` that refuses (:class:`UnsafePathError`) a symlink anywhere on the way."""
    os.close(open_dir(directory, mode=mode))
    return directory


def open_file(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags | O_NOFOLLOW)`` in a directory reached by :func:`open_dir` (created when
    ``flags`` has ``O_CREAT``). ``mode`` is masked by the umask, as ``os.open`` does: evolve never
    widens it afterwards (systemd's ``UMask=0027`` holds). A symlink at ``path``: UnsafePathError."""
    with opened_dir(path.parent, create=bool(flags & os.O_CREAT)) as dfd:
        try:
            return os.open(path.name, flags | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK) and is_link(dfd, path.name):
                raise UnsafePathError(path) from None
            raise



def remove(path: Path) -> bool:
    """Unlink ``path`` (a file, or a link itself) by name in its directory, reached without following
    a symlink: a linked directory on the way is refused, never reached into. False when absent."""
    try:
        with opened_dir(path.parent, create=False) as dfd:
            os.unlink(path.name, dir_fd=dfd)
    except FileNotFoundError:
        return False
    return True
