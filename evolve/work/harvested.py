"""The harvested queue ``.agents/rpi/next-work.jsonl`` (schema v1.4, docs/DESIGN.md §6.1).

Each line is an entry ``{source_epic, timestamp, items[], consumed, claim_status, ...}``; legacy
flat rows (an item's fields at the top level) are read too. Edits change only the line they must,
in place (:mod:`evolve.store.inplace`: same offset, same length, or a copy appended and a tombstone
left), keep every unknown field, every unparsable line and every blank line byte for byte, survive a
crash through a redo journal, and never lose a line another process appended, however it appends.

Memory stays a few bytes per line and per item however large the file grows (a queue of 10^5 items
is ~64 MB of JSON): :class:`HarvestedQueue` never holds the file or its parsed lines. Its index is
where each non-blank line starts and ends, a SHA-256 of the bytes it covers and their last 4 KiB,
and the rank keys of the selectable items — ints that also say which line and item they are.
:meth:`HarvestedQueue.candidates` hands out a :class:`~evolve.work.item.LazyItems` that parses a
line only when the ladder reads one of its items, from the very file the index describes (the view
keeps it open); a rewrite streams the old file into the new one, replacing only the changed lines.

The file is checked at every call (docs/DESIGN.md §6: re-read every source at each selection), but it is
parsed again only where it changed. Each call stats the file and then

* same inode, size, mtime and ctime → the index stands (unless the file was modified so close to
  our read of it that a further write could have kept the same timestamps: then its bytes are
  hashed again and compared once, as git does for "racily clean" entries);
* same inode, larger size, the last ≤ 4 KiB of the indexed region unchanged and that region ending
  in a newline → the file only grew: just the appended lines are parsed and their items ranked in
  (after a racy read, the whole indexed region's hash is compared instead of its last 4 KiB);
* anything else → the file is parsed again from scratch.

An edit (claim, finalize, …) finds its item where the selection found it (``WorkItem.locator``,
checked against the line) or else by scanning the file, and afterwards re-ranks only the line it
changed; a moved line's copy comes in through the append path. The tail check cannot see a
same-length in-place edit further up that comes with an append, so before an edit the whole region's
hash is compared if appends were taken on the tail check alone, and whenever the redo journal's stat
changed (another editor's edit).

The byte-level mechanics (chunked reads, hashes, the racy-stat test, appends) are in
:mod:`evolve.store.jsonl`; this module holds the queue's schema, its ranking and its index.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import hashlib
import heapq
import math
import os
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.results import FAILURES, CycleResult
from evolve.store import inplace
from evolve.store.atomic import create_temp
from evolve.store.dirfd import NOFOLLOW, is_link, open_dir
from evolve.store.jsonl import (
    Read,
    append_bytes,
    chunks,
    gc_paused,
    hash_region,
    keep_tail,
    objects,
    parse_object,
    racy,
    read_lines,
    rehash,
    stat_sig,
)
from evolve.timeutil import parse_iso
from evolve.work.item import ClaimLost, LazyItems, SourceError, WorkItem, fast_clean, item_keys

CONCRETE = ("bug", "tech-debt", "improvement", "feature", "pattern-fix", "task")
PROCESS = ("process-improvement", "docs", "chore")
SEVERITY = {"high": 0, "medium": 1, "low": 2}
RETRY_REASONS = FAILURES | {CycleResult.REGRESSED}  # a release for these stamps failed_at

_ITEM_BITS = 32  # file order of item ``ii`` of line ``li``: ``li << _ITEM_BITS | ii``
_LOW = (1 << _ITEM_BITS) - 1
_BULK = 32  # more new ranked items than this: extend and sort instead of inserting one by one
_VIEW_CACHE = 64  # parsed lines a candidates view keeps (items of one line are often read together)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def entry_items(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A parsed line's items; a legacy flat row is its own single item."""
    items = obj.get("items")
    if isinstance(items, list):
        return [i for i in items if isinstance(i, dict)]
    if "title" in obj:
        return [obj]
    return []


