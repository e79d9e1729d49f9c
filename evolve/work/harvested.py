"""The harvested queue ``.agents/rpi/next-work.jsonl`` (schema v1.4, SPEC §6.1).

Each line is an entry ``{source_epic, timestamp, items[], consumed, claim_status, ...}``; legacy
flat rows (an item's fields at the top level) are read too. Rewrites change only the lines they
must, keep every unknown field and every unparsable line byte for byte, are atomic, and do not
lose a line another process appended while we were rewriting.

The file is checked at every call (SPEC §6: re-read every source at each selection), but it is
parsed again only where it changed. :class:`HarvestedQueue` keeps an index of the file: its lines
(raw bytes), a ref → lines map and the ranked selectable items. Each call stats the file and then

* same inode, size, mtime and ctime → the index stands (unless the file was modified so close to
  our read of it that a further write could have kept the same timestamps: then its lines are read
  and compared once, as git does for "racily clean" entries);
* same inode, larger size, the last ≤ 4 KiB of the indexed region unchanged and that region ending
  in a newline → the file only grew: just the appended lines are parsed and their items ranked in
  (after a racy read, the whole indexed region is compared instead of its last 4 KiB);
* anything else → the file is parsed again from scratch.

A rewrite (claim, finalize, …) builds the new file from the index, finds its item through the ref
map, and afterwards re-ranks only the lines it changed; lines salvaged from concurrent appenders
come in through the append path. The tail check cannot see a same-length in-place edit further up
that comes with an append, so before writing the file back a rewrite compares every indexed line
if appends were taken on the tail check alone since the last full comparison.
"""

from __future__ import annotations

import bisect
import gc
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from evolve.store.atomic import fsync_dir
from evolve.work.item import ClaimLost, SourceError, WorkItem, clean_text

CONCRETE = ("bug", "tech-debt", "improvement", "feature", "pattern-fix", "task")
PROCESS = ("process-improvement", "docs", "chore")
SEVERITY = {"high": 0, "medium": 1, "low": 2}

TAIL_CHECK = 4096  # bytes at the end of the indexed region that must be unchanged to trust an append
RACY_NS = 10_000_000  # a write this close to our read may keep its timestamps (a coarse clock tick is ≤ 10 ms)
COARSE_RACY_NS = 2_000_000_000  # the same where the filesystem keeps whole seconds
_ITEM_BITS = 32  # file order of item ``ii`` of line ``li``: ``li << _ITEM_BITS | ii``
_BULK = 32  # more new ranked items than this: extend and sort instead of inserting one by one
_CHUNK = 1 << 18  # read size of a parse
_PROMOTE = 10_000  # new objects left alive by a parse above which they skip the young generations
_KEY = itemgetter(0)

Ranked = tuple[int, WorkItem]  # (packed rank key, item)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector over a bulk parse.

    Parsed JSON is acyclic, so a collection frees nothing, but its passes walk the whole growing
    heap and make a large parse super-linear. If the parse left many new objects alive (the index),
    they are moved straight to the oldest generation instead of being walked by a young collection
    (then an older one) the moment the collector is back on; a full collection still visits them.
    """
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            if gc.get_count()[0] > _PROMOTE and gc.get_freeze_count() == 0:  # (never undo someone's freeze)
                gc.freeze()  # every tracked object to the permanent generation, young counts reset …
                gc.unfreeze()  # … and back into the oldest generation
            gc.enable()


def fast_clean(text: object, limit: int = 200) -> str:
    """:func:`clean_text`, skipping its regexes when the text is already one short printable line."""
    s = text if isinstance(text, str) else str(text)
    # Printable strings hold no control or invisible characters and no whitespace but " ".
    if len(s) <= limit and s.isprintable() and "  " not in s and s.strip() == s:
        return s
    return clean_text(s, limit)


def entry_items(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A parsed line's items; a legacy flat row is its own single item."""
    items = obj.get("items")
    if isinstance(items, list):
        return [i for i in items if isinstance(i, dict)]
    if "title" in obj:
        return [obj]
    return []


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class _Read:
    """What :func:`_read_lines` read: how many bytes, and the last :data:`TAIL_CHECK` of them."""

    size = 0
    tail = b""


