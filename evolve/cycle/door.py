"""The agent's ``.agents/``: a copy it may write, and the narrow door back to the operator's (docs/DESIGN.md §8.3).

The agent's worktree never links to the operator's ``.agents/`` (evolve's config, markers, ledger and
session state live in ``.agents/evolve/``: a link there made them one ``open()`` away). Instead:

* before each agent run (:func:`open_door`), where the repository does not track ``.agents/`` (what
  ``evolve init`` sets up), the worktree's ``.agents/`` is made afresh as a copy of the operator's
  (learnings, plans, the queue), bounded, without ``.agents/evolve/`` and without links; where it
  tracks it (agentops repositories commit the queue and their learnings), the worktree's own
  checked-out copy is used. Either way what the agent was given is recorded (a hash per file);
* after the run (:func:`carry`), what the agent added or changed there comes across:

  - new lines of the queue become follow-up items of the real queue, through the same path as a
    report's ``new_work`` (titled items only, lifecycle fields stripped, deduplicated, at most
    ``work.max_new_work``, redacted): an agent can add work but never claim, consume or rewrite it;
  - any other file (learnings, plans) is copied to the same path in the operator's ``.agents/``,
    unless the operator changed that file since the agent was given it: then it is written beside it as
    ``<name>.evolve-<cycle>`` (their copy is never overwritten);
  - nothing under ``.agents/evolve/`` and no link is ever taken; nothing is deleted.

Evolve's harness hook, which runs inside the agent, finds the state directory by ``EVOLVE_DIR``.
Codex's own sandbox keeps ``.agents`` read-only: a Codex agent's follow-ups come through its report.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.cycle.context import FireContext
from evolve.cycle.scout import queue_new_work
from evolve.git.run import GitError, git
from evolve.store.dirfd import ensure_dir

MAX_FILE_BYTES = 4 * 1024 * 1024  # a learning or a plan, not a build artefact
MAX_FILES = 200  # carried back per cycle
MAX_COPY_FILES = 5000  # given to the agent
MAX_COPY_BYTES = 64 * 1024 * 1024
AGENTS = ".agents"
STATE = ".agents/evolve/"  # evolve's own: never given, never taken


@dataclass(frozen=True)
class Baseline:
    """What the agent was given under its ``.agents/``: a hash per file, and the queue's bytes."""

    files: dict[str, str] = field(default_factory=dict)
    queue: bytes = b""
    queue_rel: str = ""
    tracked: bool = False
    skipped: int = 0  # files not given (too many, too big, links)


@dataclass
class Carried:
    queued: int = 0
    copied: list[str] = field(default_factory=list)
    beside: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def tracked_agents(tree: Path) -> bool:
    """The repository tracks something under ``.agents/`` (then the worktree has its own checked-out copy)."""
    try:
        return bool(git(tree, "ls-files", "-z", "--", AGENTS).strip("\0"))
    except GitError:
        return False


def open_door(ctx: FireContext, tree: Path) -> Baseline:
    """Give the agent its ``.agents/`` for this run and record what it was given (see the module).

    Never fatal: a copy that fails leaves the agent with less to read, and is logged.
    """
    queue_rel = _rel(ctx.paths.nextwork, ctx.paths.repo)
    try:
        tracked = tracked_agents(tree)
        _unlink_links(tree)
        skipped = 0 if tracked else _copy_in(ctx.paths.repo / AGENTS, tree / AGENTS, tree)
        files = _hashes(tree)
        queue = b""
        if queue_rel and queue_rel.startswith(AGENTS + "/"):
            queue = _read_plain(tree / queue_rel) or b"" if os.path.isfile(tree / queue_rel) else b""
        return Baseline(files, queue, queue_rel, tracked, skipped)
    except (GitError, OSError) as exc:
        ctx.log.error("door.open_failed", error=str(exc)[:300])
        return Baseline(queue_rel=queue_rel)


def carry(ctx: FireContext, tree: Path, baseline: Baseline | None, cycle: int) -> Carried:
    """Bring what the agent wrote under the worktree's ``.agents/`` to the operator's (see the module).

    Never fatal: what cannot be carried is logged, and the cycle goes on to its gate.
    """
    out = Carried()
    if baseline is None:
        return out
    try:
        return _carry(ctx, tree, baseline, cycle, out)
    except (GitError, OSError) as exc:
        ctx.log.error("door.failed", cycle=cycle, error=str(exc)[:300])
        return out


