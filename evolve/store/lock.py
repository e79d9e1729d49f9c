"""The fire lock: a kernel lock (flock) on ``fire.lock``, held for the whole fire.

The lock file is never deleted: deleting it would let two contenders lock different inodes.
Python descriptors are not inherited, so the agent child never holds the lock.
"""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock, Timeout

from evolve.store.dirfd import open_file


class FireLock:
    def __init__(self, path: Path) -> None:
        # The first write of a fire: its directory is created, and the lock file too, without
        # following a symlink (docs/DESIGN.md §2.0), so filelock (which opens with O_TRUNC, following
        # links) only ever opens our regular file; a planted link ends the fire here, one line.
        os.close(open_file(path, os.O_RDONLY | os.O_CREAT, 0o666))
        self._lock = FileLock(
            str(path),
            thread_local=False,
            preserve_lock_file=True,
            fallback_to_soft=False,
        )

    def acquire(self, wait_s: float = 0.0) -> bool:
        """True when acquired; False when another fire holds it after ``wait_s`` seconds."""
        try:
            if wait_s > 0:
                self._lock.acquire(timeout=wait_s, poll_interval=0.05)
            else:
                self._lock.acquire(blocking=False)
        except Timeout:
            return False
        return True

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def __enter__(self) -> FireLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_locked_by_other(path: Path) -> bool:
    """Liveness probe for ``status``: a fire is running when the lock cannot be taken."""
    if not path.exists():
        return False
    try:
        probe = FireLock(path)
    except OSError:  # e.g. a linked state directory: the fire refuses it and says so; status goes on
        return False
    if probe.acquire(0):
        probe.release()
        return False
    return True
