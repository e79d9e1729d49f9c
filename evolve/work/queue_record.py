"""evolve's own record of the lifecycle writes it made to queue items (docs/DESIGN.md §6.1).

``next-work.jsonl`` has other writers, and some of them replace the whole file: an editor saving by
rename, ``sed -i``, upstream's own rewrite, a ``git checkout`` of a tracked queue. One that loaded the
file before evolve claimed, finalized or released an item and saves after it brings the item back as
it was: a claim undone (the item done twice), a hold undone (a pending item's claim plain again, for
any reader to take over once stale), a finalize or release undone (a claim in progress that nobody
holds). So every lifecycle write evolve makes is first recorded here, per item, as a *chain*: the fields
evolve's writes set (and removed) with the values it wrote, a digest of the item as evolve last wrote
it, and digests of the states the item had before evolve's writes (``prior``). Whenever the
queue changed other than by appends (it is parsed from scratch), each chain is checked against the
item in the file (:func:`decide`, pure):

* the item holds evolve's fields with evolve's values → evolve's write stands (an edit of other
  fields is adopted: it becomes the state evolve last saw);
* the item is, every field of it, one of its ``prior`` states → a save of a buffer loaded before
  evolve's write brought it back: evolve's fields are written again;
* anything else, or the item gone → someone changed it deliberately (a requeue by hand): the change
  stands and the chain is dropped.

A line evolve moved (its copy appended, the line made a tombstone) that a save brings back beside the
copy (the buffer was loaded between the two, or after a fire died there) is told by its bytes: the
line is byte for byte one evolve replaced, its item one of the prior states, and a different line
with the same item follows it. It is made a tombstone, as the move would have made it, and the
decision above is taken over the other occurrences.

The record holds no byte of the operator's: items are known by a digest of their ref (and a CRC-32 of
it, a cheap first test while the file is parsed), states by digests, and the only values are those
evolve itself wrote (redacted when written). It is ``.<queue>.lifecycle`` beside the queue (every
editor of one queue file shares it), replaced atomically under the editors' lock; the newest
:data:`MAX_CHAINS` chains are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from evolve.store.atomic import adopt, create_temp
from evolve.store.dirfd import NOFOLLOW

MAX_CHAINS = 200  # items whose last write is remembered (a save of a buffer older than that many writes is not undone)
MAX_PRIOR = 8  # earlier states remembered per item
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_MISSING = object()


def digest(obj: Any) -> str:
    """A digest of a JSON value that ignores key order and whitespace (an editor may re-serialise a line)."""
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def line_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:32]


def ref_tag(ref: str) -> int:
    return zlib.crc32(ref.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Chain:
    """evolve's writes to one item, known by ``key`` (:func:`digest` of its ref as the queue spells it)."""

    key: str
    tag: int  # ref_tag of the ref
    last: str  # digest of the item as evolve last wrote it (or last saw it holding its writes)
    sets: dict[str, Any] = field(default_factory=dict)  # the fields evolve's writes set, as it set them
    unsets: tuple[str, ...] = ()  # fields its writes removed
    prior: tuple[str, ...] = ()  # digests of the states the item had before, oldest first
    entry: dict[str, Any] | None = None  # entry fields the last write set too (a finalize that consumed the entry)
    lines: tuple[str, ...] = ()  # line_digest of the bytes of each line evolve's writes replaced, oldest first
    op: str = ""
    at: str = ""

    def holds(self, item: dict[str, Any]) -> bool:
        """Whether ``item`` has evolve's fields with evolve's values."""
        return all(item.get(k, _MISSING) == v for k, v in self.sets.items()) and not any(
            k in item for k in self.unsets)

    def apply(self, item: dict[str, Any]) -> None:
        """Write evolve's fields over ``item`` again."""
        for k in self.unsets:
            item.pop(k, None)
        item.update(orjson.loads(orjson.dumps(self.sets)))

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "tag": self.tag, "last": self.last, "sets": self.sets, "unsets": list(self.unsets),
                "prior": list(self.prior), "entry": self.entry, "lines": list(self.lines), "op": self.op,
                "at": self.at}

    @staticmethod
    def from_json(obj: Any) -> Chain | None:
        if not isinstance(obj, dict):
            return None
        key, tag, last, sets = obj.get("key"), obj.get("tag"), obj.get("last"), obj.get("sets")
        prior, unsets, entry, lines = obj.get("prior"), obj.get("unsets"), obj.get("entry"), obj.get("lines")
        if not (isinstance(key, str) and isinstance(tag, int) and isinstance(last, str) and isinstance(sets, dict)
                and isinstance(prior, list) and isinstance(unsets, list) and isinstance(lines, list)):
            return None
        return Chain(key=key, tag=tag, last=last, sets=sets, unsets=tuple(u for u in unsets if isinstance(u, str)),
                     prior=tuple(p for p in prior if isinstance(p, str)),
                     entry=entry if isinstance(entry, dict) else None,
                     lines=tuple(x for x in lines if isinstance(x, str)),
                     op=str(obj.get("op") or ""), at=str(obj.get("at") or ""))


@dataclass(frozen=True)
class Occurrence:
    """An item in the file with a chain's ref: line ``line`` (index order), item ``index`` on it."""

    line: int
    index: int
    item: dict[str, Any]
    raw: str  # line_digest of the whole line's bytes


