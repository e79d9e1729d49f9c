"""Git operations the cycle needs, always by explicit path and argv (never ``git add -A``).

``subprocess`` is imported inside the functions that start git: every command (``evolve status``
too) imports this module for :func:`git_toplevel`, which usually needs no git process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from evolve.errors import UsageError

NON_SUBSTANTIVE_FILES = ("GOALS.md", "GOALS.yaml", "GOALS.yml")


class GitError(Exception):
    pass


def _env(repo: Path) -> Mapping[str, str]:
    import subprocess

    env = dict(os.environ)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    # A repo without an identity must still be committable by an unattended loop.
    probe = subprocess.run(["git", "config", "user.email"], cwd=repo, capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.strip():
        env.setdefault("GIT_AUTHOR_NAME", "evolve")
        env.setdefault("GIT_AUTHOR_EMAIL", "evolve@localhost")
        env.setdefault("GIT_COMMITTER_NAME", "evolve")
        env.setdefault("GIT_COMMITTER_EMAIL", "evolve@localhost")
    return env


def git(repo: Path, *args: str, check: bool = True, env: Mapping[str, str] | None = None) -> str:
    import subprocess

    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise GitError(f"git {args[0]} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def head(repo: Path) -> str | None:
    import subprocess

    proc = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=repo, capture_output=True, text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


# Variables that change how git finds the repository: with any of them set, git itself decides.
_DISCOVERY_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_CEILING_DIRECTORIES",
                  "GIT_DISCOVERY_ACROSS_FILESYSTEM")

_BARE = re.compile(rb"^\s*bare\s*(?:=(?!\s*false\s*$)|$)", re.M)


def git_toplevel(start: Path, env: Mapping[str, str] | None = None) -> Path:
    """The git top level containing ``start``; a usage error outside a repository.

    Every command starts here, ``evolve status`` and the session-start hook included, so the common
    case (a plain ``.git`` directory we own above ``start``) is found by walking up without starting
    git (~10 ms); anything git might answer differently goes to ``git rev-parse --show-toplevel``.
    """
    env = os.environ if env is None else env
    found = None if any(k in env for k in _DISCOVERY_ENV) else _plain_toplevel(start)
    return found if found is not None else _rev_parse_toplevel(start)


def _plain_toplevel(start: Path) -> Path | None:
    """The nearest ancestor with a plain ``.git`` directory git would accept; None when unsure.

    Unsure means: ``start`` inside a ``.git`` directory, a ``.git`` file (worktree, submodule), a
    repository with ``core.worktree``/``core.bare``, one owned by another user (``safe.directory``), a
    file-system boundary crossed on the way up (git stops there), or no repository at all.
    """
    try:
        here = start.resolve()
        dev = os.stat(here).st_dev
        for d in (here, *here.parents):
            if d.name == ".git" or os.stat(d).st_dev != dev:
                return None
            dot = d / ".git"
            if dot.is_file() or dot.is_symlink():
                return None
            if dot.is_dir():
                return d if _acceptable_git_dir(d, dot) else None
    except (OSError, RuntimeError):
        return None
    return None


def _acceptable_git_dir(top: Path, dot: Path) -> bool:
    if not ((dot / "HEAD").is_file() and (dot / "objects").is_dir() and (dot / "refs").is_dir()):
        return False
    uid = os.geteuid()
    if os.stat(top).st_uid != uid or os.stat(dot).st_uid != uid:
        return False
    try:
        config = (dot / "config").read_bytes().lower()
    except FileNotFoundError:
        config = b""
    # A ``bare`` key with any value but false, or a ``worktree`` anywhere: let git decide.
    return b"worktree" not in config and _BARE.search(config) is None


def _rev_parse_toplevel(start: Path) -> Path:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=start,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise UsageError("git is not installed; evolve needs it") from exc
    if out.returncode != 0:
        raise UsageError(f"{start} is not inside a git repository (use --repo PATH)")
    return Path(out.stdout.strip())


def is_internal(path: str) -> bool:
    return path == ".agents" or path.startswith(".agents/")


def dirty_paths(repo: Path) -> set[str]:
    """Paths with uncommitted changes or untracked, as git reports them (``-z``: names verbatim)."""
    out = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    paths: set[str] = set()
    parts = out.split("\0")
    i = 0
    while i < len(parts):
        rec = parts[i]
        i += 1
        if len(rec) < 4:
            continue
        status, path = rec[:2], rec[3:]
        paths.add(path)
        if "R" in status or "C" in status:
            if i < len(parts) and parts[i]:
                paths.add(parts[i])  # the rename's source path
            i += 1
    return paths


def changed_since(repo: Path, start: str | None) -> set[str]:
    """Paths that differ between ``start`` and HEAD (commits the agent made itself)."""
    now = head(repo)
    if not start or not now or start == now:
        return set()
    out = git(repo, "diff", "--name-only", "-z", f"{start}..{now}")
    return {p for p in out.split("\0") if p}


def foreign_commits(repo: Path, since: object) -> int:
    """Commits on HEAD after ``since`` that the loop did not make (intervening events, docs/DESIGN.md §5)."""
    import subprocess

    if not isinstance(since, str) or not since:
        return 0
    proc = subprocess.run(["git", "log", "--format=%s", f"{since}..HEAD"], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        return 0
    return sum(1 for subject in proc.stdout.splitlines() if not subject.startswith("evolve: "))


def substantive(paths: Iterable[str]) -> list[str]:
    """Paths that count as a real change: outside ``.agents/`` and the GOALS files."""
    return sorted(p for p in paths if not is_internal(p) and p not in NON_SUBSTANTIVE_FILES)


def commit_paths(repo: Path, paths: Iterable[str], message: str) -> str | None:
    """Stage and commit exactly ``paths``; returns the new HEAD (None when nothing was staged)."""
    paths = sorted(set(paths))
    if not paths:
        return None
    env = _env(repo)
    git(repo, "add", "--", *paths, env=env)
    staged = git(repo, "diff", "--cached", "--name-only", "-z", "--", *paths, env=env)
    if not staged.strip("\0"):
        return None
    git(repo, "commit", "-q", "--no-verify", "-m", message, "--", *paths, env=env)
    return head(repo)


def restore_cycle(repo: Path, start: str | None, paths_before: set[str]) -> list[str]:
    """Undo what a cycle did: restore the paths it dirtied, then revert its commits.

    Paths that were already dirty before the cycle are the operator's and are left alone. A revert
    that cannot apply is aborted and reported (GitError), never left half-done.
    """
    env = _env(repo)
    touched = sorted(p for p in dirty_paths(repo) - paths_before if not is_internal(p))
    tracked = set(git(repo, "ls-files", "-z", "--", *touched).split("\0")) if touched else set()
    for p in touched:
        if p in tracked:
            git(repo, "checkout", "-q", "HEAD", "--", p, env=env)
        else:
            target = repo / p
            if target.is_file() or target.is_symlink():
                target.unlink()
    now = head(repo)
    if start and now and now != start:
        try:
            git(repo, "revert", "--no-edit", f"{start}..{now}", env=env)
        except GitError:
            git(repo, "revert", "--abort", check=False, env=env)
            raise
    return touched


def commit_message(cycle: int, target: str, result: str, cap: int = 72) -> str:
    """The commit's subject; ``target`` (a work item's title) is redacted before it is capped."""
    from evolve.redact import current  # the sink: git history is pushed and outlives every log

    target = current().text(target)
    if len(target) > cap:
        target = target[: cap - 1] + "…"
    return f"evolve: cycle {cycle} -- {target} {result}"
