"""Append-only JSONL files read in chunks: the storage mechanics under the harvested queue.

Nothing here knows what a line means. It reads a file a chunk at a time with ``os.pread`` (so a
line is parsed while it is in the cache and the file is never held whole), splits it into the
non-blank lines and where each starts, hashes what it read and keeps its last :data:`TAIL_CHECK`
bytes (so a caller can tell "only appended to" from "changed"), tells when a stat is too close to a
write to be trusted ("racily clean", as git says), and appends a line with one ``os.write`` on an
``O_APPEND`` descriptor; in-place edits of lines are :mod:`evolve.store.inplace`. Queue policy
(which items are selectable, in what order) stays in :mod:`evolve.work.harvested`.
"""

from __future__ import annotations

import gc
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from evolve.store.atomic import open_append

TAIL_CHECK = 4096  # bytes at the end of the indexed region that must be unchanged to trust an append
RACY_NS = 10_000_000  # a write this close to our read may keep its timestamps (a coarse clock tick is ≤ 10 ms)
COARSE_RACY_NS = 2_000_000_000  # the same where the filesystem keeps whole seconds
CHUNK = 1 << 18  # read size of a parse, a hash or a copy
_PROMOTE = 10_000  # new objects left alive by a parse above which they skip the young generations


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector over a bulk parse.

    Parsed JSON is acyclic, so a collection frees nothing, but its passes walk the whole growing
    heap and make a large parse super-linear. If the parse left many new objects alive, they are
    moved straight to the oldest generation instead of being walked by a young collection (then an
    older one) the moment the collector is back on; a full collection still visits them.
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


def parse_object(raw: bytes) -> dict[str, Any] | None:
    """The line as a JSON object; None when it is not one (the caller keeps such lines as they are)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class Read:
    """What :func:`read_lines` read: how many bytes, and the last :data:`TAIL_CHECK` of them."""

    size = 0
    tail = b""


def keep_tail(tail: bytes, data: bytes) -> bytes:
    return data[-TAIL_CHECK:] if len(data) >= TAIL_CHECK else (tail + data)[-TAIL_CHECK:]


def chunks(fd: int, offset: int, limit: int | None, done: Read, digest: Any = None) -> Iterator[bytes]:
    """The file's bytes from ``offset`` to its end (or ``limit`` bytes), a chunk at a time, fed to ``digest``."""
    pos = offset
    end = None if limit is None else offset + limit
    while True:
        want = CHUNK if end is None else min(CHUNK, end - pos)
        chunk = os.pread(fd, want, pos) if want > 0 else b""
        if not chunk:
            break
        pos += len(chunk)
        if digest is not None:
            digest.update(chunk)
        done.tail = keep_tail(done.tail, chunk)
        yield chunk
    done.size = pos - offset


def read_lines(
    fd: int, offset: int, done: Read, limit: int | None = None, digest: Any = None
) -> Iterator[tuple[list[int], list[bytes]]]:
    """The non-blank lines (without newlines) from ``offset`` on, with where each starts in the file.

    Yielded a chunk's lines at a time, so that each line is parsed while it is still in the cache
    and the file is never held whole.
    """
    carry = b""
    at = offset  # where the line being assembled (``carry``) starts
    for chunk in chunks(fd, offset, limit, done, digest):
        parts = chunk.split(b"\n")
        if carry:
            parts[0] = carry + parts[0]
        carry = parts.pop()  # b"" when the chunk ended with a newline, else a line still being read
        starts: list[int] = []
        lines: list[bytes] = []
        for raw in parts:
            if raw.strip():
                starts.append(at)
                lines.append(raw)
            at += len(raw) + 1
        if lines:
            yield starts, lines
    if carry.strip():
        yield [at], [carry]


def objects(fd: int, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The parsable entries from the start of ``fd`` (or its first ``limit`` bytes), in file order."""
    for _, lines in read_lines(fd, 0, Read(), limit):
        for raw in lines:
            entry = parse_object(raw)
            if entry is not None:
                yield entry


def hash_region(fd: int, size: int) -> tuple[bytes, Read]:
    digest, done = rehash(fd, size)
    return digest.digest(), done


def racy(mtime_ns: int, known_ns: int) -> bool:
    """True when a write after ``known_ns`` (when we knew the content) could leave ``mtime_ns`` as it is."""
    window = COARSE_RACY_NS if mtime_ns % 1_000_000_000 == 0 else RACY_NS
    return mtime_ns >= known_ns - window


def stat_sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def append_bytes(path: Path, data: bytes) -> None:
    """One ``os.write`` on an ``O_APPEND`` descriptor, then fsync; a symlink at ``path`` is refused."""
    fd = open_append(path)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def rehash(fd: int, size: int) -> tuple[Any, Read]:
    """A SHA-256 of the first ``size`` bytes of ``fd``, still open for more, and what was read."""
    digest = hashlib.sha256()
    done = Read()
    for _ in chunks(fd, 0, size, done, digest):
        pass
    return digest, done
