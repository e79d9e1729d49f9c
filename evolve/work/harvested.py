"""The harvested queue ``.agents/rpi/next-work.jsonl`` (schema v1.4, docs/DESIGN.md §6.1).

Each line is an entry ``{source_epic, timestamp, items[], consumed, claim_status, ...}``; legacy
flat rows (an item's fields at the top level) are read too. Rewrites change only the lines they
must, keep every unknown field, every unparsable line and every blank line byte for byte, are
atomic, and do not lose a line another process appended while we were rewriting.

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

A rewrite (claim, finalize, …) finds its item where the selection found it (``WorkItem.locator``,
checked against the line) or else by scanning the file, and afterwards re-ranks only the lines it
changed; lines salvaged from concurrent appenders come in through the append path. The tail check
cannot see a same-length in-place edit further up that comes with an append, so before writing the
file back a rewrite compares the whole region's hash if appends were taken on the tail check alone.

The byte-level mechanics (chunked reads, hashes, the racy-stat test, appends) are in
:mod:`evolve.store.jsonl`; this module holds the queue's schema, its ranking and its index.
"""

from __future__ import annotations

import bisect
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

from evolve import crashpoint, redact
from evolve.store.atomic import adopt, create_temp, existing
from evolve.store.dirfd import open_dir
from evolve.store.jsonl import (
    Changed,
    Out,
    Read,
    append_bytes,
    gc_paused,
    hash_region,
    keep_tail,
    objects,
    parse_object,
    racy,
    read_lines,
    stat_sig,
)
from evolve.timeutil import parse_iso
from evolve.work.item import ClaimLost, LazyItems, SourceError, WorkItem, fast_clean, item_keys

CONCRETE = ("bug", "tech-debt", "improvement", "feature", "pattern-fix", "task")
PROCESS = ("process-improvement", "docs", "chore")
SEVERITY = {"high": 0, "medium": 1, "low": 2}

_ITEM_BITS = 32  # file order of item ``ii`` of line ``li``: ``li << _ITEM_BITS | ii``
_LOW = (1 << _ITEM_BITS) - 1
_BULK = 32  # more new ranked items than this: extend and sort instead of inserting one by one
_VIEW_CACHE = 64  # parsed lines a candidates view keeps (items of one line are often read together)


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