def read_entries(path: Path) -> Iterator[dict[str, Any]]:
    """Every parsable entry of the queue at ``path``, streamed (for readers that count or list; the
    malformed lines are skipped, not repaired). Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        yield from objects(fd)
    finally:
        os.close(fd)


def item_ref(entry: dict[str, Any], item: dict[str, Any]) -> str:
    key = item.get("dedup_key")
    if isinstance(key, str) and key:
        return f"dedup={key}"
    epic = entry.get("source_epic") if entry is not item else item.get("source_epic")
    return f"source_epic={epic or ''}:item={item.get('title', '')}"


def same_ref(on_disk: str, ref: str) -> bool:
    """Whether a ref read from the queue is ``ref``, or is ``ref`` once redacted: session-state and
    the ledger hold refs redacted (a title may carry a secret), the operator's queue keeps its own."""
    if on_disk == ref:
        return True
    return redact.MASK in ref and redact.current().text(on_disk) == ref


def claimed_at(item: dict[str, Any]) -> float:
    """When an ``in_progress`` item was claimed (epoch seconds): its ``claimed_at`` as ISO 8601 or as
    epoch seconds; ``-inf`` when missing or unparsable, so the claim counts as stale at once (every
    v1.4 writer dates its claims; one that cannot be dated could otherwise never expire)."""
    raw = item.get("claimed_at")
    if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    at = parse_iso(raw)
    return at if at is not None else -math.inf


def claim_stale(at: float, now: float, visibility_s: float | None) -> bool:
    """An ``in_progress`` claim made at ``at`` no longer holds at ``now``: older than the visibility
    timeout, or dated more than that far in the future (a clock that far off is no date at all).
    ``visibility_s`` None: claims never expire."""
    if visibility_s is None:
        return False
    return now - at >= visibility_s or at - now > visibility_s


def entry_closed(entry: dict[str, Any]) -> bool:
    """The entry's aggregate hides all its items: it says ``consumed`` (the flag or ``claim_status``)
    and no item carries a lifecycle of its own.

    Item lifecycle is authoritative (schema v1.4: the entry fields are aggregates for dashboards and
    legacy readers): once any item has ``consumed`` or ``claim_status``, the aggregate is recomputed
    from the items, so a stale ``consumed: true`` over an ``available`` item hides no work.
    """
    if entry.get("consumed") is not True and entry.get("claim_status") != "consumed":
        return False
    items = entry.get("items")
    if not isinstance(items, list):
        return True  # a legacy flat row is its own item: its fields are the item's lifecycle
    return not any(isinstance(i, dict) and ("consumed" in i or "claim_status" in i) for i in items)


