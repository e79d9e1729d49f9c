"""The fire lock: a kernel lock (flock) on ``fire.lock``, held for the whole fire.

The lock file is never deleted: deleting it would let two contenders lock different inodes.
Python descriptors are not inherited, so the agent child never holds the lock.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock, Timeout


class FireLock:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
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
    probe = FireLock(path)
    if probe.acquire(0):
        probe.release()
        return False
    return True
