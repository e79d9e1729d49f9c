"""Where the agent works, and how its green commits reach the operator's branch (docs/DESIGN.md §8.3).

``[git] isolation = "worktree"`` (the default): the agent runs in evolve's own git worktree at a stable
path, detached at the *base* (the branch tip, or the tip of green commits still waiting to land). The
gate runs there; red is a hard reset of that worktree, which nobody else uses. What lands is decided by
:func:`evolve.git.land.plan` from a snapshot of the git state and applied by :mod:`evolve.git.landing`:
only the cycle's own commits (a chain ``base..new`` of evolve's), on the branch planned at the
cycle's start, by compare-and-swap or git's own fast-forward, never over the operator's files. A
chain that cannot land yet waits under ``refs/evolve/pending/<branch>`` (recorded in ``pending.json``
with the cycles whose items it holds); one that never can is kept under ``refs/evolve/unlanded/``.
A fire that died mid-cycle leaves its changes in the worktree: the next fire sets them aside under
``refs/evolve/stranded/<cycle>``; an interrupted cycle's are kept under ``refs/evolve/interrupted/``.

``"none"``: the agent works in the operator's checkout (hand fires, a repository nobody else touches),
with the old rules: the cycle's own paths are restored on red, the operator's dirty paths left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from evolve import crashpoint
from evolve.cycle import pending as pend
from evolve.cycle.pending import Chain, Held, Intent
from evolve.git import change as gitchange
from evolve.git import gitdir, land, landing, leaks, worktree
from evolve.git import refs as gitrefs
from evolve.git.checks import Checks
from evolve.git.land import Step
from evolve.git.run import GitError, GitPolicy, git, identity, run_git
from evolve.paths import Paths
from evolve.timeutil import utc_iso

LAND_ATTEMPTS = 3
INTERRUPTED_REF = gitrefs.ROOT + "interrupted/"  # a killed or interrupted cycle's edits, kept for the operator

# The gate again after a replay: (the worktree, the new base it was replayed onto, the stop) -> why red, or None.
Regate = Callable[[Path, str, threading.Event | None], str | None]


@dataclass(frozen=True)
class Start:
    """What a cycle starts from: the tree the agent works in, its commit, the paths already dirty there.

    ``refs``: every ref's value when the cycle began (isolated only): commits reachable from one of them
    were not made by this cycle, which is how an agent that checked out another branch is told apart.
    """

    tree: Path
    sha: str | None
    dirty_before: frozenset[str] = frozenset()
    branch: str = ""
    refs: tuple[str, ...] = ()
    ignored: frozenset[str] = frozenset()  # git-ignored entries already there (caches, setup's output)


def start_of(tree: Path) -> Start:
    """The cycle's start in ``tree``: its HEAD and what is already dirty there (not the cycle's)."""
    return Start(tree, gitrefs.head(tree), frozenset(gitchange.dirty_paths(tree)))


class Land(StrEnum):
    NOTHING = "nothing"  # no commit to land
    LANDED = "landed"  # on the branch (and in the operator's checkout when it has the branch)
    PENDING = "pending"  # waits under refs/evolve/pending/<branch>, with the reason
    CONFLICT = "conflict"  # the branch moved and the chain does not replay, or is red on it: unlanded
    REFUSED = "refused"  # the chain may not land as it is (a secret's value, a file over max_file_mb): unlanded
    INTERRUPTED = "interrupted"  # a KILL or signal came first: nothing landed, the work kept


@dataclass(frozen=True)
class Settled:
    """A cycle that waited in a chain, now settled: landed at ``sha``, or released (kept at ``ref``)."""

    held: Held
    landed: bool
    sha: str | None = None
    ref: str | None = None
    detail: str = ""
    branch: str = ""


@dataclass(frozen=True)
class Landing:
    outcome: Land
    sha: str | None = None  # this cycle's commit as it landed, waits, or was kept
    ref: str | None = None  # where it waits (pending) or was kept (conflict, refused, interrupted)
    detail: str = ""
    settled: tuple[Settled, ...] = ()  # earlier cycles of the chain this landing settled too
    secret_shapes: tuple[str, ...] = ()  # what only looks like a secret in the chain: a warning (§8.3 Secrets)

    @property
    def fields(self) -> dict[str, Any]:
        shapes = {"secret_shapes": list(self.secret_shapes)} if self.secret_shapes else {}
        if self.outcome is Land.PENDING:
            return {"landed": False, "pending_ref": self.ref, "pending_reason": self.detail[:300], **shapes}
        if self.outcome is Land.LANDED:
            return {"landed": True, **shapes}
        return {}


class InPlace:
    """The agent works in the operator's checkout; commits are made on its HEAD (isolation "none")."""

    isolated = False

    def __init__(self, repo: Path, policy: GitPolicy, log: Any) -> None:
        self.repo = self.tree = repo
        self.policy = policy
        self.log = log

    def prepare(self, cycle: int) -> list[Settled]:
        """Nothing to set up: the operator's checkout is used as it is."""
        return []

    def begin(self, cycle: int) -> None:
        """Nothing to do: the cycle starts from the checkout as the operator left it."""

    def start(self) -> Start:
        return start_of(self.repo)

    def after_agent(self, start: Start) -> str:
        return ""

    def drop_new_ignored(self, start: Start) -> list[str]:
        return []  # the operator's checkout: never touched

    def undo(self, start: Start) -> None:
        gitchange.restore_cycle(self.repo, start.sha, set(start.dirty_before), self.policy)

    def keep(self, cycle: int, start: Start, *, unlanded: bool = False) -> str | None:
        """An interrupted cycle's own paths, saved under ``refs/evolve/interrupted/<cycle>`` then restored."""
        paths = sorted(p for p in gitchange.dirty_paths(self.repo) - start.dirty_before if not gitchange.is_internal(p))
        ref = None
        if paths:
            ref = gitchange.save_uncommitted(self.repo, paths, cycle, f"evolve: cycle {cycle} interrupted",
                                             prefix=gitrefs.UNLANDED_REF if unlanded else INTERRUPTED_REF)
            self.log.warning("workspace.interrupted_kept", ref=ref, paths=len(paths))
        self.undo(start)
        return ref

    settled: list[Settled] = []  # nothing waits in place: a commit is the landing

    def land(self, cycle: int, start: Start, held: Held, stop: threading.Event | None = None) -> Landing:
        now = gitrefs.head(self.repo)
        return Landing(Land.LANDED, now) if now and now != start.sha else Landing(Land.NOTHING)

    def done(self) -> None:
        """Nothing to forget: in place, a commit is the landing."""

    def forget(self, branch: str) -> None:
        """Nothing waits in place."""


