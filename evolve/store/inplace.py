"""Edit lines of a JSONL file in place while other processes keep appending to it (docs/DESIGN.md §2.0).

A rename-over rewrite gives the path a new inode, and an appender that holds an ``O_APPEND``
descriptor on the old one (or a shell loop whose ``>>`` opened it just before the rename) then
writes into a file nobody reads again. So the queue keeps its inode for ever, and evolve changes a
line only by writing the same number of bytes at the line's own offset (``pwrite``): the bytes of
every other line stay where they are, and appends at the end never meet the edit.

* **put**: the new line fits; it is padded with spaces before its closing brace (JSON whitespace)
  to the old line's length and written over it.
* **move**: it does not fit; a copy with room to spare (:data:`SLACK` spaces, so that the claim's
  later finalize or release is a put) is appended, then the old line is overwritten, same length,
  by a tombstone ``{"superseded":true,"consumed":true,"items":[]}`` (spaces when the line is too
  short even for that): still a JSON object, holding no item, consumed for every reader.

Each edit is first written to a redo journal ``.<name>.redo`` (atomic replace, fsync): the offset,
the hash of the old line, the bytes to write there, and for a move the copy and the file size
before it was appended. :func:`redo` finishes a pending one after a crash: what is at the offset
tells how far the edit got (the new bytes: done; the old ones: not yet, and a move appends its copy
only if it is not already after the recorded size), so a replay is idempotent and a line is never
lost or left twice. Editors serialise on ``flock`` (appenders need no lock); the journal is replaced
at every edit, so its stat changing tells a reader that some line changed in place.

Appending (a move's copy, evolve's own new entries: :func:`append_line`) never joins another writer's
line. A last line without its newline that does not parse is a line some appender is still writing
(in two ``write()`` calls, say): the append waits until it ends, or until it has not changed for
:data:`TORN_WAIT_S` (its writer died: it is left as it is, a malformed line), and then writes in one
``write()`` on a line of its own. If another writer's first half came in between that look and the
write, the bytes just written are blanked (they are ours) and the line is written again after a newline.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from typing import Any

import orjson

from evolve import crashpoint
from evolve.store.atomic import adopt, create_temp
from evolve.store.dirfd import NOFOLLOW
from evolve.store.jsonl import Read, parse_object, read_lines

SLACK = 256  # spare bytes in a moved line: room for the lifecycle fields a later edit adds
# How long a half-written last line may stay unchanged before it counts as a dead writer's: an
# appender writing one line in two write()s finishes it within microseconds, on a loaded machine
# still far within this.
TORN_WAIT_S = 10.0
_TAIL_CHUNK = 1 << 16
TOMBSTONES = (b'{"superseded":true,"consumed":true,"items":[]}', b'{"consumed":true,"items":[]}')
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def padded(data: bytes, length: int) -> bytes:
    """The JSON object ``data`` widened to ``length`` bytes by spaces before its closing brace."""
    return data[:-1] + b" " * (length - len(data)) + data[-1:]


def tombstone(length: int) -> bytes:
    """What a moved line leaves behind: a same-length object that holds no item."""
    for stone in TOMBSTONES:
        if len(stone) <= length:
            return padded(stone, length)
    return b" " * length  # (a line this short held no titled item; readers skip blank lines)


class Replaced(Exception):
    """The queue's name no longer names the file being edited: another tool renamed a new one in."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pwrite(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


class Journal:
    """The redo journal ``.<name>.redo`` beside the file, in its directory ``dfd``."""

    def __init__(self, dfd: int, name: str) -> None:
        self.dfd = dfd
        self.name = f".{name}.redo"

    def sig(self) -> tuple[int, int, int] | None:
        """What changes whenever an edit is made: the journal is replaced by every one."""
        try:
            st = os.stat(self.name, dir_fd=self.dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def read(self) -> dict[str, Any] | None:
        try:
            fd = os.open(self.name, os.O_RDONLY | NOFOLLOW | _CLOEXEC, dir_fd=self.dfd)
        except OSError:
            return None
        try:
            rec = orjson.loads(os.read(fd, os.fstat(fd).st_size))
        except (OSError, orjson.JSONDecodeError):
            return None  # torn by a power cut before its rename was durable: no edit was begun
        finally:
            os.close(fd)
        return rec if isinstance(rec, dict) else None

    def write(self, rec: dict[str, Any], like: os.stat_result, *, durable: bool) -> None:
        """Replace the journal (mode, owner and group of the queue ``like``, which its readers share)."""
        fd, tmp = create_temp(self.dfd, self.name, 0o600)
        try:
            try:
                os.write(fd, orjson.dumps(rec))
                adopt(fd, like)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.dfd)
            raise
        if durable:
            os.fsync(self.dfd)

    def done(self, like: os.stat_result) -> None:
        # Not synced: a pending record that comes back after a power cut replays as a no-op.
        self.write({"state": "done"}, like, durable=False)


def put(fd: int, journal: Journal, st: os.stat_result, at: int, old: bytes, new: bytes) -> None:
    """Overwrite the line ``old`` at ``at`` with ``new`` (already padded to its length)."""
    rec = {"state": "pending", "op": "put", "ino": st.st_ino, "at": at, "old": _sha(old), "new": new.decode()}
    journal.write(rec, st, durable=True)
    crashpoint.reached("queue.journal")
    _pwrite(fd, new, at)
    os.fsync(fd)
    journal.done(st)


