"""Marker files (KILL, STOP, DORMANT, HANDOFF, ...): presence, age and content, read once.

A marker's content is line 1 a UTC timestamp and line 2 a reason; upstream ``/evolve`` tooling
checks only presence and age, so evolve adds its own records as further ``key: value`` lines
(:func:`marker_text`): ``written-by: evolve <cmd>`` and, when the operator gave one,
``expires: <ISO>``. Which of them makes a marker live is decided in :mod:`evolve.cycle.halt`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from evolve.store.dirfd import remove
from evolve.timeutil import parse_iso, utc_iso

MAX_MARKER_BYTES = 64 * 1024
AUTHOR_KEY = "written-by"
EXPIRES_KEY = "expires"


@dataclass(frozen=True)
class Marker:
    path: Path
    present: bool
    age_s: float = 0.0  # now - st_mtime, never below 0
    content: str = ""
    written_age_s: float | None = None  # now - the timestamp on line 1 (None: no parsable one)
    author: str = ""  # the ``written-by:`` record ("" = written by hand or by another tool)
    expires_in_s: float | None = None  # ``expires:`` - now (None: no expiry recorded)
    bad_expiry: bool = False  # an ``expires:`` line that does not parse


def marker_text(when: float, reason: str, author: str, expires: float | None = None) -> str:
    """What ``evolve stop``/``kill`` write: the two lines upstream reads, then evolve's records."""
    lines = [utc_iso(when), reason.replace("\n", " ").strip(), f"{AUTHOR_KEY}: {author}"]
    if expires is not None:
        lines.append(f"{EXPIRES_KEY}: {utc_iso(expires)}")
    return "\n".join(lines) + "\n"


def _records(content: str) -> dict[str, str]:
    """``key: value`` lines after the reason; the first of each key wins."""
    out: dict[str, str] = {}
    for line in content.splitlines()[2:]:
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key in (AUTHOR_KEY, EXPIRES_KEY) and key not in out:
            out[key] = value.strip()
    return out


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
    lines = content.splitlines()
    written = parse_iso(lines[0].strip()) if lines else None
    rec = _records(content)
    expires = parse_iso(rec.get(EXPIRES_KEY))
    return Marker(
        path,
        True,
        max(0.0, now - st.st_mtime),
        content,
        written_age_s=None if written is None else max(0.0, now - written),
        author=rec.get(AUTHOR_KEY, "")[:100],
        expires_in_s=None if expires is None else expires - now,
        bad_expiry=EXPIRES_KEY in rec and expires is None,
    )


def remove_marker(path: Path) -> bool:
    """Remove a marker; a linked state directory is refused (docs/DESIGN.md §2.0). False when absent."""
    return remove(path)
