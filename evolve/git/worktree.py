"""Git for the agent's own worktree (docs/DESIGN.md §8.3): create it, set work aside, land commits.

Everything goes through :func:`evolve.git.run.run_git` (no hooks, minimal environment, bounded). The
branch the operator works on only ever moves by compare-and-swap (``update-ref <ref> <new> <old>``)
or by git's own fast-forward in the checkout that has it, which refuses to overwrite a local change.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from evolve.git.refs import head, rev
from evolve.git.run import SAFE, GitError, GitPolicy, git, identity, run_git

# Per-checkout files the agent's worktree shares with the operator's checkout by a link: the
# directory ``/evolve`` tooling writes to (git-ignored, so absent from a worktree) and the CLI's
# local settings (autocompact, hooks). Listed in info/exclude so no ``git add -A`` picks the links up.
SHARED = (".agents", ".claude/settings.local.json", "CLAUDE.local.md")


def common_dir(repo: Path) -> Path:
    out = git(repo, "rev-parse", "--git-common-dir").strip()
    return (repo / out).resolve() if not os.path.isabs(out) else Path(out)








@dataclass(frozen=True)
class Checkout:
    path: Path
    head: str | None
    branch: str | None


def checkouts(repo: Path) -> list[Checkout]:
    """Every worktree of the repository (``git worktree list --porcelain -z``)."""
    out = git(repo, "worktree", "list", "--porcelain", "-z")
    found: list[Checkout] = []
    rec: dict[str, str] = {}
    for field_ in [*out.split("\0"), ""]:
        if field_:
            key, _, value = field_.partition(" ")
            rec[key] = value
            continue
        if "worktree" in rec:
            found.append(Checkout(Path(rec["worktree"]), rec.get("HEAD"), rec.get("branch")))
        rec = {}
    return found








def ensure(repo: Path, path: Path, base: str, policy: GitPolicy = SAFE) -> bool:
    """The agent's worktree at ``path``, detached at ``base``; made (again) when missing or broken.

    True when it had to be made. What is at ``path`` is only ever removed when it is this repository's
    worktree (its ``.git`` file points into our ``worktrees/``), never anything else.
    """
    if (path / ".git").is_file() and rev(path, "HEAD") and _registered(repo, path):
        return False
    if path.exists() or path.is_symlink():
        if not _ours(repo, path):
            raise GitError(f"{path} exists and is not this repository's worktree; move it or set [git] worktree_dir")
        run_git(repo, "worktree", "remove", "--force", str(path))
        if path.exists():  # ours, but git cannot remove it (its HEAD broken): the files go, it is rebuilt
            shutil.rmtree(path)
    run_git(repo, "worktree", "prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "worktree", "add", "-q", "--detach", str(path), base, policy=policy)
    return True


def _ours(repo: Path, path: Path) -> bool:
    if path.is_symlink() or not (path / ".git").is_file():
        return False
    text = (path / ".git").read_text(encoding="utf-8", errors="replace").strip()
    if not text.startswith("gitdir:"):
        return False
    gitdir = Path(os.path.normpath(path / text[len("gitdir:"):].strip()))
    return gitdir.parent == common_dir(repo) / "worktrees"


def _registered(repo: Path, path: Path) -> bool:
    with contextlib.suppress(OSError, GitError):
        return any(c.path.resolve() == path.resolve() for c in checkouts(repo))
    return False


def share(repo: Path, tree: Path) -> None:
    """Link the per-checkout files of :data:`SHARED` from the operator's checkout into the worktree."""
    exclude = common_dir(repo) / "info" / "exclude"
    lines = exclude.read_text(encoding="utf-8", errors="replace").splitlines() if exclude.exists() else []
    want = [f"/{name}" for name in SHARED if f"/{name}" not in lines]
    if want:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a", encoding="utf-8") as fh:
            fh.write(("\n" if lines and lines[-1] else "") + "# evolve: links in its agent worktree\n")
            fh.write("".join(f"{w}\n" for w in want))
    for name in SHARED:
        source, link = repo / name, tree / name
        if name == ".agents":
            source.mkdir(exist_ok=True)
        if link.is_symlink() or link.exists() or not (source.exists() or source.is_symlink()):
            continue  # tracked in the repository (then the worktree has its own), or nothing to share
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source)


def reset(tree: Path, sha: str, policy: GitPolicy = SAFE) -> None:
    """The worktree exactly at ``sha``: changes and untracked files gone (ignored ones and the links stay)."""
    git(tree, "reset", "-q", "--hard", sha, policy=policy)
    git(tree, "clean", "-q", "-f", "-d", policy=policy)


def save_tree(tree: Path, paths: Iterable[str], ref: str, message: str) -> str:
    """A commit of ``paths`` as they are in ``tree`` now, on its HEAD, kept under ``ref``.

    A scratch index (the worktree's own may be held by a killed git's ``index.lock``), no signing.
    """
    ident = identity(tree)
    paths = sorted(set(paths))
    with tempfile.TemporaryDirectory(prefix="evolve-save-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **ident}
        base = head(tree)
        if base:
            git(tree, "read-tree", base, extra_env=env)
        if paths:
            git(tree, "add", "-A", "--", *paths, extra_env=env)
        snap = git(tree, "write-tree", extra_env=env).strip()
        parent = ["-p", base] if base else []
        sha = git(tree, "commit-tree", snap, *parent, "-m", message, extra_env=env).strip()
    git(tree, "update-ref", ref, sha)
    return ref




def fast_forward(checkout: Path, new: str, policy: GitPolicy = SAFE) -> bool:
    """Git's own fast-forward in the operator's checkout: refuses (False) rather than touch a local change."""
    ident = identity(checkout)
    return run_git(checkout, "merge", "-q", "--ff-only", "--no-edit", new, policy=policy,
                   extra_env=ident).returncode == 0


def rebase(tree: Path, onto: str, upstream: str, policy: GitPolicy = SAFE) -> str | None:
    """Replay the worktree's commits after ``upstream`` onto ``onto``; the new HEAD, or None on conflict."""
    ident = identity(tree)
    proc = run_git(tree, "rebase", "-q", "--onto", onto, upstream, policy=policy, extra_env=ident)
    if proc.returncode != 0:
        run_git(tree, "rebase", "--abort", policy=policy, extra_env=ident)
        return None
    return head(tree)
