"""Git for the agent's own worktree (docs/DESIGN.md §8.3): create it, set work aside, land commits.

Everything goes through :func:`evolve.git.run.run_git` (no hooks, minimal environment, bounded). The
worktree is evolve's alone and always detached: no branch moves when evolve commits or resets in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.git.pathargs import stage
from evolve.git.refs import head, rev
from evolve.git.run import SAFE, GitError, GitPolicy, git, identity, run_git

# Per-checkout files the agent's worktree shares with the operator's checkout by a link: the
# directory ``/evolve`` tooling writes to (git-ignored, so absent from a worktree) and the CLI's
# local settings (autocompact, hooks). Listed in info/exclude so no ``git add -A`` picks the links up.
# Per-checkout files of the operator's that reach the agent: what `evolve setup` wrote for it. Never
# ``.agents``: evolve's state lives there; the agent gets a copy by the door (evolve/cycle/door.py).
SHARED = (".claude/settings.local.json", "CLAUDE.local.md")


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








OWNED = "evolve-owned"  # in the worktree's admin dir (<common>/worktrees/<name>/): evolve made it


def ensure(repo: Path, path: Path, base: str, policy: GitPolicy = SAFE, *, adopt: bool = False) -> bool:
    """The agent's worktree at ``path``, detached at ``base``; made (again) when missing or broken.

    True when it had to be made. What is at ``path`` is only ever removed when it is this repository's
    worktree (its ``.git`` file points into our ``worktrees/``) *and* evolve made it (:data:`OWNED` in its
    admin dir), never anything else: a ``[git] worktree_dir`` naming the operator's own linked worktree
    is refused, its branch untouched. ``adopt``: a detached worktree without the mark at evolve's default
    path is one an older evolve made; it is marked now.
    """
    admin = _admin_dir(path)
    if admin is not None and admin.parent.resolve() != (common_dir(repo) / "worktrees").resolve():
        raise GitError(f"{path} is another repository's git worktree; set [git] worktree_dir to a path of this "
                       "repository's own (one worktree_dir shared by several repositories never works)")
    if admin is not None and not (admin / OWNED).exists():
        attached = _attached_branch(path)
        if attached or not adopt:
            what = f"it has branch {attached.removeprefix('refs/heads/')} checked out" if attached else "it has no mark"
            raise GitError(f"{path} is a git worktree evolve did not create ({what}); set [git] worktree_dir "
                           "to a path of its own (or remove that worktree with `git worktree remove`)")
        (admin / OWNED).write_text("made by evolve for its agent (docs/DESIGN.md §8.3)\n", encoding="utf-8")
    if admin is not None and rev(path, "HEAD") and _registered(repo, path):
        _link_crypt_keys(repo, admin)
        return False
    if path.exists() or path.is_symlink():
        if admin is None:
            raise GitError(f"{path} exists and is not this repository's worktree; move it or set [git] worktree_dir")
        run_git(repo, "worktree", "remove", "--force", str(path))
        if path.exists():  # ours, but git cannot remove it (its HEAD broken): the files go, it is rebuilt
            shutil.rmtree(path)
    run_git(repo, "worktree", "prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Made without a checkout, marked and given git-crypt's keys, then checked out through the filters.
    git(repo, "worktree", "add", "-q", "--no-checkout", "--detach", str(path), base, policy=policy)
    made = _admin_dir(path)
    if made is None or made.parent.resolve() != (common_dir(repo) / "worktrees").resolve():
        raise GitError(f"git made no worktree at {path}")
    (made / OWNED).write_text("made by evolve for its agent (docs/DESIGN.md §8.3)\n", encoding="utf-8")
    try:
        _link_crypt_keys(repo, made)
        git(path, "reset", "-q", "--hard", base, policy=policy)
    except (GitError, OSError):
        run_git(repo, "worktree", "remove", "--force", str(path))  # no half-made worktree left behind
        raise
    return True


def _link_crypt_keys(repo: Path, admin: Path) -> None:
    """git-crypt looks for its keys in the worktree's own git dir, not the shared one (AGWA/git-crypt#105):
    link them there when the operator has unlocked the repository."""
    keys = common_dir(repo) / "git-crypt"
    link = admin / "git-crypt"
    if keys.is_dir() and not os.path.lexists(link):
        link.symlink_to(keys, target_is_directory=True)


def _admin_dir(path: Path) -> Path | None:
    """The worktree's admin dir (``<common dir>/worktrees/<name>``) when ``path`` is a linked worktree, else
    None; whose repository it belongs to is the caller's question (the admin dir's parent)."""
    if path.is_symlink() or not (path / ".git").is_file():
        return None
    text = (path / ".git").read_text(encoding="utf-8", errors="replace").strip()
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(os.path.normpath(path / text[len("gitdir:"):].strip()))
    return gitdir if gitdir.is_dir() and gitdir.parent.name == "worktrees" else None


def _attached_branch(path: Path) -> str:
    admin = _admin_dir(path)
    try:
        text = (admin / "HEAD").read_text(encoding="utf-8", errors="replace").strip() if admin else ""
    except OSError:
        return ""
    return text[4:].strip() if text.startswith("ref:") else ""


def _registered(repo: Path, path: Path) -> bool:
    with contextlib.suppress(OSError, GitError):
        return any(c.path.resolve() == path.resolve() for c in checkouts(repo))
    return False


def share(repo: Path, tree: Path, log: Any = None) -> None:
    """Link the per-checkout files of :data:`SHARED` from the operator's checkout into the worktree.

    Never through a link the repository committed: a ``.claude`` that is a symlink in the worktree
    (checked out from the repository) would put evolve's link wherever it points, outside both trees.
    """
    # The agent's .agents/ is a directory of its own (evolve/cycle/door.py fills it): a copy where the
    # repository does not track .agents/, excluded like the operator's; the checked-out one where it does
    # (then only evolve's state directory inside it is excluded: excluding /.agents would hide the
    # operator's new files there from their own `git status`).
    tracked = bool(git(repo, "ls-files", "-z", "--", ".agents").strip("\0"))
    names = list(SHARED)
    excluded = [*names, ".agents/evolve" if tracked else ".agents"]
    exclude = common_dir(repo) / "info" / "exclude"
    lines = exclude.read_text(encoding="utf-8", errors="replace").splitlines() if exclude.exists() else []
    want = [f"/{name}" for name in excluded if f"/{name}" not in lines]
    if want:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a", encoding="utf-8") as fh:
            fh.write(("\n" if lines and lines[-1] else "") + "# evolve: links in its agent worktree\n")
            fh.write("".join(f"{w}\n" for w in want))
    for name in names:
        source, link = repo / name, tree / name
        if os.path.lexists(link) or not os.path.lexists(source):
            continue  # tracked in the repository (then the worktree has its own), or nothing to share
        parts = link.relative_to(tree).parts
        parents = [tree.joinpath(*parts[:i]) for i in range(1, len(parts))]
        linked = next((p for p in parents if os.path.islink(p) or (os.path.lexists(p) and not os.path.isdir(p))), None)
        if linked is not None:
            if log is not None:
                log.warning("workspace.link_not_followed", path=str(linked), skipped=name,
                            detail="a link (or file) from the repository is in the way: nothing written through it")
            continue
        for p in parents:
            if not os.path.lexists(p):
                p.mkdir()
        link.symlink_to(source)


def attached(tree: Path) -> str:
    """The branch the worktree's HEAD names (``refs/heads/...``), or "" when detached."""
    proc = run_git(tree, "symbolic-ref", "-q", "HEAD")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def detach(tree: Path, policy: GitPolicy = SAFE) -> None:
    """Detach the worktree's HEAD where it is (files and index untouched): no branch moves with it."""
    if attached(tree):
        sha = head(tree)
        if sha:
            git(tree, "update-ref", "--no-deref", "-m", "evolve: detach", "HEAD", sha, policy=policy)


def reset(tree: Path, sha: str, policy: GitPolicy = SAFE) -> None:
    """The worktree exactly at ``sha``, detached: changes and untracked files gone (ignored ones and the
    links stay). Detached first, so a branch the agent checked out there is never moved by the reset."""
    detach(tree, policy)
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
        stage(tree, paths, extra_env=env)  # any number of paths, in linear time
        snap = git(tree, "write-tree", extra_env=env).strip()
        parent = ["-p", base] if base else []
        sha = git(tree, "commit-tree", snap, *parent, "-m", message, extra_env=env).strip()
    git(tree, "update-ref", ref, sha)
    return ref