KEEP, REAPPLY, DROP = "keep", "reapply", "drop"


@dataclass(frozen=True)
class Decision:
    verdict: str
    target: Occurrence | None = None  # REAPPLY: the occurrence to write evolve's fields over
    leftovers: tuple[Occurrence, ...] = ()  # lines a move left behind that a save brought back: tombstones
    chain: Chain | None = None  # KEEP: the chain as it should now be recorded (None: unchanged)


def decide(chain: Chain, found: Iterable[Occurrence]) -> Decision:
    """What to do about ``chain`` given the items in the file with its ref (in file order)."""
    found = sorted(found, key=lambda o: (o.line, o.index))
    left = tuple(o for o in found if o.raw in chain.lines and digest(o.item) in chain.prior
                 and any(p.line > o.line and p.raw != o.raw for p in found))
    rest = [o for o in found if o not in left]
    ours = [o for o in rest if chain.holds(o.item)]
    if ours:
        now = digest(ours[0].item)
        new = None if now == chain.last else replace(chain, last=now, prior=_bounded((*chain.prior, chain.last)))
        return Decision(KEEP, leftovers=left, chain=new)
    stale = [o for o in rest if digest(o.item) in chain.prior]
    if stale:
        return Decision(REAPPLY, target=stale[0], leftovers=left)
    return Decision(DROP, leftovers=left)


def noted(chains: dict[str, Chain], ref: str, before: dict[str, Any], after: dict[str, Any], *, op: str,
          at: str, entry: dict[str, Any] | None, line: str, continues: bool = False) -> dict[str, Chain]:
    """``chains`` with evolve's write of ``after`` over ``before`` (the item ``ref``) as the newest.

    A write that continues the chain (the item was as evolve last left it, or ``continues``: a write
    made from the chain alone, the file being gone) adds to its fields and its prior states; one after
    someone else's deliberate change starts a new chain."""
    key = digest(ref)
    old = chains.get(key)
    b = digest(before)
    changed = {k: v for k, v in after.items() if before.get(k, _MISSING) != v}
    removed = {k for k in before if k not in after}
    if old is not None and (continues or b == old.last or old.holds(before)):
        prior = _bounded((*old.prior, old.last, b))
        sets = {k: v for k, v in old.sets.items() if k not in removed}
        unsets = set(old.unsets) - set(changed)
        lines = old.lines
    else:
        prior, sets, unsets, lines = (b,), {}, set(), ()
    sets.update(changed)
    unsets |= removed
    out = {k: v for k, v in chains.items() if k != key}
    out[key] = Chain(key=key, tag=ref_tag(ref), last=digest(after), sets=sets, unsets=tuple(sorted(unsets)),
                     prior=prior, entry=entry, lines=_bounded((*lines, line)) if line else lines, op=op, at=at)
    while len(out) > MAX_CHAINS:
        del out[next(iter(out))]
    return out


def _bounded(prior: Iterable[str]) -> tuple[str, ...]:
    seen: list[str] = []
    for p in prior:
        if p in seen:
            seen.remove(p)
        seen.append(p)
    return tuple(seen[-MAX_PRIOR:])


# -- the file --------------------------------------------------------------------------------------


@dataclass
class Record:
    """The chains of the record file ``.<queue>.lifecycle``, by key, oldest first."""

    chains: dict[str, Chain] = field(default_factory=dict)

    @staticmethod
    def name(queue: str) -> str:
        return f".{queue}.lifecycle"

    @classmethod
    def load(cls, dfd: int, queue: str) -> Record:
        """The record as it is on disk; an empty one when it is missing or unreadable (it only ever
        adds protection: without it nothing is re-applied)."""
        try:
            fd = os.open(cls.name(queue), os.O_RDONLY | NOFOLLOW | _CLOEXEC, dir_fd=dfd)
        except OSError:
            return cls()
        return cls._read(fd)

    @classmethod
    def load_path(cls, path: Path) -> Record:
        """:meth:`load` by path, for a reader that holds no directory descriptor (a link at the record's
        own name is not followed)."""
        try:
            fd = os.open(path, os.O_RDONLY | NOFOLLOW | _CLOEXEC)
        except OSError:
            return cls()
        return cls._read(fd)

    @classmethod
    def _read(cls, fd: int) -> Record:
        try:
            obj = orjson.loads(os.read(fd, max(os.fstat(fd).st_size, 1)))
        except (OSError, orjson.JSONDecodeError):
            return cls()
        finally:
            os.close(fd)
        chains: dict[str, Chain] = {}
        for raw in obj.get("chains", []) if isinstance(obj, dict) else []:
            c = Chain.from_json(raw)
            if c is not None:
                chains.pop(c.key, None)
                chains[c.key] = c
        return cls(chains)

    def save(self, dfd: int, queue: str, like: os.stat_result | None) -> None:
        """Replace the record (durably: a write it describes may follow). The temp file is named like
        the queue's own (``.<queue>.XXXXXXXX.tmp``), which the fire-start sweep removes when left behind;
        it takes the mode, owner and group of the queue ``like`` (None: 0666 less the umask)."""
        data = orjson.dumps({"v": 1, "chains": [c.to_json() for c in self.chains.values()]})
        fd, tmp = create_temp(dfd, queue, 0o600 if like is not None else 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if like is not None:
                    adopt(fd, like)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.name(queue), src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
