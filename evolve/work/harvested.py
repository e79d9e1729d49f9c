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
* anything else → the file is parsed again from scratch. Another tool may have replaced it (an
  editor's save by rename) with a buffer older than evolve's own writes, so evolve's record of its
  lifecycle writes (:mod:`evolve.work.queue_record`) is checked against the new parse before the
  next selection or edit: a write a stale save undid is made again, a deliberate edit stands.

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
import contextlib
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evolve import crashpoint, redact
from evolve.results import FAILURES, CycleResult
from evolve.store import inplace
from evolve.store.atomic import create_temp
from evolve.store.dirfd import NOFOLLOW, is_link, open_dir, open_file
from evolve.store.jsonl import (
    Read,
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
from evolve.work.queue_record import (
    DROP,
    KEEP,
    REAPPLY,
    Chain,
    Occurrence,
    Record,
    decide,
    digest,
    line_digest,
    noted,
    ref_tag,
)

CONCRETE = ("bug", "tech-debt", "improvement", "feature", "pattern-fix", "task")
PROCESS = ("process-improvement", "docs", "chore")
SEVERITY = {"high": 0, "medium": 1, "low": 2}
RETRY_REASONS = FAILURES | {CycleResult.REGRESSED}  # a release for these stamps failed_at

_ITEM_BITS = 32  # file order of item ``ii`` of line ``li``: ``li << _ITEM_BITS | ii``
_LOW = (1 << _ITEM_BITS) - 1
_BULK = 32  # more new ranked items than this: extend and sort instead of inserting one by one
_VIEW_CACHE = 64  # parsed lines a candidates view keeps (items of one line are often read together)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# How long an edit waits for the queue's name to come back (an editor that saves vim's way renames the
# file aside and writes a new one under the name: milliseconds) before it counts the queue as gone.
REAPPEAR_S = 5.0
_MISSING = object()
_TOMBSTONE = {"superseded": True, "consumed": True, "items": []}
# The fields of a held claim (docs/DESIGN.md §6.1): what it waits for, and since when. A claim, finalize,
# release or park removes them.
HOLD_FIELDS = ("claim_held", "claim_held_at")


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


def claim_held(item: dict[str, Any]) -> bool:
    """An ``in_progress`` claim marked held (a non-empty ``claim_held``): its cycle's green commits wait to
    land (docs/DESIGN.md §6.1, §8.3). It never goes stale, however old: the work exists, and taking the
    item over would do it twice. (On an item that is not ``in_progress`` the field means nothing.)"""
    return item.get("claim_status") == "in_progress" and bool(item.get("claim_held"))


def _unhold(_entry: dict[str, Any], item: dict[str, Any]) -> None:
    for k in HOLD_FIELDS:
        item.pop(k, None)


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
    evolve's own live claim needs no timeout: the fire lock keeps a second fire out of this repo. A held
    claim (:func:`claim_held`) never goes stale."""
    if not _open_item(entry, item):
        return False
    status = item.get("claim_status")
    if status in (None, "available"):
        return True
    return (status == "in_progress" and now is not None and not claim_held(item)
            and claim_stale(claimed_at(item), now, visibility_s))


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
        self.tombs: set[int] = set()  # lines to overwrite by a tombstone
        self.notes: list[_Note] = []  # the lifecycle writes made, for evolve's record

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

    def reapply(self, at: Occurrence, chain: Chain) -> None:
        """Write evolve's last state of the item at ``at`` over it again (its entry too, when the write
        consumed the whole entry and every item is consumed again)."""
        entry = self._entry(at.line)
        assert entry is not None
        it = entry_items(entry)[at.index]
        chain.apply(it)
        if chain.entry and entry is not it and all(i.get("consumed") is True for i in entry_items(entry)):
            entry.update(chain.entry)
        self.mark(at.line, entry)

    def tomb(self, li: int) -> None:
        self.mark(li, dict(_TOMBSTONE, items=[]))
        self.tombs.add(li)


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
        self.reconciled: list[tuple[str, str]] = []  # (event, title) of every recorded write acted on
        self._editing = False  # inside an edit (which holds the lock): a read then never takes it again
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
        # evolve's record (docs/DESIGN.md §6.1): the refs it held when the index was built from scratch,
        # where each is in the file, and whether that record is still to be checked against the file.
        self._watch: frozenset[str] = frozenset()  # chain keys
        self._tags: frozenset[int] = frozenset()  # … and the CRC-32s of their refs
        self._hits: dict[str, list[tuple[int, int]]] = {}  # chain key → (line, item) of each item with that ref
        self._check_due = False

    @property
    def lines(self) -> int:
        """Non-blank lines in the file as last read."""
        return len(self._starts)

    def _open(self) -> int | None:
        """The file open, with the index made to describe it (the caller closes it); None: no file.

        When it was parsed from scratch and evolve's record has a write to make again (a stale save
        undid it), that is done first, under the editors' lock, so that no selection sees the undone state."""
        fd = self._open_once()
        if fd is None or not self._check_due or self._editing:
            return fd
        try:
            needed = self._needs_reconcile(fd)
        except BaseException:
            os.close(fd)
            raise
        if not needed:
            self._check_due = False
            return fd
        os.close(fd)
        self._rewrite(_Op.nothing())
        return self._open_once()

    def _open_once(self) -> int | None:
        known = time.time_ns()
        jsig = self._journal_sig()  # before the read: an edit during it shows at the next call
        if jsig != self._jsig and jsig is not None:
            self._recover()  # (cheap when the journal says "done": one small read)
            jsig = self._journal_sig()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            # A file read before that is gone may be in the middle of a save vim's way (renamed aside,
            # a new one being written): wait for it, once, rather than see no work at all.
            fd = self._reopened() if self._ino is not None else None
            if fd is None:
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

    def _reopened(self) -> int | None:
        end = time.monotonic() + REAPPEAR_S
        delay = 0.001
        while time.monotonic() < end:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            with contextlib.suppress(FileNotFoundError):
                return os.open(self.path, os.O_RDONLY)
        return None

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
        """Parse the file from scratch: it is new, or changed other than by appends. So evolve's record
        of its own writes is checked against it before the next edit or selection (``_check_due``)."""
        self._forget()
        record = Record.load_path(self.path.with_name(Record.name(self.path.name)))
        self._watch = frozenset(record.chains)
        self._tags = frozenset(c.tag for c in record.chains.values())
        done = Read()
        keys = self._index(fd, 0, done)
        keys.sort()
        self._keys = keys
        self._size, self._tail = done.size, done.tail
        self._record(st, known)
        self._check_due = bool(self._watch)

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
                        if self._watch:
                            self._hit(li, obj)
                    li += 1
        return out

    def _hit(self, li: int, entry: dict[str, Any]) -> None:
        """Note where the items of line ``li`` are whose refs evolve's record holds. (Run for every item
        of a file parsed from scratch while the record holds anything: :func:`item_ref` and
        :func:`~evolve.work.queue_record.ref_tag` inlined, a CRC-32 first, the digest only on a match.)"""
        items = entry.get("items")
        if not isinstance(items, list):
            items = [entry] if "title" in entry else []
        epic = entry.get("source_epic") or ""
        tags = self._tags
        for ii, item in enumerate(i for i in items if isinstance(i, dict)):
            key = item.get("dedup_key")
            keyed = isinstance(key, str) and key
            ref = f"dedup={key}" if keyed else f"source_epic={epic}:item={item.get('title', '')}"
            if ref_tag(ref) in tags and (k := digest(ref)) in self._watch:
                self._hits.setdefault(k, []).append((li, ii))

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
            elif status == "in_progress" and self.claim_visibility_s is not None and not claim_held(item):
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

        # (A hold left on an item someone requeued by hand belongs to the claim before: it goes.)
        self._update(item, selectable, fields, then=_unhold, required=True, op="claim", now=now)

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        done = {"consumed": True, "claim_status": "consumed", "consumed_by": claimer, "consumed_at": now}

        def whole_entry(entry: dict[str, Any], it: dict[str, Any]) -> None:
            _unhold(entry, it)  # the waiting work landed: the hold ends with the claim
            # The last open item of an entry consumes the entry too.
            if entry is not it and all(i.get("consumed") is True for i in entry_items(entry)):
                entry.update(done)

        self._update(item, _claimed_by(claimer), done, then=whole_entry, op="finalize", now=now)

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        """Back to the queue; ``failed_at`` is stamped only when the cycle failed on it (``reason`` is
        failed, crashed or regressed): it ranks the item after fresh work (:func:`rank_key`), which a
        hand-back for a heavy context, a scout or an interruption must not do."""
        fields = {"consumed": False, "claim_status": "available", "claimed_by": None, "claimed_at": None}
        if reason in RETRY_REASONS:
            fields["failed_at"] = now
        self._update(item, _claimed_by(claimer), fields, then=_unhold, op="release", now=now)

    def hold(self, item: WorkItem, claimer: str, now: str, note: str) -> None:
        """The cycle's green commits wait to land (docs/DESIGN.md §8.3): the claim ``claimer`` holds stays
        (``in_progress``, ``claimed_by``, ``claimed_at`` as they are, what every v1.4 reader sees) and is
        marked held: ``claim_held`` (``note``: the pending ref and the cycle) and ``claim_held_at``. A held
        claim is never taken over as stale (:func:`claim_held`); finalize and release end it. Done once:
        an item already held with this note is not written again (recovery may repeat a dead fire's hold)."""

        def unheld(entry: dict[str, Any], it: dict[str, Any]) -> bool:
            return _claimed_by(claimer)(entry, it) and it.get("claim_held") != note

        self._update(item, unheld, {"claim_held": note, "claim_held_at": now}, op="hold", now=now)

    def annotate(self, item: WorkItem, now: str, **fields: Any) -> None:
        """Set scout outcome fields (``disposition``, ``status``, ``split_into``) on an open item."""
        self._update(item, _open, {**fields, "scouted_at": now}, op="annotate", now=now)

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
        self._update(item, _open, {**fields, "failed_at": now, "blocked_note": note}, then=_unhold, op="park",
                     now=now)
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
        return self._update(probe, parked, {"requeued_at": now}, then=clear, op="requeue", now=now)

    def _update(
        self,
        item: WorkItem,
        want: Callable[[dict[str, Any], dict[str, Any]], bool],
        fields: dict[str, Any],
        *,
        then: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        required: bool = False,
        op: str = "",
        now: str = "",
    ) -> bool:
        """The one shape of every lifecycle write: find ``item`` where ``want`` accepts it, set ``fields``
        on it (``then`` may change its entry too), and rewrite that line. Not found: nothing is written,
        or ClaimLost when ``required`` (a claim). True when a line was rewritten.

        The sink of rewrites: what evolve writes (reasons, notes, split titles) is redacted. The
        operator's own lines are left as they are: a title is its item's ref (see :func:`same_ref`)."""
        return self._rewrite(_Op(item, want, redact.current().json(fields), then, required, op, now))

    def _rewrite(self, op: _Op, attempts: int = 20) -> bool:
        """Apply ``op`` to the file in place, never moving a byte another writer wrote.

        The queue's directory is opened once without following symlinks (docs/DESIGN.md §2.0) and
        the file opened relative to it: a linked directory is refused; a symlink at the queue's own
        path is replaced by a file of ours first, never written through."""
        try:
            dfd = open_dir(self.path.parent, create=False)
        except FileNotFoundError:
            return self._gone(op, _Progress(), None)
        progress = _Progress()
        self._editing = True
        try:
            for attempt in range(attempts):
                done = self._attempt(dfd, op, progress)
                if done is not None:
                    return done
                time.sleep(min(0.05, 0.001 * (1 << attempt)))  # let a burst of writes pass
        finally:
            self._editing = False
            os.close(dfd)
        raise SourceError(f"{self.path} kept changing; gave up rewriting after {attempts} attempts")

    def _gone(self, op: _Op, progress: _Progress, dfd: int | None) -> bool:
        """No queue file (after waiting for a save in progress to write one): a claim is ClaimLost. A
        finalize, release … of an item evolve wrote before is recorded as evolve's write all the same,
        so that it is applied when the file comes back (restored, or saved again) with the item as it was."""
        self._forget()
        if op.required:
            raise ClaimLost(op.item.ref)
        if progress.committed or dfd is None:
            return progress.result
        record = Record.load(dfd, self.path.name)
        chain = record.chains.get(digest(op.item.ref))
        if chain is None:
            return False
        it = orjson.loads(orjson.dumps(chain.sets))  # the item as far as evolve's writes go
        entry = {"items": [it]}
        if not op.want(entry, it):
            return False
        before = orjson.loads(orjson.dumps(it))
        it.update(op.fields)
        if op.then is not None:
            op.then(entry, it)
        # (The item's other fields are unknown here: the chain goes on from the state evolve left.)
        record.chains = noted(record.chains, op.item.ref, before, it, op=op.name, at=op.now, entry=None, line="",
                              continues=True)
        record.save(dfd, self.path.name, None)
        return True

    def _attempt(self, dfd: int, op: _Op, progress: _Progress) -> bool | None:
        """One try at :meth:`_rewrite`; None when it must start again (the file was renamed over
        meanwhile, or edited in place by a tool outside the lock).

        The file is edited in place under the editors' lock (:mod:`evolve.store.inplace`), so whatever
        any appender writes, now or through a descriptor it keeps open, lands in the one file readers
        read. The lock is ``flock`` of the queue's directory (it outlives any file renamed in under the
        name) and of the file. Before the edit, the writes evolve recorded are checked against the file
        when it changed other than by appends (:meth:`_reconcile`); the edit itself is recorded before
        the file is touched. After it, the name must still be the file written, or the edit (recorded:
        ``progress.committed``) is made again, by the reconcile, in the file that is there now."""
        known = time.time_ns()
        name = self.path.name
        with _locked(dfd):
            try:
                fd = os.open(name, os.O_RDWR | NOFOLLOW | _CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                if _reappears(dfd, name):
                    return None  # a save that writes a new file under the name (vim's way) was under way
                return self._gone(op, progress, dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK) and is_link(dfd, name):
                    self._materialize(dfd)
                    return None
                raise
            try:
                return self._edit(dfd, fd, op, progress, known)
            except inplace.Replaced:
                self._forget()
                return None
            except ClaimLost:
                raise
            except BaseException:
                self._forget()  # (a failing disk: the next call reads the file again)
                raise
            finally:
                os.close(fd)

    def _edit(self, dfd: int, fd: int, op: _Op, progress: _Progress, known: int) -> bool | None:
        """:meth:`_attempt` once the file is open: lock, reconcile, ``op``, record, write, check."""
        name = self.path.name
        fcntl.flock(fd, fcntl.LOCK_EX)  # (and the file's own lock, which editors before issue 22 took)
        st = os.fstat(fd)
        if not _names(dfd, name, st):
            return None  # another tool renamed a new file in while we opened it
        journal = inplace.Journal(dfd, name)
        inplace.redo(fd, journal, st)  # an edit a killed editor left half done comes first
        jsig = journal.sig()
        self._sync(fd, os.fstat(fd), known, strict=True, foreign=jsig != self._jsig)
        self._jsig = jsig
        record = Record.load(dfd, name)
        edit = _Edit(self, fd)
        dirty = self._reconcile(edit, record)
        lost: ClaimLost | None = None
        result = progress.result
        if progress.committed:
            if op.required and progress.ref not in record.chains:
                lost = ClaimLost(op.item.ref)  # the claim was overridden by someone's edit of the item
        else:
            try:
                result = op.apply(edit)
            except ClaimLost as exc:
                lost = exc
            if edit.notes:
                for note in edit.notes:
                    record.chains = self._noted(record.chains, edit, note, op)
                progress.committed, progress.result = True, result
                progress.ref = digest(item_ref(edit.notes[0].entry, edit.notes[0].item))
                dirty = True
        if dirty:
            record.save(dfd, name, st)  # before the queue: it is what a lost write is made again from
            crashpoint.reached("queue.record")
        if edit.changed:
            for li in sorted(edit.changed):
                if not self._apply(fd, journal, st, edit, li):
                    self._forget()  # edited in place by a tool outside the lock: read it again
                    return None
            if not _names(dfd, name, st):
                self._forget()  # renamed over while we wrote: made again in the file there now
                return None
            self._edited(fd, journal)
        if lost is not None:
            raise lost
        return result

    def _noted(self, chains: dict[str, Chain], edit: _Edit, note: _Note, op: _Op) -> dict[str, Chain]:
        raw = edit.before[note.line]
        before_entry = parse_object(raw) or {}
        entry_fields = None
        if note.entry is not note.item:
            changed = {k: v for k, v in note.entry.items() if k != "items" and before_entry.get(k, _MISSING) != v}
            entry_fields = changed or None
        return noted(chains, item_ref(note.entry, note.item), note.before, orjson.loads(orjson.dumps(note.item)),
                     op=op.name, at=op.now, entry=entry_fields, line=line_digest(raw))

    def _reconcile(self, edit: _Edit, record: Record) -> bool:
        """Check evolve's recorded writes against the file just parsed from scratch
        (:func:`evolve.work.queue_record.decide`): a stale save undone, a deliberate edit kept.
        Marks the lines to write on ``edit``; True when the record itself changed."""
        if not self._check_due:
            return False
        self._check_due = False
        chains = {k: c for k, c in record.chains.items() if k in self._watch}  # (later ones: their writer checks)
        found = {k: self._occurrences(edit, k) for k in chains}
        # Lines a move left behind come out first, for every chain: an entry's line holds several items.
        left = {o.line: (o, chains[k]) for k in chains for o in decide(chains[k], found[k]).leftovers}
        dirty = False
        for key, chain in chains.items():
            here = [o for o in found[key] if o.line not in left]
            d = decide(chain, here)
            if d.verdict == REAPPLY:
                assert d.target is not None
                edit.reapply(d.target, chain)
                self._note_reconciled("queue.reapplied", d.target, chain, "a save of a buffer older than "
                                      f"evolve's {chain.op or 'write'} brought the item back as it was")
            elif d.verdict == DROP:
                del record.chains[key]
                dirty = True
                self._note_reconciled("queue.edit_kept", here[0] if here else None, chain, "the item was "
                                      "changed (or removed) by someone else since evolve's write: that stands")
            elif d.chain is not None:
                record.chains[key] = d.chain
                dirty = True
        for li, (o, chain) in sorted(left.items()):
            edit.tomb(li)
            self._note_reconciled("queue.copy_removed", o, chain, "a save brought back a line evolve had moved, "
                                  "beside its copy: a tombstone again")
        return dirty

    def _occurrences(self, edit: _Edit, key: str) -> list[Occurrence]:
        out = []
        for li, ii in self._hits.get(key, ()):
            entry = edit._entry(li)
            items = entry_items(entry) if entry is not None else []
            if ii < len(items) and digest(item_ref(entry, items[ii])) == key:
                out.append(Occurrence(li, ii, orjson.loads(orjson.dumps(items[ii])), line_digest(edit._raw(li))))
        return out

    def _note_reconciled(self, event: str, at: Occurrence | None, chain: Chain, detail: str) -> None:
        title = str(at.item.get("title", ""))[:200] if at is not None else ""
        self.reconciled.append((event, title))
        from evolve import log  # (only here: the queue's readers stay light)

        level = "info" if event == "queue.edit_kept" else "warning"
        getattr(log.get("evolve.queue"), level)(event, title=redact.current().text(title), op=chain.op,
                                                 written_at=chain.at, line=at.line + 1 if at else None, detail=detail)

    def _needs_reconcile(self, fd: int) -> bool:
        """Whether the file just parsed from scratch has an item evolve's record says to write again
        (or a record entry to drop): then the read takes the lock and does so first."""
        record = Record.load_path(self.path.with_name(Record.name(self.path.name)))
        edit = _Edit(self, fd)
        for key, chain in record.chains.items():
            if key in self._watch:
                d = decide(chain, self._occurrences(edit, key))
                if d.verdict != KEEP or d.leftovers or d.chain is not None:
                    return True
        return False

    def _apply(self, fd: int, journal: inplace.Journal, st: os.stat_result, edit: _Edit, li: int) -> bool:
        """Write line ``li``'s new content in place (a put, or a move when it does not fit) and
        re-rank it; False when the line is not what the index says (the index is then dropped)."""
        start, old = self._starts[li], edit.before[li]
        here = os.pread(fd, len(old) + 1, start)
        if here not in (old + b"\n", old) or (start and os.pread(fd, 1, start - 1) != b"\n"):
            return False  # edited in place by a tool outside the lock: read it again
        entry = edit.changed[li]
        data = inplace.tombstone(len(old)) if li in edit.tombs else orjson.dumps(entry)
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
            with _locked(dfd, wait=False):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                inplace.redo(fd, inplace.Journal(dfd, self.path.name), os.fstat(fd))
        except (OSError, inplace.Replaced):
            pass  # (BlockingIOError: someone holds the lock, and finishes the edit itself)
        finally:
            os.close(fd)
            os.close(dfd)

    def append_entry(self, entry: dict[str, Any]) -> None:
        """The sink of appends (follow-ups, scout splits, generators): their titles reach prompts.

        One write on a line of its own, after any line another appender is still writing
        (:func:`evolve.store.inplace.append_line`); a symlink at the path is refused."""
        fd = open_file(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            inplace.append_line(fd, orjson.dumps(redact.current().json(entry)))
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _Note:
    """A lifecycle write made on an edit: ``item`` (now changed) of ``entry`` on line ``line``, and
    the item as it was before."""

    line: int
    entry: dict[str, Any]
    item: dict[str, Any]
    before: dict[str, Any]


@dataclass(frozen=True)
class _Op:
    """One lifecycle write: find ``item`` where ``want`` accepts it and set ``fields`` (``then`` may
    change its entry too); ``required``: not finding it is ClaimLost."""

    item: WorkItem
    want: Callable[[dict[str, Any], dict[str, Any]], bool]
    fields: dict[str, Any]
    then: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    required: bool = False
    name: str = ""
    now: str = ""

    @staticmethod
    def nothing() -> _Op:
        """No write of its own: the reconcile a read runs under the lock."""
        return _Op(WorkItem(source="harvested", ref="", title=""), lambda _e, _i: False, {})

    def apply(self, edit: _Edit) -> bool:
        if not self.item.ref:
            return False
        found = edit.find(self.item, self.want)
        if found is None:
            if self.required:
                raise ClaimLost(self.item.ref)
            return False
        li, entry, it = found
        before = orjson.loads(orjson.dumps(it))
        it.update(self.fields)
        if self.then is not None:
            self.then(entry, it)
        edit.mark(li, entry)
        edit.notes.append(_Note(li, entry, it, before))
        return True


@dataclass
class _Progress:
    """How far an edit got over its attempts: once its write is in evolve's record (``committed``), a
    later attempt only makes it again where the file lost it (the reconcile)."""

    committed: bool = False
    result: bool = False
    ref: str = ""


@contextlib.contextmanager
def _locked(dfd: int, *, wait: bool = True) -> Iterator[None]:
    """The editors' lock: ``flock`` of the queue's directory, which no rename of the file can take
    away. (A filesystem that cannot lock a directory, as NFS may not, leaves the file's own lock.)"""
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(dfd, fcntl.LOCK_UN)


def _names(dfd: int, name: str, st: os.stat_result) -> bool:
    """Whether ``name`` still names the file ``st`` describes."""
    try:
        now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev)


def _reappears(dfd: int, name: str) -> bool:
    """Whether a file comes back under ``name`` within :data:`REAPPEAR_S` (polled)."""
    end = time.monotonic() + REAPPEAR_S
    delay = 0.001
    while time.monotonic() < end:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        with contextlib.suppress(FileNotFoundError):
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return True
    return False


def _open(entry: dict[str, Any], item: dict[str, Any]) -> bool:
    return item.get("consumed") is not True


def _claimed_by(claimer: str | None) -> Callable[[dict[str, Any], dict[str, Any]], bool]:
    """Items in progress under ``claimer`` (None: under anyone)."""
    return lambda e, i: i.get("claim_status") == "in_progress" and (claimer is None or i.get("claimed_by") == claimer)


def _no_item(i: int) -> WorkItem:
    raise IndexError(i)