def _read_lines(fd: int, offset: int, done: _Read, limit: int | None = None) -> Iterator[list[bytes]]:
    """The non-blank lines (without newlines) from ``offset`` to the end of the file, or ``limit`` bytes.

    Read in chunks and yielded a chunk's lines at a time, so that each line is parsed while it is
    still in the cache and the file is never held twice (whole and as lines).
    """
    pos = offset
    end = None if limit is None else offset + limit
    carry = prev = last = b""
    while True:
        want = _CHUNK if end is None else min(_CHUNK, end - pos)
        chunk = os.pread(fd, want, pos) if want > 0 else b""
        if not chunk:
            break
        pos += len(chunk)
        prev, last = last, chunk
        parts = chunk.split(b"\n")
        if carry:
            parts[0] = carry + parts[0]
        carry = parts.pop()  # b"" when the chunk ended with a newline, else a line still being read
        lines = [raw for raw in parts if raw.strip()]
        if lines:
            yield lines
    if carry.strip():
        yield [carry]
    done.size = pos - offset
    done.tail = last[-TAIL_CHECK:] if len(last) >= TAIL_CHECK else (prev + last)[-TAIL_CHECK:]


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


def _packed_key(item: dict[str, Any], order: int, scope: int, quality: bool) -> int:
    """:func:`rank_key` as one int (each field but ``order`` is below 4): cheap to compare and untracked by the GC."""
    key = rank_key(item, order, scope, quality)
    if quality:
        return (((key[0] * 4 + key[1]) * 4 + key[2]) * 4 + key[3]) << 64 | order
    return ((key[0] * 4 + key[1]) * 4 + key[2]) << 64 | order


def _racy(mtime_ns: int, known_ns: int) -> bool:
    """True when a write after ``known_ns`` (when we knew the content) could leave ``mtime_ns`` as it is."""
    window = COARSE_RACY_NS if mtime_ns % 1_000_000_000 == 0 else RACY_NS
    return mtime_ns >= known_ns - window