def _carry(ctx: FireContext, tree: Path, baseline: Baseline, cycle: int, out: Carried) -> Carried:
    repo = ctx.paths.repo
    now = _hashes(tree)
    written = sorted(rel for rel, digest in now.items() if baseline.files.get(rel) != digest)
    for rel in written[:MAX_FILES]:
        src = tree / rel
        if rel == baseline.queue_rel:
            out.queued += _queue_lines(ctx, tree / rel, baseline.queue, cycle)
            continue
        try:
            data = _read_plain(src)
        except OSError as exc:
            out.refused.append(f"{rel}: {exc}")
            continue
        if data is None:
            out.refused.append(f"{rel}: larger than {MAX_FILE_BYTES} bytes")
            continue
        data = redact.current().bytes(data)  # the sink: a note the agent wrote may quote a secret it saw
        dest = repo / rel
        base = baseline.files.get(rel)
        theirs = _digest_plain(dest)
        deleted = base is not None and not os.path.lexists(dest)  # the operator removed it: that stands
        if deleted or (os.path.lexists(dest) and theirs != base and theirs != _digest(data)):
            dest = dest.with_name(f"{dest.name}.evolve-{cycle}")
            out.beside.append(rel)
        elif theirs == _digest(data):
            continue
        else:
            out.copied.append(rel)
        if not _write(dest, repo, data):
            out.refused.append(f"{rel}: a link or a file is in the way in your checkout")
    if out.queued or out.copied or out.beside or out.refused:
        ctx.log.info("door.carried", cycle=cycle, queued=out.queued, copied=out.copied, beside=out.beside,
                     refused=out.refused[:10])
    return out


def _rel(path: Path, repo: Path) -> str:
    try:
        return path.relative_to(repo).as_posix()
    except ValueError:
        return ""


def _unlink_links(tree: Path) -> None:
    """An older evolve linked the worktree's ``.agents`` (or ``.agents/evolve``) to the operator's; the agent
    may have planted one. Remove the link itself (never what it points at)."""
    for rel in (AGENTS, STATE.rstrip("/")):
        p = tree / rel
        if os.path.islink(p):
            os.unlink(p)


def _copy_in(source: Path, dest: Path, tree: Path) -> int:
    """``dest`` made afresh as a bounded copy of ``source`` without ``evolve/`` and links; the count skipped."""
    if os.path.lexists(dest):
        shutil.rmtree(dest)  # fd-based on Linux: never follows a link inside
    dest.mkdir()
    if not source.is_dir() or source.is_symlink():
        return 0
    skipped, files, total = 0, 0, 0
    real_tree = os.path.realpath(tree)
    for root, dirs, names in os.walk(source):
        rel_root = Path(root).relative_to(source)
        keep = []
        for d in sorted(dirs):
            full = Path(root) / d
            if (rel_root == Path(".") and d == "evolve") or os.path.islink(full):
                continue
            if real_tree == os.path.realpath(full) or real_tree.startswith(os.path.realpath(full) + os.sep):
                continue  # a worktree configured inside .agents/: never copied into itself
            keep.append(d)
        dirs[:] = keep
        for name in sorted(names):
            src = Path(root) / name
            try:
                st = os.lstat(src)
            except OSError:
                skipped += 1
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES or files >= MAX_COPY_FILES \
                    or total + st.st_size > MAX_COPY_BYTES:
                skipped += 1
                continue
            data = _read_plain(src)
            if data is None:
                skipped += 1
                continue
            target = dest / rel_root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            files += 1
            total += len(data)
    return skipped


def _hashes(tree: Path) -> dict[str, str]:
    """``rel -> sha256`` of every regular file under the worktree's ``.agents/`` but ``.agents/evolve/``
    (links skipped, never followed)."""
    out: dict[str, str] = {}
    top = tree / AGENTS
    if not top.is_dir() or top.is_symlink():
        return out
    for root, dirs, names in os.walk(top):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not os.path.islink(here / d)
                         and not (here == top and d == "evolve"))
        for name in names:
            full = here / name
            digest = _digest_plain(full)
            if digest is not None:
                out[full.relative_to(tree).as_posix()] = digest
    return out


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest_plain(path: Path) -> str | None:
    """The hash of a regular file's bytes (not through a link), None when absent, a link, or too big."""
    try:
        data = _read_plain(path) if not os.path.islink(path) and os.path.isfile(path) else None
    except OSError:
        return None
    return _digest(data) if data is not None else None


def _read_plain(path: Path) -> bytes | None:
    """The file's bytes, not through a link, None when it is too big to be a note."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size > MAX_FILE_BYTES:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write(dest: Path, repo: Path, data: bytes) -> bool:
    """Write ``dest`` under the operator's checkout, never through a link on the way (ensure_dir refuses one)."""
    from evolve.errors import UnsafePathError
    from evolve.store.atomic import atomic_write_bytes

    try:
        ensure_dir(dest.parent)
        atomic_write_bytes(dest, data)
    except (UnsafePathError, OSError):
        return False
    return True


def _queue_lines(ctx: FireContext, path: Path, given: bytes, cycle: int) -> int:
    """The queue lines the agent added to its copy, as follow-up items of the real queue."""
    try:
        now = _read_plain(path) or b""
    except OSError:
        return 0
    before = set(given.splitlines())
    items: list[dict[str, Any]] = []
    for line in now.splitlines():
        if not line.strip() or line in before:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            ctx.log.warning("door.queue_line_skipped", cycle=cycle, reason="not JSON", bytes=len(line))
            continue
        if isinstance(obj, dict) and isinstance(obj.get("items"), list):
            items.extend(it for it in obj["items"] if isinstance(it, dict))
        elif isinstance(obj, dict) and isinstance(obj.get("title"), str):
            items.append(obj)  # a legacy flat row
    return queue_new_work(ctx, cycle, items, epic=f"evolve-cycle-{cycle}") if items else 0
