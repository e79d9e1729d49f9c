"""The append-only cycle ledger ``cycle-history.jsonl`` (docs/DESIGN.md §3).

One JSON object per line; a line counts only when it ends with ``\\n``. Appends are a single
``os.write`` on an ``O_APPEND`` descriptor followed by ``fsync``, made under the fire lock. Reading
the last N entries walks the file backwards in blocks, so its cost does not grow with the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve import crashpoint, jsonsafe, redact
from evolve.errors import LedgerError
from evolve.store.atomic import save_aside
from evolve.store.dirfd import open_file

BLOCK = 64 * 1024


@dataclass
class TailRead:
    """Entries oldest first, plus how many malformed lines were skipped on the way."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    torn: bool = False


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _complete_end(fd: int, size: int) -> int | None:
    """Offset just past the last newline when the file ends torn; None when it ends cleanly."""
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    pos = size
    while pos > 0:
        step = min(BLOCK, pos)
        pos -= step
        i = os.pread(fd, step, pos).rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0


def entry_cycle(entry: dict[str, Any]) -> int | None:
    c = entry.get("cycle")
    return c if isinstance(c, int) and not isinstance(c, bool) else None


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path

    # -- reading ---------------------------------------------------------------------------

    def _lines_backwards(self) -> Iterator[bytes | None]:
        """Complete lines from last to first; yields None first when the file ends torn."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            end = _complete_end(fd, size)
            if end is not None:
                yield None
            pos = size if end is None else end
            buf = b""
            while pos > 0:
                step = min(BLOCK, pos)
                pos -= step
                buf = os.pread(fd, step, pos) + buf
                parts = buf.split(b"\n")
                buf = parts[0]
                for line in reversed(parts[1:]):
                    if line.strip():
                        yield line
            if buf.strip():
                yield buf
        finally:
            os.close(fd)

    def raw_lines_backwards(self) -> Iterator[bytes]:
        """Complete non-blank lines from last to first, as written (a torn last line is skipped)."""
        for line in self._lines_backwards():
            if line is not None:
                yield line

    def tail(self, n: int) -> TailRead:
        """The last ``n`` well-formed entries, oldest first."""
        out = TailRead()
        if n <= 0:
            return out
        for line in self._lines_backwards():
            if line is None:
                out.torn = True
                continue
            obj = _parse(line)
            if obj is None:
                out.malformed += 1
                continue
            out.entries.append(obj)
            if len(out.entries) >= n:
                break
        out.entries.reverse()
        return out

    def last(self) -> dict[str, Any] | None:
        t = self.tail(1)
        return t.entries[-1] if t.entries else None

    def last_cycle(self) -> int:
        """The cycle number of the newest entry that carries one (0 for an empty ledger)."""
        for line in self._lines_backwards():
            if line is None:
                continue
            obj = _parse(line)
            if obj is not None and (c := entry_cycle(obj)) is not None:
                return c
        return 0

    def scan_back(self) -> Iterator[dict[str, Any]]:
        """Well-formed entries newest first, lazily (stops reading when the caller stops)."""
        for line in self._lines_backwards():
            if line is None:
                continue
            obj = _parse(line)
            if obj is not None:
                yield obj

    def iter_entries(self) -> Iterator[dict[str, Any]]:
        """Every well-formed entry, oldest first (a full scan: for history and reports only)."""
        try:
            fh = open(self.path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            return
        with fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                obj = _parse(line)
                if obj is not None:
                    yield obj

    # -- writing ---------------------------------------------------------------------------

    def repair_torn(self) -> Path | None:
        """Move a torn last line (no trailing newline) aside and truncate it away."""
        try:
            fd = open_file(self.path, os.O_RDWR)  # no symlink on the way or at the end (§2.0)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return None
            cut = _complete_end(fd, size)
            if cut is None:
                return None
            torn = os.pread(fd, size - cut, cut)
            aside = save_aside(self.path, "torn", torn)
            os.ftruncate(fd, cut)
            os.fsync(fd)
            return aside
        finally:
            os.close(fd)

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append one entry; its ``cycle`` must be greater than the last one's."""
        cycle = entry_cycle(entry)
        if cycle is None:
            raise LedgerError("ledger entry has no integer 'cycle'")
        # docs/DESIGN.md §3: a torn last line is moved aside first, or the new line would fuse with it.
        self.repair_torn()
        last = self.last_cycle()
        if cycle <= last:
            raise LedgerError(f"cycle {cycle} is not after the ledger's last cycle {last}")
        # The sink: agent reports and item titles reach entries; no secret reaches the file. (The
        # caller keeps its own object; every other sink it goes to redacts for itself.)
        line = jsonsafe.dumps(redact.current().json(entry), option=orjson.OPT_APPEND_NEWLINE)
        # No symlink planted in .agents/ (the file or a directory on the way) may redirect the
        # ledger anywhere else; 0o666 less the umask, so systemd's UMask= holds.
        fd = open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            crashpoint.reached("ledger.torn", lambda: os.write(fd, line[: len(line) // 2]))
            written = os.write(fd, line)
            if written != len(line):
                raise LedgerError(f"short write to {self.path}: {written} of {len(line)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)
        crashpoint.reached("ledger.appended")
        return entry


def entry_title(entry: dict[str, Any]) -> str:
    """An entry's item title: ``title``, or ``target`` in entries written before it was the ref."""
    title = entry.get("title")
    if isinstance(title, str) and title:
        return title
    target = entry.get("target")
    return target if isinstance(target, str) and target != entry.get("work_ref") else ""