class Isolated:
    """The agent's own worktree, landed on ``branch`` (``refs/heads/...``) of the operator's checkout."""

    isolated = True

    def __init__(
        self, repo: Path, tree: Path, branch: str, policy: GitPolicy, log: Any, paths: Paths,
        regate: Regate | None = None, limit_mb: float = 0.0, adopt: bool = False,
        secrets: leaks.Secrets | None = None, checks: Checks | None = None,
    ) -> None:
        self.repo, self.tree, self.branch = repo, tree, branch
        self.policy = policy
        self.log = log
        self.paths = paths
        self.regate = regate  # the gate commands, run in the worktree after a replay: a red reason or None
        self.limit_mb = limit_mb
        self.secrets = secrets or leaks.Secrets()  # the values no landing may hold (§8.3 Secrets)
        self.checks = checks  # the gate's scripts and the GOALS checks: a chain rewriting one waits (§8.5)
        self.adopt = adopt  # evolve's default path: a worktree there without the mark is an older evolve's
        self.pending_ref = gitrefs.PENDING_REF + land.short_branch(branch)
        self.settled: list[Settled] = []  # waiting cycles settled by a landing: the fire records them

    # -- the records -----------------------------------------------------------------------------

    def chains(self) -> dict[str, Chain]:
        return pend.load(self.paths.pending)

    def chain(self) -> Chain | None:
        """The chain waiting for this branch (one already settled, with a ``fate``, waits no more)."""
        chain = self.chains().get(self.branch)
        return chain if chain is not None and not chain.fate else None

    def _save_chain(self, branch: str, chain: Chain | None) -> None:
        chains = self.chains()
        ref = gitrefs.PENDING_REF + land.short_branch(branch)
        if chain is None:
            chains.pop(branch, None)
            pend.save(self.paths.pending, chains)
            gitrefs.delete_ref(self.repo, ref)
            return
        chains[branch] = chain
        pend.save(self.paths.pending, chains)  # first the record, then the ref that mirrors it
        if not gitrefs.update_ref(self.repo, ref, chain.new, gitrefs.rev(self.repo, ref)):
            raise GitError(f"cannot keep the green commits under {ref}")

    def _intent(self, kind: str, chain: Chain, phase: str, **kw: str) -> None:
        pend.write_intent(self.paths.landing_intent, Intent(kind, chain.branch, chain.base, chain.new, chain.held,
                                                             phase, written_at=utc_iso(), **kw))

    def done(self) -> None:
        """The ledger has recorded the cycle (and what its landing settled): the intent can go."""
        self.paths.landing_intent.unlink(missing_ok=True)

    # -- between cycles ------------------------------------------------------------------------

    def base(self) -> str:
        """Where the next cycle starts: the tip of the chain waiting for this branch, else the branch tip."""
        tip = gitrefs.rev(self.repo, self.branch)
        if tip is None:
            raise GitError(f"branch {self.branch} is gone")
        chain = self.chain()  # its mirror ref is checked once per fire, in prepare
        return chain.new if chain is not None else tip

    def prepare(self, cycle: int) -> list[Settled]:
        """At a fire's start: make the worktree, set aside what a dead cycle left in it, land what waits,
        and stand at the base. Returns the waiting cycles this settled (landed or released)."""
        base = gitrefs.rev(self.repo, self.branch)
        if base is None:
            raise GitError(f"branch {self.branch} has no commit")
        if worktree.ensure(self.repo, self.tree, base, self.policy, adopt=self.adopt):
            self.log.info("workspace.made", path=str(self.tree), base=base)
        self._clear_stale_lock()
        worktree.share(self.repo, self.tree, self.log)
        settled: list[Settled] = []
        for chain in list(self.chains().values()):
            settled.extend(self._check_mirror(chain))
        self._set_aside(cycle, self._resting_point())
        for chain in list(self.chains().values()):
            settled.extend(self._land_waiting(cycle, chain))
        worktree.reset(self.tree, self.base(), self.policy)
        self.settled.extend(settled)
        return settled

    def _resting_point(self) -> str:
        """What a clean worktree stands at between cycles: the base, or the tip of the chain it built."""
        try:
            return self.base()
        except GitError:
            return gitrefs.rev(self.repo, self.branch) or ""

    def _clear_stale_lock(self) -> None:
        """Only evolve's git and its agent use this worktree, and under the fire lock with the last fire's
        groups reaped, none of them is running: a lock left in it is a killed git's, safe to remove."""
        lock = Path(git(self.tree, "rev-parse", "--path-format=absolute", "--git-path", "index.lock").strip())
        if lock.exists():
            lock.unlink()
            self.log.warning("workspace.stale_lock_removed", path=str(lock))

    def _set_aside(self, cycle: int, base: str, prefix: str = gitrefs.STRANDED_REF) -> str | None:
        """A cycle's work left in the worktree (changes, untracked files, its own commits) kept under a ref."""
        worktree.detach(self.tree, self.policy)
        head = gitrefs.head(self.tree)
        dirty = {p for p in gitchange.dirty_paths(self.tree) if not gitchange.is_internal(p)}
        own_commits = bool(head) and head != base and not gitrefs.is_ancestor(self.repo, head or "", base)
        if not dirty and not own_commits:
            return None
        ref = gitrefs.free_ref(self.repo, prefix, cycle)
        what = {gitrefs.STRANDED_REF: "stranded by a dead cycle", gitrefs.UNLANDED_REF: "that may not land"}.get(
            prefix, "of an interrupted cycle")
        worktree.save_tree(self.tree, dirty, ref, f"evolve: cycle {cycle} -- work {what}")
        event = {gitrefs.STRANDED_REF: "workspace.stranded", gitrefs.UNLANDED_REF: "workspace.unlanded_kept"}.get(
            prefix, "workspace.interrupted_kept")
        self.log.warning(event, ref=ref, paths=len(dirty), commits=own_commits)
        worktree.reset(self.tree, base, self.policy)
        return ref

    def begin(self, cycle: int) -> None:
        """The worktree at the base, clean; anything else found there is set aside first, never lost."""
        base = self.base()
        if gitrefs.head(self.tree) != base or gitchange.dirty_paths(self.tree) or worktree.attached(self.tree):
            self._set_aside(cycle, base)
            worktree.reset(self.tree, base, self.policy)

    def start(self) -> Start:
        """The cycle's start, with every ref's value (the agent's HEAD is checked against them later)."""
        s = start_of(self.tree)
        values = tuple(sorted({line.split(" ", 1)[0] for line in git(
            self.repo, "for-each-ref", "--format=%(objectname) %(refname)").splitlines() if line}))
        return replace(s, branch=self.branch, refs=values, ignored=frozenset(_ignored(self.tree)))

    def drop_new_ignored(self, start: Start) -> list[str]:
        """Remove the git-ignored files and directories the cycle made, before the gate runs.

        The commit can never hold them, so a gate that saw them would judge a tree that does not land (a
        new ``lib/helpers.py`` under a ``lib/`` rule, imported by the change: green here, broken on the
        branch). What was ignored already when the cycle began (caches, a venv setup made, the links)
        stays, and so does anything inside it. Never follows a link.
        """
        gone: list[str] = []
        for entry in sorted(_ignored(self.tree) - start.ignored):
            rel = entry.rstrip("/")
            if not rel or gitchange.is_internal(rel) or ".." in rel.split("/"):
                continue
            target = self.tree / rel
            try:
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif os.path.lexists(target):
                    target.unlink()
            except OSError as exc:
                self.log.warning("gate.ignored_not_removed", path=land.shown(rel), error=str(exc)[:200])
                continue
            gone.append(rel)
        return gone

    def after_agent(self, start: Start) -> str:
        """Detach the worktree if the agent attached it to a branch, and check its HEAD is still on the
        cycle's line: "" when it is, else why its commits cannot be the cycle's (nothing will land)."""
        moved = self._repair_git_file()
        if moved:
            return moved
        branch = worktree.attached(self.tree)
        if branch:
            worktree.detach(self.tree, self.policy)
            self.log.warning("workspace.agent_checked_out", branch=branch,
                             detail="the worktree is detached again; evolve commits and lands on no other branch")
        head = gitrefs.head(self.tree)
        if not start.sha or not head or head == start.sha:
            return ""
        if not gitrefs.is_ancestor(self.repo, start.sha, head):
            where = f"it checked out {land.short_branch(branch)}" if branch else "it moved HEAD off the cycle's start"
            return f"the agent's HEAD {head[:12]} does not descend from the cycle's start {start.sha[:12]}: {where}"
        ours = _count(self.repo, head, [start.sha])
        new = _count(self.repo, head, [start.sha, *start.refs])
        if ours != new:
            shown = land.short_branch(branch) if branch else "another branch"
            return (f"the agent's HEAD carries {ours - new} commit(s) it did not make (it checked out or merged "
                    f"{shown}): only the cycle's own commits may land")
        self._strip_agents(start.sha, head)
        return ""

    def _repair_git_file(self) -> str:
        """The worktree's ``.git`` file names its own admin dir again; why the cycle is refused when the agent
        had rewritten it (pointed at the shared git dir, evolve's git would commit and reset there), or ""."""
        from evolve.sandbox import git_admin, worktree_admin

        _, common = git_admin(self.repo)
        admin = worktree_admin(common, self.tree) if common is not None else None
        if admin is None:
            return ""
        dot = self.tree / ".git"
        want = f"gitdir: {admin}\n"
        try:
            now = dot.read_text(encoding="utf-8", errors="replace") if dot.is_file() and not dot.is_symlink() else None
        except OSError:
            now = None
        if now is not None and now.strip() == want.strip():
            return ""
        from evolve.store.atomic import atomic_write_bytes

        if os.path.isdir(dot) and not os.path.islink(dot):
            shutil.rmtree(dot)
        elif os.path.lexists(dot):
            os.unlink(dot)
        atomic_write_bytes(dot, want.encode())
        self.log.warning("workspace.git_file_repaired", path=str(dot))
        return "the agent rewrote its worktree's .git file (evolve put it back): its commits cannot be the cycle's"

    def _strip_agents(self, start: str, head: str) -> None:
        """The agent's own commits without what they changed under ``.agents/`` (one commit in their place).

        ``.agents/`` is never landed by evolve (its own commits leave it out; a tracked one reaches the
        operator through ``cycle/door.py``), and a commit that carried it would land into the very files
        evolve keeps editing in the operator's checkout (its queue claims) or the door just wrote there.
        """
        touched = sorted(p for p in gitchange.changed(self.repo, start, head) if gitchange.is_internal(p))
        if not touched:
            return
        ident = identity(self.tree)
        with tempfile.TemporaryDirectory(prefix="evolve-strip-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **ident}
            git(self.tree, "read-tree", head, extra_env=env)
            git(self.tree, "reset", "-q", start, "--", *touched, extra_env=env)
            snap = git(self.tree, "write-tree", extra_env=env).strip()
            subject = git(self.tree, "log", "-1", "--format=%s", head).strip()[:200] or "agent commits"
            message = f"{subject}\n\n(the agent's changes under .agents/ left out: evolve never lands them)\n"
            base_tree = git(self.tree, "rev-parse", f"{start}^{{tree}}").strip()
            new = start if snap == base_tree else git(self.tree, "commit-tree", snap, "-p", start, "-m", message,
                                                      extra_env=env).strip()
        git(self.tree, "update-ref", "--no-deref", "-m", "evolve: .agents/ left out", "HEAD", new)
        git(self.tree, "reset", "-q", new, "--", *touched)  # the index agrees; the files stay as the agent left
        self.log.info("workspace.agents_left_out", paths=len(touched), sha=new)

    def undo(self, start: Start) -> None:
        if start.sha:
            worktree.reset(self.tree, start.sha, self.policy)

    def keep(self, cycle: int, start: Start, *, unlanded: bool = False) -> str | None:
        """An interrupted cycle's work kept under ``refs/evolve/interrupted/<cycle>`` (``unlanded``: work that
        may not land, under ``refs/evolve/unlanded/<cycle>``), then the worktree reset to the cycle's start."""
        return self._set_aside(cycle, start.sha or self.base(), gitrefs.UNLANDED_REF if unlanded else INTERRUPTED_REF)

    # -- landing -------------------------------------------------------------------------------

    def land(self, cycle: int, start: Start, held: Held, stop: threading.Event | None = None) -> Landing:
        """Put the cycle's new commits on the branch (§8.3); the worktree then stands at the new base."""
        new = gitrefs.head(self.tree)
        if not new or not start.sha or new == start.sha:
            return Landing(Land.NOTHING)
        held = replace(held, sha=new, start=start.sha, commits=_count(self.repo, new, [start.sha]))
        waiting = self.chain()
        if waiting is not None and waiting.new == start.sha:
            chain = Chain(self.branch, waiting.base, new, (*waiting.held, held), since=waiting.since)
        else:
            chain = Chain(self.branch, start.sha, new, (held,), since=utc_iso())
        self._intent("cycle", chain, "plan")
        got = self._drive("cycle", chain, cycle, stop)
        self.settled.extend(got.settled)
        return got

    def _check_mirror(self, chain: Chain) -> list[Settled]:
        """``refs/evolve/pending/<branch>`` mirrors the record: put right a ref a death left behind it;
        one the operator deleted or moved elsewhere means they dropped the work (its cycles released)."""
        if chain.fate:
            return []
        ref = gitrefs.PENDING_REF + land.short_branch(chain.branch)
        mirror = gitrefs.rev(self.repo, ref)
        if mirror == chain.new:
            return []
        if mirror and gitrefs.is_ancestor(self.repo, mirror, chain.new):
            gitrefs.update_ref(self.repo, ref, chain.new, mirror)  # the record was saved, the ref not yet
            return []
        why = f"{ref} was deleted or moved by hand: the waiting work is dropped"
        self.log.warning("land.pending_dropped", branch=chain.branch, why=why)
        self._mark(chain.branch, replace(chain, fate="released", reason=why))
        return [Settled(h, False, detail=why, branch=chain.branch) for h in chain.held]

    def _land_waiting(self, cycle: int, chain: Chain) -> list[Settled]:
        """A chain that waited: land it now if it can; what it settles (landed or released)."""
        if chain.branch not in self.chains():
            return []  # dropped by _check_mirror
        tip = gitrefs.rev(self.repo, chain.branch)
        if chain.fate:  # settled by a fire that died before it could say so: say it now
            return _settled(chain)
        if tip and gitrefs.is_ancestor(self.repo, chain.new, tip):  # landed by someone (a merge by hand)
            self.log.info("land.landed", sha=chain.new, branch=chain.branch, how="already on the branch")
            self._mark(chain.branch, replace(chain, fate="landed"))
            return [Settled(h, True, h.sha, branch=chain.branch) for h in chain.held]
        if chain.branch == self.branch:
            worktree.reset(self.tree, chain.new, self.policy)
        self._intent("chain", chain, "plan")
        got = self._drive("chain", chain, cycle, None)
        self.log.info("land.pending", outcome=got.outcome, sha=got.sha, ref=got.ref, branch=chain.branch)
        if got.outcome is Land.PENDING:
            self.done()
        return list(got.settled)

    def _drive(self, kind: str, chain: Chain, cycle: int, stop: threading.Event | None) -> Landing:
        """Plan, apply, plan again: until the chain is on the branch, waits, or cannot land. What only looks
        like a secret in the chain is said once (``land.secret_shapes``) and recorded with the landing."""
        shapes: list[tuple[str, ...]] = []
        got = self._steps(kind, chain, cycle, stop, shapes)
        if shapes and shapes[0]:
            self.log.warning("land.secret_shapes", sha=chain.new, branch=chain.branch, found=list(shapes[0]))
            return replace(got, secret_shapes=shapes[0])
        return got

    def _steps(self, kind: str, chain: Chain, cycle: int, stop: threading.Event | None,
               shapes: list[tuple[str, ...]]) -> Landing:
        for _ in range(LAND_ATTEMPTS):
            snap = landing.snapshot(self.repo, landing.Want(chain.branch, chain.base, chain.new),
                                    limit_mb=self.limit_mb, stopping=bool(stop and stop.is_set()),
                                    secrets=self.secrets, checks=self.checks)
            if not shapes:
                shapes.append(snap.secret_shapes)
            plan = land.plan(snap)
            if plan.step is Step.NOTHING:
                return Landing(Land.NOTHING)
            if plan.step is Step.STOP:
                return Landing(Land.INTERRUPTED, chain.new, detail=plan.reason)
            if plan.step in (Step.REFUSE, Step.GONE):
                return self._unlanded(kind, chain, cycle, plan.reason, refused=plan.step is Step.REFUSE)
            if plan.step is Step.REPLAY:
                replayed = self._replay(kind, chain, snap.tip or "", plan.reason, stop)
                if isinstance(replayed, Landing):
                    return replayed
                chain = replayed
                continue
            if plan.step is Step.HOLD:
                return self._hold(kind, chain, plan.reason)
            holder = Path(snap.holder) if snap.holder else None
            self._intent(kind, chain, str(plan.step), old=snap.tip or "", checkout=str(holder or ""))
            crashpoint.reached("land.before_move")
            if plan.step is Step.CAS:
                if not gitrefs.update_ref(self.repo, chain.branch, chain.new, snap.tip):
                    continue  # the branch moved under us: plan again
            else:
                assert holder is not None
                ok, why = landing.fast_forward(holder, chain.new, self.policy)
                if not ok:
                    # git refused, or was stopped half-way (systemd's SIGTERM reaches its group too): what it
                    # wrote into the operator's checkout is put back first, so nothing is left half-landed.
                    back = landing.rollback(holder, snap.tip or "", chain.new, snap.holder_locked, self.policy)
                    if back:
                        self.log.warning("land.rolled_back", checkout=str(holder), paths=back[:20], count=len(back))
                    if stop is not None and stop.is_set():
                        return Landing(Land.INTERRUPTED, chain.new, detail="stopped during the fast-forward")
                    return self._hold(kind, chain, f"git refused the fast-forward: {why or 'git was stopped'}")
            return self._landed(kind, chain, str(plan.step))
        return self._hold(kind, chain, "the branch kept moving while evolve landed")

    def _replay(self, kind: str, chain: Chain, tip: str, why: str, stop: threading.Event | None) -> Chain | Landing:
        """The branch moved (or was rewritten): the chain's own commits replayed onto it, gated again there."""
        self._intent(kind, chain, "replay", old=tip)
        replayed = landing.replay(self.tree, tip, chain.base, chain.new, self.policy)
        if replayed is None:
            return self._unlanded(kind, chain, 0, f"{why}, and the commits do not replay onto it")
        if stop is not None and stop.is_set():
            return Landing(Land.INTERRUPTED, chain.new, detail="asked to stop while landing: nothing lands")
        red = self.regate(self.tree, tip, stop) if self.regate is not None else None
        if stop is not None and stop.is_set():
            return Landing(Land.INTERRUPTED, chain.new, detail="asked to stop while landing: nothing lands")
        if red:
            return self._unlanded(kind, chain, 0, f"{why}; red after replaying onto it: {red}")
        held = pend.remap(chain.held, landing.commits_of(self.repo, tip, replayed), tip)
        self.log.info("land.replayed", old=chain.new, new=replayed, onto=tip, why=why)
        return Chain(chain.branch, tip, replayed, held, chain.reason, chain.since)

    def _landed(self, kind: str, chain: Chain, how: str) -> Landing:
        crashpoint.reached("land.moved")  # on the branch, not yet in the ledger: the intent settles it
        self.log.info("land.landed", sha=chain.new, branch=chain.branch, how=how)
        earlier = chain.held[:-1] if kind == "cycle" else chain.held
        self._intent(kind, chain, "landed")
        if earlier:  # the record says so until the fire has settled them (then forget drops it)
            self._mark(chain.branch, replace(chain, held=earlier, fate="landed"))
        if chain.branch == self.branch:
            with contextlib.suppress(GitError):
                worktree.reset(self.tree, chain.new, self.policy)
        return Landing(Land.LANDED, chain.held[-1].sha if chain.held else chain.new,
                       settled=tuple(Settled(h, True, h.sha, branch=chain.branch) for h in earlier))

    def _mark(self, branch: str, chain: Chain) -> None:
        """A settled chain, recorded as such (its pending ref untouched) until the fire has said so."""
        chains = self.chains()
        chains[branch] = chain
        pend.save(self.paths.pending, chains)

    def forget(self, branch: str) -> None:
        """The chain for ``branch`` is settled (landed or released): drop its record and its pending ref."""
        if branch in self.chains() or gitrefs.rev(self.repo, gitrefs.PENDING_REF + land.short_branch(branch)):
            self._save_chain(branch, None)

    def _hold(self, kind: str, chain: Chain, why: str) -> Landing:
        self._intent(kind, chain, "hold")
        self._save_chain(chain.branch, replace(chain, reason=why[:500]))
        self.log.warning("land.pending", sha=chain.new, ref=gitrefs.PENDING_REF + land.short_branch(chain.branch),
                         why=why)
        if chain.branch == self.branch:
            with contextlib.suppress(GitError):
                worktree.reset(self.tree, chain.new, self.policy)
        ref = gitrefs.PENDING_REF + land.short_branch(chain.branch)
        return Landing(Land.PENDING, chain.held[-1].sha if chain.held else chain.new, ref, why)

    def _unlanded(self, kind: str, chain: Chain, cycle: int, why: str, *, refused: bool = False) -> Landing:
        """The chain cannot land: kept whole under ``refs/evolve/unlanded/<cycle>``; every cycle in it released."""
        first = cycle or (chain.held[-1].cycle if chain.held else 0)
        ref = gitrefs.free_ref(self.repo, gitrefs.UNLANDED_REF, first)
        gitrefs.update_ref(self.repo, ref, chain.new, None)
        self.log.error("land.refused" if refused else "land.conflict", sha=chain.new, ref=ref, why=why)
        earlier = chain.held[:-1] if kind == "cycle" else chain.held
        if earlier:  # released, kept at ref: the record says so until the fire has settled them
            self._mark(chain.branch, replace(chain, held=earlier, fate="released", fate_ref=ref, reason=why[:500]))
        else:
            self._save_chain(chain.branch, None)
        with contextlib.suppress(GitError):
            worktree.reset(self.tree, self.base(), self.policy)
        outcome = Land.REFUSED if refused else Land.CONFLICT
        return Landing(outcome, chain.new, ref, why, settled=tuple(
            Settled(h, False, ref=ref, detail=why, branch=chain.branch) for h in earlier))


def _settled(chain: Chain) -> list[Settled]:
    """What a chain's recorded fate says about each of its cycles."""
    if chain.fate == "landed":
        return [Settled(h, True, h.sha, branch=chain.branch) for h in chain.held]
    return [Settled(h, False, ref=chain.fate_ref or None, detail=chain.reason, branch=chain.branch)
            for h in chain.held]


def _ignored(tree: Path) -> set[str]:
    """The git-ignored entries of ``tree`` as ``git status --ignored=matching`` lists them (an ignored
    directory once, as ``dir/``, not its contents)."""
    out = git(tree, "status", "--porcelain=v1", "-z", "--ignored=matching", "--untracked-files=normal")
    return {rec[3:] for rec in out.split("\0") if rec.startswith("!! ")}


def _count(repo: Path, head: str, exclude: list[str]) -> int:
    """Commits reachable from ``head`` and from none of ``exclude`` (given on stdin: a repository may have
    more refs than an argv holds)."""
    listing = "".join(f"^{sha}\n" for sha in exclude).encode()
    proc = run_git(repo, "rev-list", "--count", "--stdin", head, input=listing)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0


Workspace = InPlace | Isolated


def default_tree(evolve_dir: Path) -> Path:
    """In evolve's state directory: stable (agent sessions resume by cwd), writable wherever the state is
    (the units' ``ReadWritePaths``), git-ignored with it, and not under ``.git`` (the Claude CLI refuses
    to edit anything there)."""
    return evolve_dir / "worktree"


def tree_path(repo: Path, evolve_dir: Path, cfg_git: Any) -> Path:
    tree = Path(cfg_git.worktree_dir).expanduser() if cfg_git.worktree_dir else default_tree(evolve_dir)
    return tree if tree.is_absolute() else repo / tree


def open_workspace(repo: Path, paths: Paths, cfg_git: Any, policy: GitPolicy, log: Any,
                   regate: Regate | None = None, secrets: leaks.Secrets | None = None,
                   checks: Checks | None = None) -> Workspace:
    """The configured workspace. The caller has checked the operator is not mid-operation (:func:`busy`)."""
    if cfg_git.isolation != "worktree":
        return InPlace(repo, policy, log)
    branch = gitrefs.branch_of(repo)
    if branch is None:
        raise GitError("HEAD is detached or its branch has no commit: nothing to land on")
    return Isolated(repo, tree_path(repo, paths.evolve_dir, cfg_git), branch, policy, log, paths, regate,
                    float(getattr(cfg_git, "max_file_mb", 0.0) or 0.0), adopt=not cfg_git.worktree_dir, secrets=secrets,
                    checks=checks)


def busy(repo: Path) -> str:
    """Why the operator's checkout is in the middle of something (no git process), or "" (§8.3)."""
    return gitdir.busy(repo)


def describe(ws: Workspace) -> dict[str, Any]:
    """What ``fire --dry-run`` shows: where the agent would work and where its commits would land."""
    if isinstance(ws, Isolated):
        chain = ws.chain()
        return {"isolation": "worktree", "tree": str(ws.tree), "branch": ws.branch, "pending_ref": ws.pending_ref,
                "waiting": [h.cycle for h in chain.held] if chain else []}
    return {"isolation": "none", "tree": str(ws.tree)}
