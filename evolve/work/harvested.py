"""The harvested queue ``.agents/rpi/next-work.jsonl`` (schema v1.4, SPEC §6.1).

Each line is an entry ``{source_epic, timestamp, items[], consumed, claim_status, ...}``; legacy
flat rows (an item's fields at the top level) are read too. Rewrites change only the lines they
must, keep every unknown field and every unparsable line byte for byte, are atomic, and do not
lose a line another process appended while we were rewriting.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evolve.store.atomic import fsync_dir
from evolve.work.item import ClaimLost, SourceError, WorkItem, clean_text

CONCRETE = ("bug", "tech-debt", "improvement", "feature", "pattern-fix", "task")
PROCESS = ("process-improvement", "docs", "chore")
SEVERITY = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Line:
    raw: bytes  # without the newline
    obj: dict[str, Any] | None
    changed: bool = False

    def items(self) -> list[dict[str, Any]]:
        """The line's items; a legacy flat row is its own single item."""
        if self.obj is None:
            return []
        items = self.obj.get("items")
        if isinstance(items, list):
            return [i for i in items if isinstance(i, dict)]
        if "title" in self.obj:
            return [self.obj]
        return []


def _split(data: bytes) -> list[Line]:
    out: list[Line] = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = None
        out.append(Line(raw, obj if isinstance(obj, dict) else None))
    return out


def item_ref(entry: dict[str, Any], item: dict[str, Any]) -> str:
    key = item.get("dedup_key")
    if isinstance(key, str) and key:
        return f"dedup={key}"
    epic = entry.get("source_epic") if entry is not item else item.get("source_epic")
    return f"source_epic={epic or ''}:item={item.get('title', '')}"