def move(fd: int, journal: Journal, st: os.stat_result, at: int, old: bytes, copy: bytes) -> None:
    """Append ``copy`` (the line's new content), then overwrite the line ``old`` at ``at`` by a tombstone."""
    size = os.fstat(fd).st_size
    rec = {
        "state": "pending", "op": "move", "ino": st.st_ino, "at": at, "old": _sha(old),
        "new": tombstone(len(old)).decode(), "copy": copy.decode(), "from": size,
    }
    journal.write(rec, st, durable=True)
    crashpoint.reached("queue.journal")
    _append(fd, journal, copy)
    crashpoint.reached("queue.replace")  # the copy appended, the old line not yet a tombstone
    _pwrite(fd, rec["new"].encode(), at)
    os.fsync(fd)
    journal.done(st)


def _append(fd: int, journal: Journal, line: bytes) -> None:
    """``line`` at the end of the file ``fd`` (through a descriptor of our own on the same inode)."""
    name = journal.name[1 : -len(".redo")]
    afd = os.open(name, os.O_RDWR | os.O_APPEND | NOFOLLOW | _CLOEXEC, dir_fd=journal.dfd)
    try:
        if os.fstat(afd).st_ino != os.fstat(fd).st_ino:
            raise Replaced(name)  # renamed over under our lock: the caller starts again
        append_line(afd, line)
    finally:
        os.close(afd)


def append_line(fd: int, line: bytes) -> int:
    """``line`` and a newline at the end of the file ``fd`` (open ``O_RDWR | O_APPEND``), on a line of
    its own, in one ``write()``, fsync'd; returns where the line starts. Never joins, splits or
    overwrites a line another writer is writing (see the module's docstring)."""
    lead = _lead(fd)
    while True:
        data = lead + line + b"\n"
        _write_appended(fd, data)
        end = os.lseek(fd, 0, os.SEEK_CUR)  # an O_APPEND write leaves the offset at its own end
        start = end - len(data)
        if lead or start == 0 or os.pread(fd, 1, start - 1) == b"\n":
            os.fsync(fd)
            return start + len(lead)
        # Another writer's half line got in between: blank what we wrote after it, and go again.
        _overwrite(fd, b" " * (len(data) - 1), start)
        lead = b"\n"


def _write_appended(fd: int, data: bytes) -> None:
    n = os.write(fd, data)
    if n < len(data):  # a short write to a regular file: the disk is full. Leave blanks, not half a line.
        end = os.lseek(fd, 0, os.SEEK_CUR)
        _overwrite(fd, b" " * n, end - n)
        raise OSError(errno.ENOSPC, "no space left to append to the queue")


def _overwrite(fd: int, data: bytes, at: int) -> None:
    """``pwrite`` at ``at`` through the ``O_APPEND`` descriptor ``fd`` (Linux would append it at the end
    instead): O_APPEND is cleared for the write and set again."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    try:
        _pwrite(fd, data, at)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def _lead(fd: int) -> bytes:
    """What an appended line must start with: nothing after a newline, a newline after a whole last
    line that lacks one, and after a line still being written, once it ends or its writer is gone."""
    seen, since, delay = -1, time.monotonic(), 0.001
    while True:
        size = os.fstat(fd).st_size
        tail = last_line(fd, size)
        if not tail:
            return b""
        if not tail.strip() or parse_object(tail) is not None:
            return b"\n"
        if size != seen:
            seen, since = size, time.monotonic()
        elif time.monotonic() - since >= TORN_WAIT_S:
            return b"\n"  # a dead writer's half line: left as it is, a malformed line of its own
        crashpoint.reached("queue.torn")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def last_line(fd: int, size: int) -> bytes:
    """The bytes after the file's last newline (before ``size``): a line not yet ended, or b""."""
    out = b""
    pos = size
    while pos > 0:
        n = min(_TAIL_CHUNK, pos)
        chunk = os.pread(fd, n, pos - n)
        k = chunk.rfind(b"\n")
        if k >= 0:
            return chunk[k + 1 :] + out
        out = chunk + out
        pos -= n
    return out


def redo(fd: int, journal: Journal, st: os.stat_result) -> bool:
    """Finish the edit a killed editor left pending (the caller holds the lock). True if it did one."""
    rec = journal.read()
    if rec is None or rec.get("state") != "pending":
        return False
    try:
        if rec["ino"] == st.st_ino:
            new, at = rec["new"].encode(), int(rec["at"])
            here = os.pread(fd, len(new), at)
            if here != new and _sha(here) == rec["old"]:  # not yet written, and the line still the one meant
                if rec["op"] == "move" and not _has_line(fd, int(rec["from"]), rec["copy"].encode()):
                    _append(fd, journal, rec["copy"].encode())
                _pwrite(fd, new, at)
                os.fsync(fd)
    except (KeyError, TypeError, ValueError, AttributeError):
        pass  # a journal we cannot read describes no edit we could finish
    journal.done(st)
    return True


def _has_line(fd: int, start: int, line: bytes) -> bool:
    """Whether ``line`` is a whole line of the file after ``start`` (a move's copy already appended)."""
    return any(line in lines for _, lines in read_lines(fd, start, Read()))
