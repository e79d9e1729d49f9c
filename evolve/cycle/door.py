"""What the agent writes under ``.agents/`` reaches the repository's own ``.agents/`` (docs/DESIGN.md §8.3).

Where ``.agents/`` is git-ignored (what ``evolve init`` sets up), the agent's worktree links it to the
operator's, so its writes land there directly. Where the repository tracks ``.agents/`` (agentops
repositories commit the queue and their learnings), the worktree has its own checked-out copy, and
what the agent writes there would be reset away with the worktree. So after every agent run evolve
brings it across, by the narrow door this module is:

* new lines of the harvested queue become follow-up items of the real queue, through the same path as a
  report's ``new_work`` (titled items only, lifecycle fields stripped, deduplicated, at most
  ``work.max_new_work``, redacted): an agent can add work but never claim, consume or rewrite it;
* any other file it added or changed (learnings, plans) is copied to the same path in the operator's
  ``.agents/``, unless the operator changed that file since the cycle began: then it is written beside
  it as ``<name>.evolve-<cycle>`` (their copy is never overwritten);
* nothing under ``.agents/evolve/`` (evolve's own state) and no link is ever taken; nothing is deleted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.cycle.context import FireContext
from evolve.cycle.scout import queue_new_work
from evolve.git.run import GitError, git, run_git
from evolve.store.dirfd import ensure_dir

MAX_FILE_BYTES = 4 * 1024 * 1024  # a learning or a plan, not a build artefact
MAX_FILES = 200


@dataclass
class Carried:
    queued: int = 0
    copied: list[str] = field(default_factory=list)
    beside: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def tracked_agents(tree: Path) -> bool:
    """The repository tracks ``.agents/``: the worktree has a real directory there, not evolve's link."""
    agents = tree / ".agents"
    return agents.is_dir() and not agents.is_symlink()


def carry(ctx: FireContext, tree: Path, start: str | None, cycle: int) -> Carried:
    """Bring what the agent wrote under the worktree's own ``.agents/`` to the operator's (see the module).

    Never fatal: what cannot be carried is logged, and the cycle goes on to its gate.
    """
    out = Carried()
    if not start or not tracked_agents(tree):
        return out
    try:
        return _carry(ctx, tree, start, cycle, out)
    except (GitError, OSError) as exc:
        ctx.log.error("door.failed", cycle=cycle, error=str(exc)[:300])
        return out


def _carry(ctx: FireContext, tree: Path, start: str, cycle: int, out: Carried) -> Carried:
    repo = ctx.paths.repo
    queue_rel = _rel(ctx.paths.nextwork, repo)
    for rel in _written(tree, start)[:MAX_FILES]:
        src = tree / rel
        if rel == queue_rel:
            out.queued += _queue_lines(ctx, tree, start, rel, cycle)
            continue
        if rel.startswith(".agents/evolve/") or os.path.islink(src) or not src.is_file():
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
        base = _at(tree, start, rel)
        theirs = _read_plain(dest) if dest.is_file() and not dest.is_symlink() else None
        deleted = base is not None and not os.path.lexists(dest)  # the operator removed it: that stands
        if deleted or (os.path.lexists(dest) and theirs != base and theirs != data):
            dest = dest.with_name(f"{dest.name}.evolve-{cycle}")
            out.beside.append(rel)
        elif theirs == data:
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


def _written(tree: Path, start: str) -> list[str]:
    """Paths under ``.agents/`` the agent added or changed since ``start`` (committed or not), sorted."""
    out = set(git(tree, "diff", "--name-only", "-z", "--no-renames", start, "--", ".agents").split("\0"))
    listing = git(tree, "ls-files", "-z", "--others", "--exclude-standard", "--", ".agents")
    out |= set(listing.split("\0"))
    return sorted(p for p in out if p and p.startswith(".agents/"))


def _at(tree: Path, start: str, rel: str) -> bytes | None:
    proc = run_git(tree, "cat-file", "blob", f"{start}:{rel}")
    return proc.stdout.encode("utf-8", "surrogateescape") if proc.returncode == 0 else None


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


def _queue_lines(ctx: FireContext, tree: Path, start: str, rel: str, cycle: int) -> int:
    """The queue lines the agent added in its copy, as follow-up items of the real queue."""
    try:
        now = _read_plain(tree / rel) or b""
    except OSError:
        return 0
    before = set((_at(tree, start, rel) or b"").splitlines())
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