def _open_item(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    """Selectable but for its claim: everything :func:`item_selectable` checks except ``claim_status``."""
    if item.get("consumed") is True or entry_closed(entry):
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


def item_selectable(
    entry: dict[str, Any], item: dict[str, Any], now: float | None = None, visibility_s: float | None = None
) -> bool:
    """The item may be claimed now: open, and unclaimed or (given ``now`` and ``visibility_s``) under an
    ``in_progress`` claim that has gone stale — another tool's, or a dead evolve's whose state was lost.
    evolve's own live claim needs no timeout: the fire lock keeps a second fire out of this repo."""
    if not _open_item(entry, item):
        return False
    status = item.get("claim_status")
    if status in (None, "available"):
        return True
    return status == "in_progress" and now is not None and claim_stale(claimed_at(item), now, visibility_s)


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
    """Repo bucket, then freshness (an item that failed before, ``failed_at`` set, after the fresh
    ones: upstream's freshness rank, so a failing item cannot starve fresh work), then kind, severity
    and file order. ``--quality`` puts the severity band first."""
    kind = str(item.get("type", "")).lower()
    kind_rank = 0 if kind in CONCRETE else 1 if kind in PROCESS else 0
    sev = SEVERITY.get(str(item.get("severity", "")).lower(), 3)
    retry = 0 if item.get("failed_at") in (None, "") else 1
    if quality:
        return (min(sev, 2), scope, retry, kind_rank, sev, order)
    return (scope, retry, kind_rank, sev, order)


def _packed_key(item: dict[str, Any], order: int, scope: int, quality: bool) -> int:
    """:func:`rank_key` as one int (each field but ``order`` is below 4): cheap to compare and untracked by the GC."""
    key = rank_key(item, order, scope, quality)
    packed = 0
    for field in key[:-1]:
        packed = packed * 4 + field
    return packed << 64 | order


def _where(key: int) -> tuple[int, int]:
    """``(line, item)`` of a packed rank key."""
    return (key >> _ITEM_BITS) & _LOW, key & _LOW


class _View:
    """The file as the index last saw it, kept open, turning rank keys into WorkItems on demand.

    Lines are edited in place (same length, same offset), so these offsets stay valid; a line edited
    since it was indexed parses as something else, and :meth:`item` then hands out a ref no claim
    accepts.
    """

    def __init__(self, queue: HarvestedQueue, fd: int, keys: list[int]) -> None:
        self._queue = queue
        self._fd = fd
        weakref.finalize(self, os.close, fd)
        self._keys = keys
        self._starts = array("q", queue._starts)
        self._ends = array("q", queue._ends)
        self._cache: dict[int, dict[str, Any] | None] = {}

    def _line(self, li: int) -> dict[str, Any] | None:
        if li in self._cache:
            return self._cache[li]
        start = self._starts[li]
        entry = parse_object(os.pread(self._fd, self._ends[li] - start, start))
        if len(self._cache) >= _VIEW_CACHE:
            del self._cache[next(iter(self._cache))]
        self._cache[li] = entry
        return entry

    def item(self, i: int) -> WorkItem:
        li, ii = _where(self._keys[i])
        entry = self._line(li)
        if entry is not None and ii < len(items := entry_items(entry)):
            return self._queue._to_item(entry, items[ii], locator=(li, ii))
        # Only an in-place edit of a file we just read gets here; a claim of this ref is then refused.
        return WorkItem(source=self._queue.name, ref=f"changed-on-disk:line={li + 1}:item={ii + 1}", title="")


class _Edit:
    """One rewrite's view of the file: it finds the item to change and records the lines it changed."""

    def __init__(self, queue: HarvestedQueue, fd: int | None) -> None:
        self.queue = queue
        self.fd = fd
        self.changed: dict[int, dict[str, Any]] = {}  # line → its new content
        self.before: dict[int, bytes] = {}  # line → its bytes in the file being rewritten

    def _raw(self, li: int) -> bytes:
        assert self.fd is not None
        start = self.queue._starts[li]
        return os.pread(self.fd, self.queue._ends[li] - start, start)

    def _entry(self, li: int, raw: bytes | None = None) -> dict[str, Any] | None:
        if li in self.changed:
            return self.changed[li]
        return parse_object(self._raw(li) if raw is None else raw)

    def find(
        self, item: WorkItem, want: Callable[[dict[str, Any], dict[str, Any]], bool]
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """``item`` where the selection saw it if it is still there and ``want`` accepts it, else the
        first item in file order with its ref that ``want`` accepts: ``(line, entry, item)``."""
        if self.fd is None:
            return None
        ref = item.ref
        hint = item.locator
        if isinstance(hint, tuple) and len(hint) == 2 and 0 <= hint[0] < len(self.queue._starts):
            li, ii = hint
            entry = self._entry(li)
            if entry is not None and isinstance(ii, int):
                items = entry_items(entry)
                if 0 <= ii < len(items) and same_ref(item_ref(entry, items[ii]), ref) and want(entry, items[ii]):
                    return li, entry, items[ii]
        starts = self.queue._starts
        with gc_paused():
            for at, lines in read_lines(self.fd, 0, Read(), self.queue._size):
                for start, raw in zip(at, lines, strict=True):
                    # The index may still count a line since blanked in place: match by offset.
                    li = bisect.bisect_left(starts, start)
                    entry = self._entry(li, raw) if li < len(starts) and starts[li] == start else None
                    if entry is not None:
                        for it in entry_items(entry):
                            if same_ref(item_ref(entry, it), ref) and want(entry, it):
                                return li, entry, it
        return None

    def mark(self, li: int, entry: dict[str, Any]) -> None:
        if li not in self.before:
            self.before[li] = self._raw(li)
        self.changed[li] = entry


class HarvestedQueue:
    """Implements :class:`evolve.work.item.WorkSource` over ``next-work.jsonl``."""

    name = "harvested"

    def __init__(
        self,
        path: Path,
        repo_names: tuple[str, ...] = (),
        quality: bool = False,
        *,
        claim_visibility_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.repo_names = repo_names
        self.quality = quality
        # How long an in_progress claim found in the file holds (None: for ever), measured on ``clock``.
        self.claim_visibility_s = claim_visibility_s
        self.clock = clock
        self._jsig: tuple[int, int, int] | None = None  # the redo journal's stat when the index was last checked
        self._forget()

    # -- the index ---------------------------------------------------------------------------

    def _forget(self) -> None:
        """Drop the index: the next call parses the file from scratch."""
        self._ino: int | None = None  # inode the index describes; None: no index
        self._sig: tuple[int, int, int, int] | None = None  # the stat it matches exactly, when known
        self._racy = True  # the stat alone cannot prove the file unchanged
        self._unverified = False  # appends were taken on the last 4 KiB alone since the whole region was compared
        self._size = 0  # bytes of the file the index covers
        self._tail = b""  # the last TAIL_CHECK of them
        self._digest = hashlib.sha256()  # … and their hash, open for appended bytes
        self._starts: array[int] = array("q")  # where each non-blank line starts
        self._ends: array[int] = array("q")  # … and ends (before its newline)
        self._keys: list[int] = []  # packed rank keys of the selectable items, ascending
        # Items selectable but for an in_progress claim: packed rank key → when claimed. Few, and whether
        # each has gone stale depends on the time of the call, so they are checked at each candidates().
        self._claims: dict[int, float] = {}
        self.malformed = 0

    @property
    def lines(self) -> int:
        """Non-blank lines in the file as last read."""
        return len(self._starts)

    def _open(self) -> int | None:
        """The file open, with the index made to describe it (the caller closes it); None: no file."""
        known = time.time_ns()
        jsig = self._journal_sig()  # before the read: an edit during it shows at the next call
        if jsig != self._jsig and jsig is not None:
            self._recover()  # (cheap when the journal says "done": one small read)
            jsig = self._journal_sig()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget()
            return None
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc}") from exc
        try:
            self._sync(fd, os.fstat(fd), known, foreign=jsig != self._jsig)
            self._jsig = jsig
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise SourceError(f"cannot read {self.path}: {exc}") from exc
            raise
        return fd

    def _journal_sig(self) -> tuple[int, int, int] | None:
        """The stat of the queue's redo journal, replaced by every in-place edit (:mod:`evolve.store.inplace`)."""
        try:
            st = os.stat(self.path.with_name(f".{self.path.name}.redo"), follow_symlinks=False)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def _refresh(self) -> None:
        fd = self._open()
        if fd is not None:
            os.close(fd)

    def _sync(self, fd: int, st: os.stat_result, known: int, *, strict: bool = False, foreign: bool = False) -> None:
        """Reuse, extend or rebuild the index for the open file ``fd`` (stat ``st``, read after ``known``).

        ``strict`` (before an edit, which writes at the index's line positions): if appends were
        taken on the strength of the last 4 KiB alone, compare the whole region first. ``foreign``:
        another editor changed lines in place (the redo journal was replaced), so the stat and the
        tail prove nothing: compare the whole region.
        """
        try:
            if st.st_ino == self._ino:
                sig = stat_sig(st)
                trusted = not self._racy and not (strict and self._unverified) and not foreign
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
        """The indexed region, read again, holds exactly the bytes indexed (its hash is the same)."""
        digest, done = hash_region(fd, self._size)
        if done.size != self._size or digest != self._digest.digest():
            return False
        self._tail = done.tail
        return True

    def _record(self, st: os.stat_result, known: int) -> None:
        self._ino = st.st_ino
        if self._size == st.st_size:
            self._sig = stat_sig(st)
            self._racy = racy(st.st_mtime_ns, known)
        else:  # the file grew while we read it: the next call takes the append path
            self._sig = None
            self._racy = True

    def _rebuild(self, fd: int, st: os.stat_result, known: int) -> None:
        self._forget()
        done = Read()
        keys = self._index(fd, 0, done)
        keys.sort()
        self._keys = keys
        self._size, self._tail = done.size, done.tail
        self._record(st, known)

    def _append(self, fd: int, st: os.stat_result, known: int) -> None:
        done = Read()
        self._insert(self._index(fd, self._size, done))
        self._size += done.size
        self._tail = keep_tail(self._tail, done.tail)
        self._record(st, known)

    def _index(self, fd: int, offset: int, done: Read) -> list[int]:
        """Read, hash and parse the lines from ``offset`` on, adding their positions to the index and
        counting the malformed; returns the rank keys of their selectable items, unsorted."""
        out: list[int] = []
        starts, ends = self._starts, self._ends
        with gc_paused():
            for at, lines in read_lines(fd, offset, done, digest=self._digest):
                li = len(starts)
                for start, raw in zip(at, lines, strict=True):
                    starts.append(start)
                    ends.append(start + len(raw))
                    obj = parse_object(raw)
                    if obj is None:
                        self.malformed += 1
                    else:
                        out.extend(self._take(self._ranked(li, obj)))
                    li += 1
        return out

    def _ranked(self, li: int, entry: dict[str, Any]) -> Iterator[tuple[int, float | None]]:
        """``(rank key, claimed at)`` of line ``li``'s selectable items (``entry`` is its content);
        ``claimed at`` is None for an unclaimed item, else when its in_progress claim was made."""
        if entry_closed(entry):
            return
        for ii, item in enumerate(entry_items(entry)):
            if not _open_item(entry, item):
                continue
            status = item.get("claim_status")
            if status in (None, "available"):
                claim = None
            elif status == "in_progress" and self.claim_visibility_s is not None:
                claim = claimed_at(item)
            else:
                continue
            scope = _scope_rank(item, self.repo_names)
            if scope is not None:
                yield _packed_key(item, li << _ITEM_BITS | ii, scope, self.quality), claim

    def _take(self, ranked: Iterator[tuple[int, float | None]]) -> list[int]:
        """Note the claimed items of ``ranked``; returns the rank keys of the unclaimed ones."""
        out = []
        for key, claim in ranked:
            if claim is None:
                out.append(key)
            else:
                self._claims[key] = claim
        return out

    def _unindex(self, li: int, entry: dict[str, Any]) -> None:
        """Take line ``li``'s items (``entry``, its content when indexed) out of the ranking."""
        keys = self._keys
        for key, claim in self._ranked(li, entry):
            if claim is not None:
                self._claims.pop(key, None)
                continue
            k = bisect.bisect_left(keys, key)
            if k < len(keys) and keys[k] == key:
                del keys[k]

    def _insert(self, new: list[int]) -> None:
        """Rank new keys in (they are new: their lines were not indexed, or were unindexed)."""
        if len(new) > _BULK:
            new.extend(self._keys)
            new.sort()
            self._keys = new
            return
        for key in new:
            bisect.insort(self._keys, key)

    # -- WorkSource --------------------------------------------------------------------------

    def candidates(self, since_line: int = 0) -> LazyItems:
        """The selectable items, best first, read from the file as they are looked at.

        ``since_line``: only items on that non-blank line or a later one (what was just appended).
        """
        fd = self._open()
        if fd is None:
            return LazyItems(0, _no_item)
        keys = self._keys
        if self._claims:
            now = self.clock()
            stale = sorted(k for k, at in self._claims.items() if claim_stale(at, now, self.claim_visibility_s))
            keys = list(heapq.merge(keys, stale)) if stale else keys
        if since_line > 0:
            keys = [k for k in keys if _where(k)[0] >= since_line]
        if not keys:
            os.close(fd)
            return LazyItems(0, _no_item)
        return LazyItems(len(keys), _View(self, fd, list(keys)).item)

    def preview_item(self, item: dict[str, Any]) -> WorkItem:
        """The WorkItem a not-yet-queued item would become (for --dry-run)."""
        return self._to_item({"source_epic": "evolve-generator"}, item)

    def _to_item(self, entry: dict[str, Any], item: dict[str, Any], locator: Any = None) -> WorkItem:
        return WorkItem(
            source=self.name,
            ref=item_ref(entry, item),
            title=fast_clean(item.get("title", "")),
            description=str(item.get("description", ""))[:4000],
            type=str(item.get("type", "")),
            severity=str(item.get("severity", "")),
            created_at=item.get("timestamp") or entry.get("timestamp"),
            data=item,
            locator=locator,
        )

    def known_keys(self, wanted: set[str]) -> set[str]:
        """Which of ``wanted`` (dedup keys, normalised titles) some item in the file, open or consumed,
        already has (for generators and reported follow-ups). Streams the file."""
        found: set[str] = set()
        if not wanted:
            return found
        fd = self._open()
        if fd is None:
            return found
        try:
            with gc_paused():
                for entry in objects(fd, self._size):
                    for item in entry_items(entry):
                        found |= item_keys(item) & wanted
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc}") from exc
        finally:
            os.close(fd)
        return found

    # -- lifecycle -------------------------------------------------------------------------

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        """Claim an unclaimed item, or take over a stale claim; a claim that still holds is ClaimLost."""
        fields = {"claim_status": "in_progress", "claimed_by": claimer, "claimed_at": now}
        at = parse_iso(now)
        when = self.clock() if at is None else at

        def selectable(entry: dict[str, Any], it: dict[str, Any]) -> bool:
            return item_selectable(entry, it, when, self.claim_visibility_s)

        self._update(item, selectable, fields, required=True)

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        done = {"consumed": True, "claim_status": "consumed", "consumed_by": claimer, "consumed_at": now}

        def whole_entry(entry: dict[str, Any], it: dict[str, Any]) -> None:
            # The last open item of an entry consumes the entry too.
            if entry is not it and all(i.get("consumed") is True for i in entry_items(entry)):
                entry.update(done)

        self._update(item, _claimed_by(claimer), done, then=whole_entry)

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        """Back to the queue; ``failed_at`` is stamped only when the cycle failed on it (``reason`` is
        failed, crashed or regressed): it ranks the item after fresh work (:func:`rank_key`), which a
        hand-back for a heavy context, a scout or an interruption must not do."""
        fields = {"consumed": False, "claim_status": "available", "claimed_by": None, "claimed_at": None}
        if reason in RETRY_REASONS:
            fields["failed_at"] = now
        self._update(item, _claimed_by(claimer), fields)

    def annotate(self, item: WorkItem, now: str, **fields: Any) -> None:
        """Set scout outcome fields (``disposition``, ``status``, ``split_into``) on an open item."""
        self._update(item, _open, {**fields, "scouted_at": now})

    def defer(self, item: WorkItem, now: str, reason: str) -> None:
        """A scout's defer: ``disposition: "defer:<reason>"`` keeps the item out of selection."""
        self.annotate(item, now, disposition=f"defer:{reason or 'scout'}")

    def split(self, item: WorkItem, now: str, children: Sequence[Mapping[str, Any]]) -> None:
        """A scout's split (the caller queues the children): the item is marked split, no longer selectable."""
        titles = [str(c.get("title", "")) for c in children]
        self.annotate(item, now, status="split", disposition="split", split_into=titles)

    def park(self, item: WorkItem, now: str, note: str) -> bool:
        """Hold an item out of selection (attempt budget spent, or a scout's park): ``status: "blocked"``."""
        fields = {"status": "blocked", "claim_status": "available", "claimed_by": None, "claimed_at": None}
        self._update(item, _open, {**fields, "failed_at": now, "blocked_note": note})
        return True  # (an item consumed meanwhile needs no parking)

    def unpark(self, ref: str, now: str) -> bool:
        """``evolve requeue``: a parked (``status: "blocked"``) item becomes selectable again; True when one did."""

        def parked(entry: dict[str, Any], it: dict[str, Any]) -> bool:
            consumed = entry.get("consumed") is True or it.get("consumed") is True
            return it.get("status") == "blocked" and not consumed

        def clear(_entry: dict[str, Any], it: dict[str, Any]) -> None:
            it.pop("status", None)
            it.pop("blocked_note", None)

        probe = WorkItem(source=self.name, ref=ref, title="")
        return self._update(probe, parked, {"requeued_at": now}, then=clear)

    def _update(
        self,
        item: WorkItem,
        want: Callable[[dict[str, Any], dict[str, Any]], bool],
        fields: dict[str, Any],
        *,
        then: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        required: bool = False,
    ) -> bool:
        """The one shape of every lifecycle write: find ``item`` where ``want`` accepts it, set ``fields``
        on it (``then`` may change its entry too), and rewrite that line. Not found: nothing is written,
        or ClaimLost when ``required`` (a claim). True when a line was rewritten.

        The sink of rewrites: what evolve writes (reasons, notes, split titles) is redacted. The
        operator's own lines are left as they are: a title is its item's ref (see :func:`same_ref`)."""
        fields = redact.current().json(fields)

        def mutate(edit: _Edit) -> bool:
            found = edit.find(item, want)
            if found is None:
                if required:
                    raise ClaimLost(item.ref)
                return False
            li, entry, it = found
            it.update(fields)
            if then is not None:
                then(entry, it)
            edit.mark(li, entry)
            return True

        return self._rewrite(mutate)

    def _rewrite(self, mutate: Callable[[_Edit], bool], attempts: int = 20) -> bool:
        """Apply ``mutate`` to the file in place, never moving a byte another writer wrote.

        The queue's directory is opened once without following symlinks (docs/DESIGN.md §2.0) and
        the file opened relative to it: a linked directory is refused; a symlink at the queue's own
        path is replaced by a file of ours first, never written through."""
        try:
            dfd = open_dir(self.path.parent, create=False)
        except FileNotFoundError:
            return self._gone(mutate)
        try:
            for attempt in range(attempts):
                done = self._attempt(dfd, mutate)
                if done is not None:
                    return done
                time.sleep(min(0.05, 0.001 * (1 << attempt)))  # let a burst of writes pass
        finally:
            os.close(dfd)
        raise SourceError(f"{self.path} kept changing; gave up rewriting after {attempts} attempts")

    def _gone(self, mutate: Callable[[_Edit], bool]) -> bool:
        self._forget()
        mutate(_Edit(self, None))  # raises ClaimLost for a claim; nothing to finalize or release
        return False

    def _attempt(self, dfd: int, mutate: Callable[[_Edit], bool]) -> bool | None:
        """One try at :meth:`_rewrite`; None when the file was renamed over meanwhile (start again).

        The file is edited in place under ``flock`` (:mod:`evolve.store.inplace`): its inode never
        changes, so whatever any appender writes, now or through a descriptor it keeps open, lands
        in the one file readers read."""
        known = time.time_ns()
        name = self.path.name
        try:
            fd = os.open(name, os.O_RDWR | NOFOLLOW | _CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return self._gone(mutate)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK) and is_link(dfd, name):
                self._materialize(dfd)
                return None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one editor at a time; appenders need no lock
            st = os.fstat(fd)
            if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_ino != st.st_ino:
                return None  # another tool renamed a new file in while we waited for the lock
            journal = inplace.Journal(dfd, name)
            inplace.redo(fd, journal, st)  # an edit a killed editor left half done comes first
            jsig = journal.sig()
            self._sync(fd, os.fstat(fd), known, strict=True, foreign=jsig != self._jsig)
            self._jsig = jsig
            edit = _Edit(self, fd)
            if not mutate(edit):
                return False
            for li in sorted(edit.changed):
                if not self._apply(fd, journal, st, edit, li):
                    self._forget()
                    return None
            self._edited(fd, journal)
            return True
        finally:
            os.close(fd)  # (releases the lock)

    def _apply(self, fd: int, journal: inplace.Journal, st: os.stat_result, edit: _Edit, li: int) -> bool:
        """Write line ``li``'s new content in place (a put, or a move when it does not fit) and
        re-rank it; False when the line is not what the index says (the index is then dropped)."""
        start, old = self._starts[li], edit.before[li]
        here = os.pread(fd, len(old) + 1, start)
        if here not in (old + b"\n", old) or (start and os.pread(fd, 1, start - 1) != b"\n"):
            return False  # edited in place by a tool outside the lock: read it again
        entry = edit.changed[li]
        data = orjson.dumps(entry)
        before = parse_object(old)
        with gc_paused():
            if before is not None:
                self._unindex(li, before)
            if len(data) <= len(old):
                inplace.put(fd, journal, st, start, old, inplace.padded(data, len(old)))
                self._insert(self._take(self._ranked(li, entry)))
            else:  # the copy comes in through the append path; this line is a tombstone now
                inplace.move(fd, journal, st, start, old, inplace.padded(data, len(data) + inplace.SLACK))
        return True

    def _edited(self, fd: int, journal: inplace.Journal) -> None:
        """After our own edits (still under the lock): hash the indexed region again (bytes in it
        changed) and trust the stat we now see, then take in what was appended (a move's copy)."""
        try:
            self._digest, done = rehash(fd, self._size)
            self._tail = done.tail
            st = os.fstat(fd)
            self._jsig = journal.sig()
            self._ino = st.st_ino
            # Not racy: appends change the size, and any other editor of bytes in place takes the
            # lock and replaces the journal, whose stat is checked at every read.
            self._racy = self._unverified = False
            self._sig = stat_sig(st) if st.st_size == self._size else None
            self._refresh()
        except (OSError, SourceError):
            self._forget()

    def _materialize(self, dfd: int) -> None:
        """A symlink at the queue's path: replace it by a regular file holding what it points to
        (read, as every reader does, never written through; appends refuse a link anyway)."""
        src = os.open(self.path.name, os.O_RDONLY | _CLOEXEC, dir_fd=dfd)
        try:
            tfd, tmp = create_temp(dfd, self.path.name, 0o666)
            try:
                for chunk in chunks(src, 0, None, Read()):
                    _write_all(tfd, chunk)
                os.fsync(tfd)
            finally:
                os.close(tfd)
            os.replace(tmp, self.path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        finally:
            os.close(src)
        self._forget()

    def _recover(self) -> None:
        """Finish an edit a killed editor left pending, unless an editor is at work (it will)."""
        try:
            dfd = open_dir(self.path.parent, create=False)
        except OSError:
            return
        try:
            fd = os.open(self.path.name, os.O_RDWR | NOFOLLOW | _CLOEXEC, dir_fd=dfd)
        except OSError:
            os.close(dfd)
            return  # gone, linked, or read-only to us: the next editor replays it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            inplace.redo(fd, inplace.Journal(dfd, self.path.name), os.fstat(fd))
        except OSError:
            pass  # (BlockingIOError: someone holds the lock, and finishes the edit itself)
        finally:
            os.close(fd)
            os.close(dfd)

    def append_entry(self, entry: dict[str, Any]) -> None:
        """The sink of appends (follow-ups, scout splits, generators): their titles reach prompts."""
        append_bytes(self.path, orjson.dumps(redact.current().json(entry), option=orjson.OPT_APPEND_NEWLINE))


def _open(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    return item.get("consumed") is not True


def _claimed_by(claimer: str | None) -> Callable[[dict[str, Any], dict[str, Any]], bool]:
    """Items in progress under ``claimer`` (None: under anyone)."""
    return lambda e, i: i.get("claim_status") == "in_progress" and (claimer is None or i.get("claimed_by") == claimer)


def _no_item(i: int) -> WorkItem:
    raise IndexError(i)
