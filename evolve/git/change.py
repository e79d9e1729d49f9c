"""What a cycle changed in a work tree, and committing, saving or undoing exactly that (docs/DESIGN.md §8).

Always by explicit path (never a bare ``git add -A``), the paths on git's stdin (:mod:`evolve.git.pathargs`:
a change may name more than an argv holds); every git process through :func:`evolve.git.run.run_git`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from evolve.git.pathargs import FROM_STDIN, checkout_index, ls_files, named, nul, reset_index, stage
from evolve.git.refs import UNCOMMITTED_REF, free_ref, head
from evolve.git.run import SAFE, GitError, GitPolicy, git, identity, run_git

NON_SUBSTANTIVE_FILES = ("GOALS.md", "GOALS.yaml", "GOALS.yml")

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
    if not isinstance(since, str) or not since:
        return 0
    proc = run_git(repo, "log", "--format=%s", f"{since}..HEAD")
    if proc.returncode != 0:
        return 0
    return sum(1 for subject in proc.stdout.splitlines() if not subject.startswith("evolve: "))


def substantive(paths: Iterable[str]) -> list[str]:
    """Paths that count as a real change: outside ``.agents/`` and the GOALS files."""
    return sorted(p for p in paths if not is_internal(p) and p not in NON_SUBSTANTIVE_FILES)


def commit_paths(repo: Path, paths: Iterable[str], message: str, policy: GitPolicy = SAFE) -> str | None:
    """Stage and commit exactly ``paths``; returns the new HEAD (None when nothing was staged).

    ``--no-verify`` even when ``policy.run_hooks``: the gate, not a pre-commit hook, judges a cycle.
    """
    paths = sorted(set(paths))
    if not paths:
        return None
    ident = identity(repo)
    stage(repo, paths, policy=policy)
    staged = [p for p in git(repo, "diff", "--cached", "--name-only", "-z", "--no-renames",
                             policy=policy).split("\0") if p]
    want = set(paths)
    ours = sum(1 for p in staged if named(p, want))
    if not ours:
        return None
    # Nothing else staged: the index is HEAD plus exactly ``paths``, commit it as it is. Else (the operator's
    # own staged files, in place) ``--only`` them, on stdin (git matches each path against each: slower).
    only = (*FROM_STDIN,) if ours < len(staged) else ()
    git(repo, "commit", "-q", "--no-verify", "-m", message, *only, policy=policy, extra_env=ident,
        input=nul(paths) if only else None)
    return head(repo)


def restore_cycle(repo: Path, start: str | None, paths_before: set[str], policy: GitPolicy = SAFE) -> list[str]:
    """Undo what a cycle did: restore the paths it dirtied, then revert its commits.

    Paths that were already dirty before the cycle are the operator's and are left alone. A revert
    that cannot apply is aborted and reported (GitError), never left half-done.
    """
    ident = identity(repo)
    touched = sorted(p for p in dirty_paths(repo) - paths_before if not is_internal(p))
    in_head = reset_index(repo, head(repo), touched, policy=policy)  # the index entries as HEAD has them
    checkout_index(repo, sorted(in_head), policy=policy)  # and their files
    for p in touched:
        if p.rstrip("/") not in in_head:
            target = repo / p
            if target.is_file() or target.is_symlink():
                target.unlink()
    now = head(repo)
    if start and now and now != start:
        try:
            git(repo, "revert", "--no-edit", f"{start}..{now}", policy=policy, extra_env=ident)
        except GitError:
            git(repo, "revert", "--abort", check=False, policy=policy, extra_env=ident)
            raise
    return touched


def commit_message(cycle: int, target: str, result: str, cap: int = 72) -> str:
    """The commit's subject; ``target`` (a work item's title) is redacted before it is capped."""
    from evolve.redact import current  # the sink: git history is pushed and outlives every log

    target = current().text(target)
    if len(target) > cap:
        target = target[: cap - 1] + "…"
    return f"evolve: cycle {cycle} -- {target} {result}"


def save_uncommitted(repo: Path, paths: Iterable[str], cycle: int, message: str, *,
                     prefix: str = UNCOMMITTED_REF) -> str:
    """Keep ``paths`` as they are now in a commit on ``HEAD`` under ``refs/evolve/uncommitted/<cycle>[-n]``.

    A scratch index (never ``.git/index``, which a stale ``index.lock`` may hold) and no signing:
    this must work exactly when the cycle's own commit could not. Returns the ref; GitError if not.
    """
    import tempfile

    paths = sorted(set(paths))
    ident = identity(repo)
    with tempfile.TemporaryDirectory(prefix="evolve-save-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **ident}
        base = head(repo)
        if base:
            git(repo, "read-tree", base, extra_env=env)
        stage(repo, paths, extra_env=env)
        tree = git(repo, "write-tree", extra_env=env).strip()
        parent = ["-p", base] if base else []
        sha = git(repo, "commit-tree", tree, *parent, "-m", message, extra_env=env).strip()
    ref = free_ref(repo, prefix, cycle)  # never over an earlier cycle's saved change
    git(repo, "update-ref", ref, sha, "0" * 40)
    return ref


def restore_paths(repo: Path, paths: Iterable[str]) -> None:
    """Put ``paths`` back as they are in HEAD (absent there: removed), through a scratch index.

    The real index is then reset for them, best effort: with a stale ``index.lock`` it cannot be
    written, but then the failed commit never staged anything either.
    """
    import tempfile

    paths = sorted(set(paths))
    base = head(repo)
    with tempfile.TemporaryDirectory(prefix="evolve-restore-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if base:
            git(repo, "read-tree", base, extra_env=env)
        known = ls_files(repo, paths, extra_env=env)
        for p in paths:
            if p not in known and ((repo / p).is_file() or (repo / p).is_symlink()):
                (repo / p).unlink()
        checkout_index(repo, sorted(known), extra_env=env)
    if base:
        with contextlib.suppress(GitError):  # best effort, as said
            reset_index(repo, base, paths)


def changed(repo: Path, old: str, new: str) -> set[str]:
    """Paths that differ between two commits (no rename detection: a rename is both its paths)."""
    out = git(repo, "diff", "--name-only", "-z", "--no-renames", old, new)
    return {p for p in out.split("\0") if p}