def item_selectable(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    if entry.get("consumed") is True or item.get("consumed") is True:
        return False
    if item.get("claim_status") not in (None, "available"):
        return False
    if item.get("status") not in (None, "ready"):
        return False
    requires = item.get("requires")
    if requires not in (None, []):
        return False
    disposition = item.get("disposition")
    if isinstance(disposition, str) and disposition.startswith("defer:"):
        return False
    return isinstance(item.get("title"), str) and bool(item["title"].strip())


def _scope_rank(item: dict[str, Any], repo_names: tuple[str, ...]) -> int | None:
    target = item.get("target_repo")
    if target in (None, ""):
        return 2
    if target == "*":
        return 1
    if isinstance(target, str) and (target in repo_names or target.rsplit("/", 1)[-1] in repo_names):
        return 0
    return None  # meant for another repository


def rank_key(item: dict[str, Any], order: int, scope: int, quality: bool) -> tuple[int, ...]:
    kind = str(item.get("type", "")).lower()
    kind_rank = 0 if kind in CONCRETE else 1 if kind in PROCESS else 0
    sev = SEVERITY.get(str(item.get("severity", "")).lower(), 3)
    if quality:
        return (min(sev, 2), scope, kind_rank, sev, order)
    return (scope, kind_rank, sev, order)


class HarvestedQueue:
    """Implements :class:`evolve.work.item.WorkSource` over ``next-work.jsonl``."""

    name = "harvested"

    def __init__(self, path: Path, repo_names: tuple[str, ...] = (), quality: bool = False) -> None:
        self.path = path
        self.repo_names = repo_names
        self.quality = quality
        self.malformed = 0

    def _read(self) -> list[Line]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc}") from exc
        lines = _split(data)
        self.malformed = sum(1 for ln in lines if ln.obj is None)
        return lines

    def candidates(self) -> list[WorkItem]:
        ranked: list[tuple[tuple[int, ...], WorkItem]] = []
        order = 0
        for line in self._read():
            for item in line.items():
                order += 1
                assert line.obj is not None
                if not item_selectable(line.obj, item):
                    continue
                scope = _scope_rank(item, self.repo_names)
                if scope is None:
                    continue
                ranked.append((rank_key(item, order, scope, self.quality), self._to_item(line.obj, item)))
        ranked.sort(key=lambda p: p[0])
        return [w for _, w in ranked]

    def preview_item(self, item: dict[str, Any]) -> WorkItem:
        """The WorkItem a not-yet-queued item would become (for --dry-run)."""
        return self._to_item({"source_epic": "evolve-generator"}, item)

    def _to_item(self, entry: dict[str, Any], item: dict[str, Any]) -> WorkItem:
        return WorkItem(
            source=self.name,
            ref=item_ref(entry, item),
            title=clean_text(item.get("title", "")),
            description=str(item.get("description", ""))[:4000],
            type=str(item.get("type", "")),
            severity=str(item.get("severity", "")),
            created_at=item.get("timestamp") or entry.get("timestamp"),
            data=item,
        )

    def existing_keys(self) -> set[str]:
        """Dedup keys and normalised titles of every item, open or consumed (for generators)."""
        from evolve.work.generators import item_keys

        keys: set[str] = set()
        for line in self._read():
            for item in line.items():
                keys |= item_keys(item)
        return keys

    # -- lifecycle -------------------------------------------------------------------------

    def _find(self, lines: list[Line], ref: str, want: Callable[[dict[str, Any], dict[str, Any]], bool]):
        for line in lines:
            for item in line.items():
                assert line.obj is not None
                if item_ref(line.obj, item) == ref and want(line.obj, item):
                    return line, item
        return None, None

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        def mutate(lines: list[Line]) -> bool:
            line, it = self._find(lines, item.ref, item_selectable)
            if line is None or it is None:
                raise ClaimLost(item.ref)
            it.update(claim_status="in_progress", claimed_by=claimer, claimed_at=now)
            line.changed = True
            return True

        self._rewrite(mutate)

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        def mutate(lines: list[Line]) -> bool:
            line, it = self._find(
                lines, item.ref, lambda e, i: i.get("claim_status") == "in_progress" and i.get("claimed_by") == claimer
            )
            if line is None or it is None or line.obj is None:
                return False
            it.update(consumed=True, claim_status="consumed", consumed_by=claimer, consumed_at=now)
            entry = line.obj
            if entry is not it and all(i.get("consumed") is True for i in line.items()):
                entry.update(consumed=True, claim_status="consumed", consumed_by=claimer, consumed_at=now)
            line.changed = True
            return True

        self._rewrite(mutate)

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        def mutate(lines: list[Line]) -> bool:
            line, it = self._find(
                lines,
                item.ref,
                lambda e, i: (
                    i.get("claim_status") == "in_progress" and (claimer is None or i.get("claimed_by") == claimer)
                ),
            )
            if line is None or it is None:
                return False
            it.update(consumed=False, claim_status="available", claimed_by=None, claimed_at=None, failed_at=now)
            line.changed = True
            return True

        self._rewrite(mutate)

    def annotate(self, item: WorkItem, now: str, **fields: Any) -> None:
        """Set scout outcome fields (``disposition``, ``status``, ``split_into``) on an open item."""

        def mutate(lines: list[Line]) -> bool:
            line, it = self._find(lines, item.ref, lambda e, i: i.get("consumed") is not True)
            if line is None or it is None:
                return False
            it.update(fields, scouted_at=now)
            line.changed = True
            return True

        self._rewrite(mutate)

    def park(self, item: WorkItem, now: str, note: str) -> None:
        """Hold an item out of selection (attempt budget spent): ``status: "blocked"``."""

        def mutate(lines: list[Line]) -> bool:
            line, it = self._find(lines, item.ref, lambda e, i: i.get("consumed") is not True)
            if line is None or it is None:
                return False
            it.update(
                status="blocked",
                claim_status="available",
                claimed_by=None,
                claimed_at=None,
                failed_at=now,
                blocked_note=note,
            )
            line.changed = True
            return True

        self._rewrite(mutate)

    def _rewrite(self, mutate: Callable[[list[Line]], bool], attempts: int = 20) -> bool:
        """Apply ``mutate`` and replace the file atomically without losing concurrent appends."""
        for _ in range(attempts):
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                mutate([])  # raises ClaimLost for a claim; nothing to finalize or release
                return False
            try:
                st = os.fstat(fd)
                data = _read_all(fd)
                lines = _split(data)
                if not mutate(lines):
                    return False
                out = b"".join((orjson.dumps(ln.obj) if ln.changed else ln.raw) + b"\n" for ln in lines)
                tmp = self._write_temp(out, st.st_mode & 0o7777)
                now_st = os.stat(self.path)
                if (now_st.st_ino, now_st.st_size, now_st.st_mtime_ns) != (st.st_ino, len(data), st.st_mtime_ns):
                    os.unlink(tmp)
                    continue  # someone wrote meanwhile: start again from the new contents
                os.replace(tmp, self.path)
                self._salvage(fd, len(data))
                fsync_dir(self.path.parent)
                return True
            finally:
                os.close(fd)
        raise SourceError(f"{self.path} kept changing; gave up rewriting after {attempts} attempts")

    def _write_temp(self, data: bytes, mode: int) -> str:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def _salvage(self, old_fd: int, seen: int) -> None:
        """Copy lines appended to the old file between our stat and our replace into the new one."""
        quiet = 0
        while quiet < 2:
            size = os.fstat(old_fd).st_size
            if size > seen:
                extra = os.pread(old_fd, size - seen, seen)
                seen = size
                if not extra.endswith(b"\n"):
                    extra += b"\n"
                append_bytes(self.path, extra)
                quiet = 0
            else:
                quiet += 1
                time.sleep(0.01)

    def append_entry(self, entry: dict[str, Any]) -> None:
        append_bytes(self.path, orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE))


def _read_all(fd: int) -> bytes:
    chunks = []
    pos = 0
    while True:
        chunk = os.pread(fd, 1 << 20, pos)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        pos += len(chunk)


def append_bytes(path: Path, data: bytes) -> None:
    """One ``os.write`` on an ``O_APPEND`` descriptor, then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
