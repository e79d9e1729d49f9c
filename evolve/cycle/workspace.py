"""Where the agent works, and how its green commits reach the operator's branch (docs/DESIGN.md §8.3).

``[git] isolation = "worktree"`` (the default): the agent runs in evolve's own git worktree at a stable
path, detached at the *base* (the branch tip, or the tip of green commits still waiting to land). The
gate runs there; red is a hard reset of that worktree, which nobody else uses. Green commits land on
the operator's branch only by compare-and-swap, and the operator's checkout only moves by git's own
fast-forward when none of their changed or untracked paths is among the landing's: their edits and
commits are never reverted, deleted or committed by evolve. When the branch moved during the cycle,
the commits are replayed onto it and gated again. A fire that died mid-cycle leaves its changes in
the worktree: the next fire sets them aside under ``refs/evolve/stranded/<cycle>`` and starts clean.

``"none"``: the agent works in the operator's checkout (hand fires, a repository nobody else touches),
with the old rules: the cycle's own paths are restored on red, the operator's dirty paths left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from evolve.git import change as gitchange
from evolve.git import refs as gitrefs
from evolve.git import run as gitrun
from evolve.git import worktree
from evolve.git.run import GitError, GitPolicy
from evolve.store.atomic import read_json, write_json

LAND_ATTEMPTS = 3


@dataclass(frozen=True)
class Start:
    """What a cycle starts from: the tree the agent works in, its commit, the paths already dirty there."""

    tree: Path
    sha: str | None
    dirty_before: frozenset[str] = frozenset()


def start_of(tree: Path) -> Start:
    """The cycle's start in ``tree``: its HEAD and what is already dirty there (not the cycle's)."""
    return Start(tree, gitrefs.head(tree), frozenset(gitchange.dirty_paths(tree)))


class Land(StrEnum):
    NOTHING = "nothing"  # no commit to land
    LANDED = "landed"  # on the branch (and in the operator's checkout when it has the branch)
    PENDING = "pending"  # kept under refs/evolve/pending/<branch>: the checkout has changes in its paths
    CONFLICT = "conflict"  # the branch moved and the commits do not replay, or are red on it


@dataclass(frozen=True)
class Landing:
    outcome: Land
    sha: str | None = None
    ref: str | None = None  # where the commits wait (pending) or were kept (conflict)
    detail: str = ""
    fields: dict[str, Any] = field(default_factory=dict)


def land_step(*, tip: str | None, ours_on_tip: bool, holder_dirty_overlap: bool | None) -> str:
    """The next landing step (pure): ``gone``, ``rebase``, ``cas`` (nobody has the branch checked out),
    ``fast_forward`` (the operator's checkout has it, and none of their changes is in our paths) or
    ``hold`` (it has it, and some are)."""
    if tip is None:
        return "gone"
    if not ours_on_tip:
        return "rebase"
    if holder_dirty_overlap is None:
        return "cas"
    return "hold" if holder_dirty_overlap else "fast_forward"


class InPlace:
    """The agent works in the operator's checkout; commits are made on its HEAD (isolation "none")."""

    isolated = False

    def __init__(self, repo: Path, policy: GitPolicy, log: Any) -> None:
        self.repo = self.tree = repo
        self.policy = policy
        self.log = log

    def prepare(self, cycle: int) -> None:
        """Nothing to set up: the operator's checkout is used as it is."""

    def begin(self, cycle: int) -> None:
        """Nothing to do: the cycle starts from the checkout as the operator left it."""

    def undo(self, start: Start) -> None:
        gitchange.restore_cycle(self.repo, start.sha, set(start.dirty_before), self.policy)

    def land(self, cycle: int, start: Start) -> Landing:
        now = gitrefs.head(self.repo)
        return Landing(Land.LANDED, now) if now and now != start.sha else Landing(Land.NOTHING)


class Isolated:
    """The agent's own worktree, landed on ``branch`` (``refs/heads/...``) of the operator's checkout."""

    isolated = True

    def __init__(
        self, repo: Path, tree: Path, branch: str, policy: GitPolicy, log: Any, intent: Path,
        regate: Callable[[Path], str | None] | None = None,
    ) -> None:
        self.repo, self.tree, self.branch = repo, tree, branch
        self.policy = policy
        self.log = log
        self.intent = intent  # a fast-forward in progress: finished or known undone after a crash
        self.regate = regate  # the gate commands, run in the worktree after a replay: a red reason or None
        self.pending_ref = gitrefs.PENDING_REF + branch.removeprefix("refs/heads/")

    # -- between cycles ------------------------------------------------------------------------

    def base(self) -> str:
        pending = gitrefs.rev(self.repo, self.pending_ref)
        tip = gitrefs.rev(self.repo, self.branch)
        if pending and tip and gitrefs.is_ancestor(self.repo, tip, pending):
            return pending
        if pending and tip and gitrefs.is_ancestor(self.repo, pending, tip):  # landed by someone: done
            gitrefs.delete_ref(self.repo, self.pending_ref)
            return tip
        if tip is None:
            raise GitError(f"branch {self.branch} is gone")
        return pending or tip

    def prepare(self, cycle: int) -> None:
        """At a fire's start: finish or forget a fast-forward cut short, make the worktree, set aside
        what a dead cycle left in it, land what waits, and stand at the base."""
        self._settle_intent()
        base = self.base()
        if worktree.ensure(self.repo, self.tree, base, self.policy):
            self.log.info("workspace.made", path=str(self.tree), base=base)
        self._clear_stale_lock()
        worktree.share(self.repo, self.tree)
        self._set_aside(cycle, base)
        if gitrefs.rev(self.repo, self.pending_ref):
            worktree.reset(self.tree, self.base(), self.policy)
            landing = self._land(cycle, gitrefs.rev(self.repo, self.pending_ref) or "")
            self.log.info("land.pending", outcome=landing.outcome, sha=landing.sha, ref=landing.ref)
        worktree.reset(self.tree, self.base(), self.policy)

    def _clear_stale_lock(self) -> None:
        """Only evolve's git and its agent use this worktree, and under the fire lock with the last fire's
        groups reaped, none of them is running: a lock left in it is a killed git's, safe to remove."""
        lock = Path(gitrun.git(self.tree, "rev-parse", "--path-format=absolute", "--git-path", "index.lock").strip())
        if lock.exists():
            lock.unlink()
            self.log.warning("workspace.stale_lock_removed", path=str(lock))

    def _set_aside(self, cycle: int, base: str) -> str | None:
        """A dead cycle's work (changes, untracked files, its own commits) kept under a ref; None if none."""
        head = gitrefs.head(self.tree)
        dirty = {p for p in gitchange.dirty_paths(self.tree) if not gitchange.is_internal(p)}
        own_commits = bool(head) and head != base and not gitrefs.is_ancestor(self.repo, head or "", base)
        if not dirty and not own_commits:
            return None
        ref = self._free_ref(gitrefs.STRANDED_REF, cycle)
        worktree.save_tree(self.tree, dirty, ref, f"evolve: work stranded by a dead cycle (before cycle {cycle})")
        self.log.warning("workspace.stranded", ref=ref, paths=len(dirty), commits=own_commits)
        worktree.reset(self.tree, base, self.policy)
        return ref

    def _free_ref(self, prefix: str, cycle: int) -> str:
        ref, n = f"{prefix}{cycle}", 1
        while gitrefs.rev(self.repo, ref):
            n += 1
            ref = f"{prefix}{cycle}-{n}"
        return ref

    def begin(self, cycle: int) -> None:
        """The worktree at the base, clean; anything else found there is set aside first, never lost."""
        base = self.base()
        if gitrefs.head(self.tree) != base or gitchange.dirty_paths(self.tree):
            self._set_aside(cycle, base)
            worktree.reset(self.tree, base, self.policy)

    def undo(self, start: Start) -> None:
        if start.sha:
            worktree.reset(self.tree, start.sha, self.policy)

    # -- landing -------------------------------------------------------------------------------

    def land(self, cycle: int, start: Start) -> Landing:
        """Put the worktree's new commits on the branch (§8.3); the worktree then stands at the new base."""
        new = gitrefs.head(self.tree)
        if not new or new == start.sha:
            return Landing(Land.NOTHING)
        return self._land(cycle, new)

    def _land(self, cycle: int, new: str) -> Landing:
        for _ in range(LAND_ATTEMPTS):
            tip = gitrefs.rev(self.repo, self.branch)
            ours_on_tip = bool(tip) and gitrefs.is_ancestor(self.repo, tip or "", new)
            holder = next((c for c in worktree.checkouts(self.repo) if c.branch == self.branch), None)
            overlap = None
            if tip and ours_on_tip and holder is not None:
                theirs = gitchange.dirty_paths(holder.path)
                overlap = bool(gitchange.changed(self.repo, tip, new) & theirs)
            step = land_step(tip=tip, ours_on_tip=ours_on_tip, holder_dirty_overlap=overlap)
            if step == "gone":
                return self._conflict(cycle, new, f"branch {self.branch} is gone")
            if step == "rebase":
                replayed = self._replay(cycle, new, tip or "")
                if isinstance(replayed, Landing):
                    return replayed
                new = replayed
                continue
            if step == "hold":
                return self._hold(new, "the operator's checkout has changes in the same paths")
            done = (gitrefs.update_ref(self.repo, self.branch, new, tip) if step == "cas"
                    else self._fast_forward(holder.path if holder else self.repo, tip or "", new))
            if done:
                gitrefs.delete_ref(self.repo, self.pending_ref)
                self.log.info("land.landed", sha=new, branch=self.branch, how=step)
                return Landing(Land.LANDED, new)
        return self._hold(new, "the branch kept moving, or git refused the fast-forward")

    def _replay(self, cycle: int, new: str, tip: str) -> str | Landing:
        """The branch moved under us: our commits replayed onto it, and gated again there."""
        worktree.reset(self.tree, new, self.policy)
        replayed = worktree.rebase(self.tree, tip, tip, self.policy)
        if replayed is None:
            return self._conflict(cycle, new, f"the branch moved and the commits do not replay onto {tip[:12]}")
        red = self.regate(self.tree) if self.regate is not None else None
        if red:
            return self._conflict(cycle, new, f"red after replaying onto the moved branch: {red}")
        self.log.info("land.replayed", old=new, new=replayed, onto=tip)
        return replayed

    def _hold(self, new: str, why: str) -> Landing:
        git_ok = gitrefs.update_ref(self.repo, self.pending_ref, new, gitrefs.rev(self.repo, self.pending_ref))
        if not git_ok:
            raise GitError(f"cannot keep the green commits under {self.pending_ref}")
        self.log.warning("land.pending", sha=new, ref=self.pending_ref, why=why)
        return Landing(Land.PENDING, new, self.pending_ref, why, {"landed": False, "pending_ref": self.pending_ref})

    def _conflict(self, cycle: int, new: str, why: str) -> Landing:
        ref = self._free_ref(gitrefs.UNLANDED_REF, cycle)
        gitrefs.update_ref(self.repo, ref, new, None)
        gitrefs.delete_ref(self.repo, self.pending_ref)
        self.log.error("land.conflict", sha=new, ref=ref, why=why)
        with contextlib.suppress(GitError):
            worktree.reset(self.tree, self.base(), self.policy)
        return Landing(Land.CONFLICT, new, ref, why)

    def _fast_forward(self, checkout: Path, old: str, new: str) -> bool:
        """The operator's checkout moved by git's fast-forward; an intent record covers a death halfway."""
        write_json(self.intent, {"checkout": str(checkout), "branch": self.branch, "old": old, "new": new})
        try:
            return worktree.fast_forward(checkout, new, self.policy)
        finally:
            self.intent.unlink(missing_ok=True)

    def _settle_intent(self) -> None:
        """After a crash inside git's fast-forward: the files may be at ``new`` while the branch is still
        at ``old`` (the operator would see our change as theirs, staged): finish the ref move then."""
        rec = read_json(self.intent) if self.intent.exists() else None
        if not isinstance(rec, dict):
            self.intent.unlink(missing_ok=True)
            return
        checkout, old, new = Path(str(rec.get("checkout"))), str(rec.get("old")), str(rec.get("new"))
        if gitrefs.rev(self.repo, self.branch) == old and checkout.is_dir():
            staged_new = gitrun.run_git(checkout, "diff-index", "--cached", "--quiet", new, "--").returncode == 0
            if staged_new and gitrefs.update_ref(self.repo, self.branch, new, old):
                self.log.warning("land.finished_after_crash", sha=new, branch=self.branch)
        self.intent.unlink(missing_ok=True)


Workspace = InPlace | Isolated


def default_tree(evolve_dir: Path) -> Path:
    """In evolve's state directory: stable (agent sessions resume by cwd), writable wherever the state is
    (the units' ``ReadWritePaths``), git-ignored with it, and not under ``.git`` (the Claude CLI refuses
    to edit anything there)."""
    return evolve_dir / "worktree"


def open_workspace(repo: Path, evolve_dir: Path, cfg_git: Any, policy: GitPolicy, log: Any, intent: Path,
                   regate: Callable[[Path], str | None] | None = None) -> Workspace:
    """The configured workspace; in place (with a warning) when the checkout has no branch to land on."""
    if cfg_git.isolation != "worktree":
        return InPlace(repo, policy, log)
    branch = gitrefs.branch_of(repo)
    if branch is None:
        log.warning("workspace.in_place", reason="HEAD is detached or has no commit: nothing to land on")
        return InPlace(repo, policy, log)
    tree = Path(cfg_git.worktree_dir).expanduser() if cfg_git.worktree_dir else default_tree(evolve_dir)
    if not tree.is_absolute():
        tree = repo / tree
    return Isolated(repo, tree, branch, policy, log, intent, regate)


def describe(ws: Workspace) -> dict[str, Any]:
    """What ``fire --dry-run`` shows: where the agent would work and where its commits would land."""
    if isinstance(ws, Isolated):
        return {"isolation": "worktree", "tree": str(ws.tree), "branch": ws.branch, "pending_ref": ws.pending_ref}
    return {"isolation": "none", "tree": str(ws.tree)}
