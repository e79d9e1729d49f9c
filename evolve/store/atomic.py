"""Crash-safe file replacement: readers see the old file or the new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from evolve import crashpoint
from evolve.timeutil import utc_stamp


def fsync_dir(directory: Path) -> None:
    """Make a rename or create in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_append(path: Path, mode: int = 0o644) -> int:
    """An ``O_APPEND`` descriptor on ``path``, created with ``mode``; a symlink there is refused
    (``OSError``, ELOOP), never followed: one planted in ``.agents/`` cannot redirect our writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, mode)


def _drop_symlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)


def open_artifact(path: Path, mode: int = 0o600) -> int:
    """:func:`open_append` for a file only evolve writes (a run log): a symlink planted in its place
    is removed first, so the artifact is written, but never through it."""
    _drop_symlink(path)
    return open_append(path, mode)


def write_new(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write a file that only evolve creates and nobody else may have prepared (a prompt, a patch):
    whatever is at ``path`` (a stale copy, a planted symlink) is removed and a new file created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Temp file in the same directory, fsync, ``os.replace``, fsync the directory.

    The existing file's permission bits are kept unless ``mode`` is given. A symlink at ``path`` is
    replaced, never written through (and its target's mode is not taken).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            st = os.lstat(path)
            mode = 0o644 if stat.S_ISLNK(st.st_mode) else st.st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        crashpoint.reached(f"replace:{path.name}")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


# ``tempfile.mkstemp(prefix=".<name>.", suffix=".tmp")``: eight characters of [a-z0-9_] in between.
_TEMP = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def sweep_temps(directory: Path, *, older_than_s: float, only: str | None = None) -> list[str]:
    """Remove the temp files of replacements that never happened: their writer died between writing
    the temp file and renaming it (the file it was replacing is still whole). Only files older than
    ``older_than_s`` are touched, so a replacement in progress is never disturbed; ``only``: just the
    temps of that file name. Returns the names removed."""
    removed: list[str] = []
    cutoff = time.time() - older_than_s
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _TEMP.fullmatch(name)
        if m is None or (only is not None and m["name"] != only):
            continue
        path = directory / name
        with contextlib.suppress(OSError):
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                path.unlink()
                removed.append(name)
    return removed


def dumps(obj: Any, *, pretty: bool = False) -> bytes:
    opts = orjson.OPT_APPEND_NEWLINE
    if pretty:
        opts |= orjson.OPT_INDENT_2
    return orjson.dumps(obj, option=opts)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, dumps(obj, pretty=True))


def read_json(path: Path) -> Any:
    """What :func:`write_json` wrote; None when the file is missing, unreadable or not JSON."""
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _aside_name(path: Path, label: str) -> Path:
    """``<name>.<label>-<UTC>``, with a counter when that name is taken (never overwrite)."""
    stamp = utc_stamp()
    target = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{label}-{stamp}.{n}")
        n += 1
    return target


def move_aside(path: Path, label: str) -> Path:
    """Rename ``path`` to ``<name>.<label>-<UTC>`` and return the new path."""
    target = _aside_name(path, label)
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


def save_aside(path: Path, label: str, data: bytes) -> Path:
    """Write ``data`` next to ``path`` as ``<name>.<label>-<UTC>`` (bad bytes kept, not dropped)."""
    target = _aside_name(path, label)
    atomic_write_bytes(target, data, mode=0o600)
    return target
