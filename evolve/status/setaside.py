"""Work evolve set aside under ``refs/evolve/`` (docs/DESIGN.md §8.3), read for ``status`` and the report.

Read from the repository's files (loose refs and ``packed-refs``), not by running git: ``status`` must
start fast. Only counting the commits that wait to land runs git, and only when some do.
"""

from __future__ import annotations

import os
from pathlib import Path

KINDS = ("stranded", "unlanded", "uncommitted", "pending")
PREFIX = "refs/evolve/"


def common_dir(repo: Path) -> Path | None:
    """The repository's git directory shared by its worktrees; None when ``repo`` has none."""
    dot = repo / ".git"
    if dot.is_dir():
        return dot
    try:
        text = dot.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(os.path.join(repo, text[len("gitdir:"):].strip()))
    try:
        rel = (gitdir / "commondir").read_text(encoding="utf-8").strip()
    except OSError:
        return gitdir
    return Path(os.path.normpath(gitdir / rel))


def evolve_refs(repo: Path) -> dict[str, list[str]]:
    """``{kind: [ref, ...]}`` for every kind of :data:`KINDS` that has refs, sorted."""
    git = common_dir(repo)
    if git is None:
        return {}
    names: set[str] = set()
    base = git / "refs" / "evolve"
    if base.is_dir():
        for root, _dirs, files in os.walk(base):
            for f in files:
                if not f.endswith(".lock"):
                    names.add(PREFIX + Path(root, f).relative_to(base).as_posix())
    try:
        with open(git / "packed-refs", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 2 and parts[1].startswith(PREFIX):
                    names.add(parts[1])
    except OSError:
        pass
    out: dict[str, list[str]] = {}
    for name in sorted(names):
        kind = name[len(PREFIX):].split("/", 1)[0]
        if kind in KINDS:
            out.setdefault(kind, []).append(name)
    return out


def waiting_commits(repo: Path, pending_ref: str) -> int | None:
    """How many commits wait under ``pending_ref`` that its branch does not have (None: git cannot say)."""
    from evolve.git import run as gitrun

    branch = "refs/heads/" + pending_ref.removeprefix(PREFIX + "pending/")
    proc = gitrun.run_git(repo, "rev-list", "--count", f"{branch}..{pending_ref}")
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


def lines(repo: Path, refs: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(degraded reasons, warnings): work only the operator can decide about makes status degraded."""
    degraded: list[str] = []
    warnings: list[str] = []
    for ref in refs.get("stranded", []):
        degraded.append(f"a dead cycle's work is set aside at {ref}: `git show {ref}` to see it, "
                        f"`git update-ref -d {ref}` once taken or not wanted")
    for ref in refs.get("unlanded", []):
        degraded.append(f"green commits could not land on the moved branch, kept at {ref}: "
                        f"`git cherry-pick ..{ref}` to take them, `git update-ref -d {ref}` to drop")
    for ref in refs.get("uncommitted", []):
        warnings.append(f"an uncommitted change is kept at {ref} (`git update-ref -d {ref}` once not needed)")
    for ref in refs.get("pending", []):
        n = waiting_commits(repo, ref)
        count = f"{n} commit(s)" if n is not None else "commits"
        warnings.append(f"{count} wait at {ref}: your checkout has changes in the paths they change; "
                        "commit or stash yours and the next fire lands them")
    return degraded, warnings
