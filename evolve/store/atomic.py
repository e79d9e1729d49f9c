"""Crash-safe file replacement: readers see the old file or the new one, never a torn one."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import orjson

from evolve import crashpoint
from evolve.store.dirfd import NOFOLLOW, is_link, open_dir, open_file, opened_dir
from evolve.timeutil import utc_stamp


def open_append(path: Path, mode: int = 0o666) -> int:
    """An ``O_APPEND`` descriptor on ``path``, created with ``mode`` less the umask; a symlink there or
    on the way down to it is refused (:class:`~evolve.errors.UnsafePathError`, errno ELOOP), never
    followed: one planted in ``.agents/`` cannot redirect our writes."""
    return open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)


def open_artifact(path: Path, mode: int = 0o600) -> int:
    """:func:`open_append` for a file only evolve writes (a run log): a symlink planted in its place
    is removed first, so the artifact is written, but never through it (a linked directory on the
    way is still refused)."""
    with opened_dir(path.parent) as dfd:
        if is_link(dfd, path.name):
            os.unlink(path.name, dir_fd=dfd)
        return os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)


def write_new(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write a file that only evolve creates and nobody else may have prepared (a prompt, a patch):
    whatever is at ``path`` (a stale copy, a planted symlink) is removed and a new file created."""
    with opened_dir(path.parent) as dfd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=dfd)
        fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"


def create_temp(dir_fd: int, name: str, mode: int) -> tuple[int, str]:
    """A new ``.<name>.XXXXXXXX.tmp`` in the directory ``dir_fd`` (the name :func:`sweep_temps`
    knows), created with ``mode`` less the umask; returns its descriptor and name."""
    for _ in range(100):
        # os.urandom, not the secrets module: that imports hashlib (~3-8 ms of `evolve status`).
        tmp = f".{name}.{''.join(_TEMP_CHARS[b % len(_TEMP_CHARS)] for b in os.urandom(8))}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | _CLOEXEC
            return os.open(tmp, flags, mode, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temp name for {name}")


def existing(dir_fd: int, name: str) -> os.stat_result | None:
    """The regular file a replacement of ``name`` supersedes; None when there is none (a symlink
    there is replaced, never written through, and its target's mode and owner are not taken)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def adopt(fd: int, old: os.stat_result) -> None:
    """Give the replacement ``fd`` the owner, group and mode of the file it replaces: a queue shared
    through a group stays writable by the other user. The owner and group are kept where permitted
    (root: always; a user: their own uid and a group they are in); the mode is kept regardless.
    chown comes first: it may clear the set-id bits a chmod then restores."""
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError:
            with contextlib.suppress(PermissionError):
                os.fchown(fd, -1, old.st_gid)
    os.fchmod(fd, old.st_mode & 0o7777)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Temp file in the same directory, fsync, rename over ``path``, fsync the directory.

    A rewrite keeps the existing file's mode, owner and group (:func:`adopt`); ``mode`` instead
    gives the file that mode (less the umask: 0o600 for private files). A new file is created with
    0o666 less the umask, never chmod-ed wider (systemd's ``UMask=0027`` holds). A symlink at
    ``path`` is replaced, never written through; one on the way to it is refused
    (:class:`~evolve.errors.UnsafePathError`): the directory is opened with :func:`open_dir` and the
    temp file is created and renamed relative to it.
    """
    with opened_dir(path.parent) as dfd:
        old = existing(dfd, path.name) if mode is None else None
        # A rewrite's temp starts private and takes the old mode only once it is ours (never wider).
        fd, tmp = create_temp(dfd, path.name, mode if mode is not None else 0o600 if old else 0o666)
        try:
            try:
                _write_all(fd, data)
                if old is not None:
                    adopt(fd, old)
                os.fsync(fd)
            finally:
                os.close(fd)
            crashpoint.reached(f"replace:{path.name}")
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)


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
        dfd = open_dir(directory, create=False)  # a linked directory is not ours to sweep
    except OSError:
        return removed
    try:
        names = os.listdir(dfd)
        for name in names:
            m = _TEMP.fullmatch(name)
            if m is None or (only is not None and m["name"] != only):
                continue
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
    finally:
        os.close(dfd)
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


def _aside_name(dir_fd: int, path: Path, label: str) -> Path:
    """``<name>.<label>-<UTC>``, with a counter when that name is taken (never overwrite)."""
    stamp = utc_stamp()
    target = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while _taken(dir_fd, target.name):
        target = path.with_name(f"{path.name}.{label}-{stamp}.{n}")
        n += 1
    return target


def _taken(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def move_aside(path: Path, label: str) -> Path:
    """Rename ``path`` to ``<name>.<label>-<UTC>`` and return the new path."""
    with opened_dir(path.parent, create=False) as dfd:
        target = _aside_name(dfd, path, label)
        os.replace(path.name, target.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    return target


def save_aside(path: Path, label: str, data: bytes) -> Path:
    """Write ``data`` next to ``path`` as ``<name>.<label>-<UTC>`` (bad bytes kept, not dropped)."""
    with opened_dir(path.parent) as dfd:
        target = _aside_name(dfd, path, label)
    atomic_write_bytes(target, data, mode=0o600)
    return target
