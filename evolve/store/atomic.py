"""Crash-safe file replacement: readers see the old file or the new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from evolve.timeutil import utc_stamp


def fsync_dir(directory: Path) -> None:
    """Make a rename or create in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Temp file in the same directory, fsync, ``os.replace``, fsync the directory.

    The existing file's permission bits are kept unless ``mode`` is given.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def dumps(obj: Any, *, pretty: bool = False) -> bytes:
    opts = orjson.OPT_APPEND_NEWLINE
    if pretty:
        opts |= orjson.OPT_INDENT_2
    return orjson.dumps(obj, option=opts)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, dumps(obj, pretty=True))


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
