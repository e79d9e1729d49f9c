"""Marker files (KILL, STOP, DORMANT, HANDOFF, ...): presence, age and content, read once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from evolve.store.dirfd import remove

MAX_MARKER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Marker:
    path: Path
    present: bool
    age_s: float = 0.0
    content: str = ""

    def fresh(self, ttl_s: float) -> bool:
        """Present and not older than ``ttl_s`` seconds (compared in seconds, not rounded days)."""
        return self.present and self.age_s <= ttl_s


def read_marker(path: Path, now: float) -> Marker:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Marker(path, False)
    content = ""
    try:
        with open(path, "rb") as fh:
            content = fh.read(MAX_MARKER_BYTES).decode("utf-8", "replace")
    except (IsADirectoryError, PermissionError):
        pass
    return Marker(path, True, max(0.0, now - st.st_mtime), content)


def remove_marker(path: Path) -> bool:
    """Remove a marker; a linked state directory is refused (docs/DESIGN.md §2.0). False when absent."""
    return remove(path)