def _sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Edit:
    """One rewrite's view of the file: items found through the ref map, lines parsed on demand."""

    def __init__(self, queue: HarvestedQueue) -> None:
        self.queue = queue
        self.changed: dict[int, dict[str, Any]] = {}

    def find(
        self, ref: str, want: Callable[[dict[str, Any], dict[str, Any]], bool]
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """The first item in file order with this ref that ``want`` accepts: ``(line, entry, item)``."""
        lines = self.queue._refs.get(ref)
        if lines is None:
            return None
        for li in (lines,) if isinstance(lines, int) else lines:
            entry = self.changed.get(li) or _parse(self.queue._raw[li])
            if entry is None:
                continue
            for item in entry_items(entry):
                if item_ref(entry, item) == ref and want(entry, item):
                    return li, entry, item
        return None

    def mark(self, li: int, entry: dict[str, Any]) -> None:
        self.changed[li] = entry


class HarvestedQueue:
    """Implements :class:`evolve.work.item.WorkSource` over ``next-work.jsonl``."""

    name = "harvested"

    def __init__(self, path: Path, repo_names: tuple[str, ...] = (), quality: bool = False) -> None:
        self.path = path
        self.repo_names = repo_names
        self.quality = quality
        self._forget()

    # -- the index ---------------------------------------------------------------------------

    def _forget(self) -> None:
        """Drop the index: the next call parses the file from scratch."""
        self._ino: int | None = None  # inode the index describes; None: no index
        self._sig: tuple[int, int, int, int] | None = None  # the stat it matches exactly, when known
        self._racy = True  # the stat alone cannot prove the file unchanged
        self._unverified = False  # appends were taken on the last 4 KiB alone since every line was compared
        self._size = 0  # bytes of the file the index covers
        self._tail = b""  # the last TAIL_CHECK of them
        self._raw: list[bytes] = []  # non-blank lines, without newlines
        self._refs: dict[str, int | list[int]] = {}  # item ref → line(s), ascending
        self._keys: list[int] = []  # packed rank keys of the selectable items, ascending
        self._items: list[WorkItem] = []  # those items, in the same order
        self.malformed = 0

    def _refresh(self) -> None:
        """Make the index describe the file as it is now."""
        known = time.time_ns()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget()
            return
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc}") from exc
        try:
            self._sync(fd, os.fstat(fd), known)
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc}") from exc
        finally:
            os.close(fd)

    def _sync(self, fd: int, st: os.stat_result, known: int, *, strict: bool = False) -> None:
        """Reuse, extend or rebuild the index for the open file ``fd`` (stat ``st``, read after ``known``).

        ``strict`` (before a rewrite, which writes the file back from the index): if appends were
        taken on the strength of the last 4 KiB alone, compare every indexed line first, so that an
        in-place edit further up is never written over.
        """
        try:
            if st.st_ino == self._ino:
                sig = _sig(st)
                trusted = not self._racy and not (strict and self._unverified)
                if sig == self._sig and trusted:
                    return
                if st.st_size == self._size and self._sig in (None, sig):
                    if self._same_lines(fd):
                        self._unverified = False
                        self._record(st, known)
                        return
                elif st.st_size > self._size and (self._size == 0 or self._tail.endswith(b"\n")):
                    if trusted and self._same_tail(fd):
                        self._unverified = True
                        self._append(fd, st, known)
                        return
                    if not trusted and self._same_lines(fd):
                        self._unverified = False
                        self._append(fd, st, known)
                        return
            self._rebuild(fd, st, known)
        except BaseException:
            self._forget()
            raise

    def _same_tail(self, fd: int) -> bool:
        n = len(self._tail)
        return os.pread(fd, n, self._size - n) == self._tail

    def _same_lines(self, fd: int) -> bool:
        """The indexed region, read again, holds exactly the indexed lines."""
        done = _Read()
        raws = [raw for lines in _read_lines(fd, 0, done, self._size) for raw in lines]
        if done.size != self._size or raws != self._raw:
            return False
        self._tail = done.tail
        return True

    def _record(self, st: os.stat_result, known: int) -> None:
        self._ino = st.st_ino
        if self._size == st.st_size:
            self._sig = _sig(st)
            self._racy = _racy(st.st_mtime_ns, known)
        else:  # the file grew while we read it: the next call takes the append path
            self._sig = None
            self._racy = True

    def _rebuild(self, fd: int, st: os.stat_result, known: int) -> None:
        self._forget()
        done = _Read()
        ranked = self._index(fd, 0, done)
        ranked.sort(key=_KEY)
        self._keys = [k for k, _ in ranked]
        self._items = [w for _, w in ranked]
        self._size, self._tail = done.size, done.tail
        self._record(st, known)

    def _append(self, fd: int, st: os.stat_result, known: int) -> None:
        done = _Read()
        self._insert(self._index(fd, self._size, done))
        self._size += done.size
        self._tail = (self._tail + done.tail)[-TAIL_CHECK:]
        self._record(st, known)

    def _index(self, fd: int, offset: int, done: _Read) -> list[Ranked]:
        """Read and parse the lines from ``offset`` on, appending them to the index: their refs mapped,
        the malformed counted; returns their ranked items, unsorted."""
        out: list[Ranked] = []
        raws = self._raw
        with gc_paused():
            for lines in _read_lines(fd, offset, done):
                li = len(raws)
                raws.extend(lines)
                for raw in lines:
                    obj = _parse(raw)
                    if obj is None:
                        self.malformed += 1
                    else:
                        self._scan(li, obj, out)
                    li += 1
        return out

    def _scan(self, li: int, entry: dict[str, Any], out: list[Ranked]) -> None:
        """Map the refs of line ``li``'s items and rank its selectable ones into ``out``."""
        refs = self._refs
        open_entry = entry.get("consumed") is not True
        for ii, item in enumerate(entry_items(entry)):
            ref = item_ref(entry, item)
            have = refs.get(ref)
            if have is None:
                refs[ref] = li
            elif isinstance(have, int):
                if have != li:
                    refs[ref] = [have, li] if have < li else [li, have]
            elif have[-1] < li:
                have.append(li)
            else:
                k = bisect.bisect_left(have, li)
                if have[k] != li:
                    have.insert(k, li)
            if open_entry and item_selectable(entry, item):
                scope = _scope_rank(item, self.repo_names)
                if scope is not None:
                    out.append(
                        (_packed_key(item, li << _ITEM_BITS | ii, scope, self.quality), self._to_item(entry, item, ref))
                    )

    def _unindex(self, li: int, entry: dict[str, Any]) -> None:
        """Take line ``li`` (as ``entry``, its content when indexed) out of the ref map and the ranking."""
        keys = self._keys
        for ii, item in enumerate(entry_items(entry)):
            ref = item_ref(entry, item)
            have = self._refs.get(ref)
            if have == li:
                del self._refs[ref]
            elif isinstance(have, list) and li in have:
                have.remove(li)
                if len(have) == 1:
                    self._refs[ref] = have[0]
            if item_selectable(entry, item):
                scope = _scope_rank(item, self.repo_names)
                if scope is not None:
                    key = _packed_key(item, li << _ITEM_BITS | ii, scope, self.quality)
                    k = bisect.bisect_left(keys, key)
                    if k < len(keys) and keys[k] == key:
                        del keys[k]
                        del self._items[k]

    def _insert(self, new: list[Ranked]) -> None:
        """Rank new items in (their keys are new: their lines were not indexed, or were unindexed)."""
        if len(new) > _BULK:
            new.extend(zip(self._keys, self._items, strict=True))
            new.sort(key=_KEY)
            self._keys = [k for k, _ in new]
            self._items = [w for _, w in new]
            return
        for key, item in new:
            k = bisect.bisect_left(self._keys, key)
            self._keys.insert(k, key)
            self._items.insert(k, item)

    # -- WorkSource --------------------------------------------------------------------------

    def candidates(self) -> list[WorkItem]:
        self._refresh()
        return list(self._items)

    def preview_item(self, item: dict[str, Any]) -> WorkItem:
        """The WorkItem a not-yet-queued item would become (for --dry-run)."""
        return self._to_item({"source_epic": "evolve-generator"}, item)

    def _to_item(self, entry: dict[str, Any], item: dict[str, Any], ref: str | None = None) -> WorkItem:
        return WorkItem(
            source=self.name,
            ref=item_ref(entry, item) if ref is None else ref,
            title=fast_clean(item.get("title", "")),
            description=str(item.get("description", ""))[:4000],
            type=str(item.get("type", "")),
            severity=str(item.get("severity", "")),
            created_at=item.get("timestamp") or entry.get("timestamp"),
            data=item,
        )

    def existing_keys(self) -> set[str]:
        """Dedup keys and normalised titles of every item, open or consumed (for generators)."""
        from evolve.work.generators import item_keys

        self._refresh()
        keys: set[str] = set()
        with gc_paused():
            for raw in self._raw:
                entry = _parse(raw)
                if entry is not None:
                    for item in entry_items(entry):
                        keys |= item_keys(item)
        return keys

    # -- lifecycle -------------------------------------------------------------------------

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        def mutate(edit: _Edit) -> bool:
            found = edit.find(item.ref, item_selectable)
            if found is None:
                raise ClaimLost(item.ref)
            li, entry, it = found
            it.update(claim_status="in_progress", claimed_by=claimer, claimed_at=now)
            edit.mark(li, entry)
            return True

        self._rewrite(mutate)

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        def mutate(edit: _Edit) -> bool:
            found = edit.find(
                item.ref, lambda e, i: i.get("claim_status") == "in_progress" and i.get("claimed_by") == claimer
            )
            if found is None:
                return False
            li, entry, it = found
            it.update(consumed=True, claim_status="consumed", consumed_by=claimer, consumed_at=now)
            if entry is not it and all(i.get("consumed") is True for i in entry_items(entry)):
                entry.update(consumed=True, claim_status="consumed", consumed_by=claimer, consumed_at=now)
            edit.mark(li, entry)
            return True

        self._rewrite(mutate)

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        def mutate(edit: _Edit) -> bool:
            found = edit.find(
                item.ref,
                lambda e, i: (
                    i.get("claim_status") == "in_progress" and (claimer is None or i.get("claimed_by") == claimer)
                ),
            )
            if found is None:
                return False
            li, entry, it = found
            it.update(consumed=False, claim_status="available", claimed_by=None, claimed_at=None, failed_at=now)
            edit.mark(li, entry)
            return True

        self._rewrite(mutate)

    def annotate(self, item: WorkItem, now: str, **fields: Any) -> None:
        """Set scout outcome fields (``disposition``, ``status``, ``split_into``) on an open item."""

        def mutate(edit: _Edit) -> bool:
            found = edit.find(item.ref, lambda e, i: i.get("consumed") is not True)
            if found is None:
                return False
            li, entry, it = found
            it.update(fields, scouted_at=now)
            edit.mark(li, entry)
            return True

        self._rewrite(mutate)

    def park(self, item: WorkItem, now: str, note: str) -> None:
        """Hold an item out of selection (attempt budget spent): ``status: "blocked"``."""

        def mutate(edit: _Edit) -> bool:
            found = edit.find(item.ref, lambda e, i: i.get("consumed") is not True)
            if found is None:
                return False
            li, entry, it = found
            it.update(
                status="blocked",
                claim_status="available",
                claimed_by=None,
                claimed_at=None,
                failed_at=now,
                blocked_note=note,
            )
            edit.mark(li, entry)
            return True

        self._rewrite(mutate)

    def _rewrite(self, mutate: Callable[[_Edit], bool], attempts: int = 20) -> bool:
        """Apply ``mutate`` and replace the file atomically without losing concurrent appends."""
        for attempt in range(attempts):
            known = time.time_ns()
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                self._forget()
                mutate(_Edit(self))  # raises ClaimLost for a claim; nothing to finalize or release
                return False
            try:
                st = os.fstat(fd)
                self._sync(fd, st, known, strict=True)  # the index now holds bytes [0, self._size) of this file
                edit = _Edit(self)
                if not mutate(edit):
                    return False
                raws = self._raw.copy()
                for li, entry in edit.changed.items():
                    raws[li] = orjson.dumps(entry)
                out = b"\n".join(raws) + b"\n" if raws else b""
                tmp, tmp_st = self._write_temp(out, st.st_mode & 0o7777)
                now_st = os.stat(self.path)
                if (now_st.st_ino, now_st.st_size, now_st.st_mtime_ns) != (st.st_ino, self._size, st.st_mtime_ns):
                    os.unlink(tmp)
                    time.sleep(min(0.05, 0.001 * (1 << attempt)))  # let a burst of writes pass
                    continue  # someone wrote meanwhile: start again from the new contents
                replaced = time.time_ns()
                os.replace(tmp, self.path)
                self._salvage(fd, self._size)
                fsync_dir(self.path.parent)
                self._replaced(edit, raws, out, tmp_st, replaced)
                return True
            finally:
                os.close(fd)
        raise SourceError(f"{self.path} kept changing; gave up rewriting after {attempts} attempts")

    def _replaced(self, edit: _Edit, raws: list[bytes], out: bytes, tmp_st: os.stat_result, replaced: int) -> None:
        """Update the index to the file we just put in place: re-rank the changed lines only."""
        try:
            with gc_paused():
                for li, entry in edit.changed.items():
                    before = _parse(self._raw[li])
                    if before is not None:
                        self._unindex(li, before)
                    new: list[Ranked] = []
                    self._scan(li, entry, new)
                    self._insert(new)
            self._raw = raws
            self._size = len(out)
            self._tail = out[-TAIL_CHECK:]
            st = os.stat(self.path)
            if st.st_ino != tmp_st.st_ino or st.st_size < len(out):
                self._forget()  # replaced or truncated by someone else already
                return
            self._ino = tmp_st.st_ino
            self._racy = _racy(tmp_st.st_mtime_ns, replaced)
            if st.st_size == len(out) and st.st_mtime_ns == tmp_st.st_mtime_ns:
                self._sig = _sig(st)
            else:
                self._sig = None  # salvaged or freshly appended lines: the append path parses them
            self._refresh()
        except (OSError, SourceError):
            self._forget()

    def _write_temp(self, data: bytes, mode: int) -> tuple[str, os.stat_result]:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return tmp, st

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


def append_bytes(path: Path, data: bytes) -> None:
    """One ``os.write`` on an ``O_APPEND`` descriptor, then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