def _open_item(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    """Selectable but for its claim: everything :func:`item_selectable` checks except ``claim_status``."""
    if entry.get("consumed") is True or item.get("consumed") is True:
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


def _where(key: int) -> tuple[int, int]:
    """``(line, item)`` of a packed rank key."""
    return (key >> _ITEM_BITS) & _LOW, key & _LOW


class _View:
    """The file as the index last saw it, kept open, turning rank keys into WorkItems on demand.

    A rewrite replaces the file by renaming a new one over it, so the old inode — the one these
    offsets describe — stays readable here for as long as the view lives.
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
        li = 0
        with gc_paused():
            for _, lines in read_lines(self.fd, 0, Read(), self.queue._size):
                for raw in lines:
                    entry = self._entry(li, raw)
                    if entry is not None:
                        for it in entry_items(entry):
                            if same_ref(item_ref(entry, it), ref) and want(entry, it):
                                return li, entry, it
                    li += 1
        return None

    def mark(self, li: int, entry: dict[str, Any]) -> None:
        if li not in self.before:
            self.before[li] = self._raw(li)
        self.changed[li] = entry


class _Written:
    """A rewrite's new file, written and synced but not yet in place."""

    def __init__(self, tmp: str, st: os.stat_result, out: Out, starts: array[int], ends: array[int]) -> None:
        self.tmp, self.st = tmp, st
        self.size, self.digest, self.tail = out.size, out.digest, out.tail
        self.starts, self.ends = starts, ends


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
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget()
            return None
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc}") from exc
        try:
            self._sync(fd, os.fstat(fd), known)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise SourceError(f"cannot read {self.path}: {exc}") from exc
            raise
        return fd

    def _refresh(self) -> None:
        fd = self._open()
        if fd is not None:
            os.close(fd)

    def _sync(self, fd: int, st: os.stat_result, known: int, *, strict: bool = False) -> None:
        """Reuse, extend or rebuild the index for the open file ``fd`` (stat ``st``, read after ``known``).

        ``strict`` (before a rewrite, which copies the file from the index's line positions): if
        appends were taken on the strength of the last 4 KiB alone, compare the whole region first,
        so that an in-place edit further up is never written over.
        """
        try:
            if st.st_ino == self._ino:
                sig = stat_sig(st)
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
        if entry.get("consumed") is True:
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
        fields = {"consumed": False, "claim_status": "available", "claimed_by": None, "claimed_at": None}
        self._update(item, _claimed_by(claimer), {**fields, "failed_at": now})

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
        """Apply ``mutate`` and replace the file atomically without losing concurrent appends.

        The queue's directory is opened once without following symlinks (docs/DESIGN.md §2.0) and
        the file is read, its temp created and renamed relative to it: a linked directory or a
        linked queue file is refused, never written through."""
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
        """One try at :meth:`_rewrite`; None when someone wrote meanwhile (start again)."""
        known = time.time_ns()
        name = self.path.name
        try:
            # A symlink at the queue's own path is read (as every reader does) and replaced by the
            # rename, never written through; only a linked directory on the way is refused.
            fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
        except FileNotFoundError:
            return self._gone(mutate)
        try:
            st = os.fstat(fd)
            self._sync(fd, st, known, strict=True)  # the index now describes bytes [0, self._size) of fd
            edit = _Edit(self, fd)
            if not mutate(edit):
                return False
            try:
                new = self._write_new(fd, edit, existing(dfd, name), dfd)
            except Changed:
                new = None
            if new is None or not self._still_ours(fd, st, dfd):
                if new is not None:
                    os.unlink(new.tmp, dir_fd=dfd)
                return None  # someone wrote meanwhile: start again from the new contents
            crashpoint.reached("queue.replace")
            replaced = time.time_ns()
            os.replace(new.tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            self._salvage(fd, self._size)
            os.fsync(dfd)
            self._replaced(edit, new, replaced)
            return True
        finally:
            os.close(fd)

    def _still_ours(self, fd: int, st: os.stat_result, dfd: int) -> bool:
        """The file at our path is still the one we copied, as we copied it, or it only grew since.

        Growth is fine: what was appended before our rename is salvaged after it (an appender writing
        every few ms would otherwise starve the rewrite). Anything else (a new inode, a shrink, a
        same-size edit, an edit in the last 4 KiB) means starting again from the new contents.
        """
        now = os.stat(self.path.name, dir_fd=dfd)  # what we read: the link's target, if one stands there
        if now.st_ino != st.st_ino:
            return False
        if now.st_size == self._size:
            return now.st_mtime_ns == st.st_mtime_ns
        ends_a_line = self._size == 0 or self._tail.endswith(b"\n")
        return now.st_size > self._size and ends_a_line and self._same_tail(fd)

    def _write_new(self, fd: int, edit: _Edit, old: os.stat_result | None, dfd: int) -> _Written:
        """Stream the indexed region of ``fd`` into a synced temp file in ``dfd``, the changed lines
        replaced; it takes the old file's mode, owner and group (a queue shared through a group
        stays appendable by the other user), or 0o666 less the umask when a link stood there."""
        tfd, tmp = create_temp(dfd, self.path.name, 0o600 if old is not None else 0o666)
        try:
            out = Out(tfd)
            starts, ends = array("q", self._starts), array("q", self._ends)
            pos = shift = 0
            prev = 0
            for li in sorted(edit.changed):
                out.copy(fd, pos, starts[li])
                data = orjson.dumps(edit.changed[li])
                out.write(data)
                pos = ends[li]
                if shift:  # the lines between the previous change and this one move by the same amount
                    starts[prev:li] = array("q", [x + shift for x in starts[prev:li]])
                    ends[prev:li] = array("q", [x + shift for x in ends[prev:li]])
                starts[li] += shift
                ends[li] = starts[li] + len(data)
                shift += len(data) - (pos - self._starts[li])
                prev = li + 1
            out.copy(fd, pos, self._size)
            if shift:
                starts[prev:] = array("q", [x + shift for x in starts[prev:]])
                ends[prev:] = array("q", [x + shift for x in ends[prev:]])
            if out.size and not out.tail.endswith(b"\n"):
                out.write(b"\n")  # a last line without its newline: appenders start on a line of their own
            if old is not None:
                adopt(tfd, old)
            os.fsync(tfd)
            written = _Written(tmp, os.fstat(tfd), out, starts, ends)
        except BaseException:
            os.close(tfd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(tfd)
        return written

    def _replaced(self, edit: _Edit, new: _Written, replaced: int) -> None:
        """Update the index to the file we just put in place: re-rank the changed lines only."""
        try:
            with gc_paused():
                for li, entry in edit.changed.items():
                    before = parse_object(edit.before[li])
                    if before is not None:
                        self._unindex(li, before)
                    self._insert(self._take(self._ranked(li, entry)))
            self._starts, self._ends = new.starts, new.ends
            self._size, self._tail, self._digest = new.size, new.tail, new.digest
            st = os.stat(self.path)
            if st.st_ino != new.st.st_ino or st.st_size < new.size:
                self._forget()  # replaced or truncated by someone else already
                return
            self._ino = new.st.st_ino
            self._racy = racy(new.st.st_mtime_ns, replaced)
            if st.st_size == new.size and st.st_mtime_ns == new.st.st_mtime_ns:
                self._sig = stat_sig(st)
            else:
                self._sig = None  # salvaged or freshly appended lines: the append path parses them
            self._refresh()
        except (OSError, SourceError):
            self._forget()

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
        """The sink of appends (follow-ups, scout splits, generators): their titles reach prompts."""
        append_bytes(self.path, orjson.dumps(redact.current().json(entry), option=orjson.OPT_APPEND_NEWLINE))


def _open(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    return item.get("consumed") is not True


def _claimed_by(claimer: str | None) -> Callable[[dict[str, Any], dict[str, Any]], bool]:
    """Items in progress under ``claimer`` (None: under anyone)."""
    return lambda e, i: i.get("claim_status") == "in_progress" and (claimer is None or i.get("claimed_by") == claimer)


def _no_item(i: int) -> WorkItem:
    raise IndexError(i)
