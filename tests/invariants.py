"""What must hold after any fault (issue 15, issue 22, docs/PROOF.md): the git side and the history of every
queue line and claim. Shared by the crash harness and the nemeses, so every fault test checks the same.

* :class:`GitWatch` — the git side under the landing model of docs/DESIGN.md §8.3:

  - no ``index.lock`` left anywhere (the operator's checkout, evolve's worktree);
  - every ``improved`` entry's ``sha`` is a commit that is *on the branch it landed on* (an ancestor of that
    branch's tip, not merely on some ref) and was landed (``landed`` is never false), unless the operator
    removed it from that branch since (recorded: :meth:`GitWatch.operator_moved`); every ``pending``
    entry's ``sha`` exists;
  - evolve moves no branch but the one its fire lands on (the operator's checkout's branch at the fire's
    start, or a branch a waiting chain was for), only forward, and brings no commit of another branch along;
    what the operator moved themselves is theirs;
  - nothing the operator removed from a branch (a dropped or amended-away commit, or content they name:
    a secret) is ever reachable from a branch again;
  - no commit of evolve's holds the operator's paths; the operator's files are byte for byte as they left
    them; with agent worktree isolation no agent edit in their checkout, and a clean agent worktree.

* :class:`History` — every appended line live exactly once, a consumed item never comes back, no item is
  done twice (at most one ``improved``/consumed per item, settle entries counted, and no second green cycle
  while one still waits to land), consumed exactly when a successful cycle for it is in the ledger, an
  ``in_progress`` item only while a running fire or ``pending.json`` holds it (and an item ``pending.json``
  holds is ``in_progress`` and marked ``claim_held`` in the queue, never released or taken over; a held
  claim only while something waits), every ``pending`` cycle settled at most once and,
  once everything has landed, exactly once.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from support import GIT_ENV, Env, live

from evolve.cycle import pending
from evolve.results import SUCCESS, is_landing


def git_run(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env={**os.environ, **GIT_ENV})


def git_out(repo: Path, *args: str) -> str:
    return git_run(repo, *args).stdout.decode().strip()


def common_dir(repo: Path) -> Path:
    out = git_run(repo, "rev-parse", "--git-common-dir").stdout.decode().strip()
    return (repo / out).resolve()


def dirty(repo: Path) -> set[str]:
    """Paths ``git status`` reports (untracked ones included, ignored ones not)."""
    out = git_run(repo, "status", "--porcelain", "-z", "--untracked-files=all").stdout
    return {rec[3:].decode() for rec in out.split(b"\0") if len(rec) > 3}


def index_locks(repo: Path) -> list[Path]:
    common = common_dir(repo)
    return [p for p in (common / "index.lock", *common.glob("worktrees/*/index.lock")) if p.exists()]


def branch_tips(repo: Path) -> dict[str, str]:
    """refs/heads/* -> sha."""
    out = git_out(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/")
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)  # type: ignore[misc]


def checked_out(repo: Path) -> str | None:
    """The branch the operator's checkout is on (``refs/heads/...``), None when detached."""
    proc = git_run(repo, "symbolic-ref", "-q", "HEAD")
    return proc.stdout.decode().strip() or None if proc.returncode == 0 else None


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return git_run(repo, "merge-base", "--is-ancestor", older, newer).returncode == 0


def held_cycles(env: Env) -> dict[int, tuple[str, str]]:
    """Cycles whose green commits ``pending.json`` holds (not yet settled) -> (branch, work ref)."""
    return {h.cycle: (c.branch, h.work_ref) for c in pending.load(env.paths.pending).values() if not c.fate
            for h in c.held}


@dataclass
class Baseline:
    """What a fire starts from, read before it (or at the last check): what it may move, and where its
    entries land."""

    last_cycle: int = 0
    branch: str | None = None  # the operator's checkout's branch: the one the fire plans its cycles for
    chains: dict[int, str] = field(default_factory=dict)  # pending cycle -> the branch its chain waits for
    intent: str | None = None  # the branch of a landing a dead fire left (landing.json)


class GitWatch:
    """The git invariants, checked after every fault; commits already checked are remembered.

    The operator's own moves are recorded by whoever makes them (:meth:`operator_moved` right after the
    move): that branch's new tip becomes what evolve's later moves are judged from, and what the move
    removed (a dropped, amended or rebased-away commit) must never be on a branch again.
    """

    EVOLVE_SUBJECTS = ("evolve: ", "agent: ", 'Revert "')  # the scripted agent's; in place, an undo

    def __init__(self, env: Env, operator: dict[str, bytes] | None = None) -> None:
        self.env = env
        self.operator = dict(operator or {})  # path -> the bytes the operator left there
        self.checked: set[str] = set()
        self.leftovers = 0  # in-place mode: checks that found agent edits left in the checkout
        self.removed: dict[str, set[str]] = {}  # branch -> commits the operator removed from it
        self.secrets: set[str] = set()  # content the operator removed: never on a branch again
        self.landed_on: dict[int, str] = {}  # cycle -> the branch its fire landed (or would land) it on
        self.exempt: set[int] = set()  # improved cycles whose commit the operator later removed
        self.pending_seen: set[int] = set()
        self.moves = 0  # branch moves by evolve seen (each forward, on its own branch)
        self.tips: dict[str, str] = {}
        self.base = Baseline()
        self.baseline()

    # -- what the operator does -----------------------------------------------------------------------

    def plant(self) -> None:
        """The operator's own uncommitted work: an edit of a tracked file and an untracked file."""
        repo = self.env.repo
        readme = (repo / "README.md").read_bytes() + b"operator's uncommitted line\n"
        self.operator = {"README.md": readme, "notes/operator.txt": b"operator's untracked notes\n"}
        for path, data in self.operator.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_bytes(data)

    def operator_left(self) -> None:
        """What the operator's checkout has uncommitted now (their edits, untracked files, a conflicted
        rebase's files) is theirs, byte for byte: call right after they acted, while no landing runs."""
        repo = self.env.repo
        self.operator = {p: (repo / p).read_bytes() for p in sorted(dirty(repo))
                         if (repo / p).is_file() and not (repo / p).is_symlink()}

    def operator_moved(self, *branches: str, secrets: tuple[str, ...] = ()) -> set[str]:
        """The operator moved these branches (``refs/heads/...``) themselves: commit, drop, amend, rebase.
        Returns the commits the move removed from them (recorded); ``secrets``: content they removed."""
        repo = self.env.repo
        gone: set[str] = set()
        for b in branches:
            old, new = self.tips.get(b), git_out(repo, "rev-parse", "--verify", "-q", b) or None
            if old and new != old:
                lost = set(git_out(repo, "rev-list", old if new is None else f"{new}..{old}").split())
                self.removed.setdefault(b, set()).update(lost)
                gone |= lost
            if new is None:
                self.tips.pop(b, None)
            else:
                self.tips[b] = new
        self.secrets |= set(secrets)
        return gone

    # -- reading ------------------------------------------------------------------------------------------

    def baseline(self, ledger: list[dict[str, Any]] | None = None) -> None:
        """Take what the next fire starts from (call again after operator actions made before a fire)."""
        entries = self.env.ledger() if ledger is None else ledger
        self._map(entries)
        repo = self.env.repo
        intent = None
        try:
            got = pending.read_intent(self.env.paths.landing_intent)
            intent = got.branch if got is not None else None
        except OSError:
            pass
        self.base = Baseline(
            last_cycle=max((e["cycle"] for e in entries if isinstance(e.get("cycle"), int)), default=0),
            branch=checked_out(repo),
            chains={c: b for c, (b, _ref) in held_cycles(self.env).items()},
            intent=intent,
        )
        self.tips = branch_tips(repo)

    def _map(self, ledger: list[dict[str, Any]]) -> None:
        """Which branch each new entry landed on: a settle entry on its chain's, a landing recovered
        after a death on the intent's, any other on the branch the fire planned."""
        b = self.base
        for e in ledger:
            c = e.get("cycle")
            if not isinstance(c, int) or c <= b.last_cycle or c in self.landed_on:
                continue
            if is_landing(e):
                branch = b.chains.get(e["pending_cycle"], b.branch)
            elif e.get("recovered") == "landing":
                branch = b.intent or b.branch
            else:
                branch = b.branch
            if branch:
                self.landed_on[c] = branch

    # -- the checks ---------------------------------------------------------------------------------------

    def check(self, ledger: list[dict[str, Any]] | None = None, *, settled: bool = True) -> None:
        """``settled``: after a fire that ended normally or a recovery fire (a failed fire may leave its
        cycle's edits in the agent worktree until the next fire)."""
        repo = self.env.repo
        assert not index_locks(repo), f"a git index.lock survived: {index_locks(repo)}"
        entries = self.env.ledger() if ledger is None else ledger
        self._map(entries)
        self._branches()
        on = {b: set(git_out(repo, "rev-list", b).split()) for b in branch_tips(repo)}
        for e in entries:
            if e.get("result") == "improved":
                self._improved(e, on)
            elif e.get("result") == "pending":
                self._pending(e)
        self._waiting()
        self._nothing_removed_comes_back(on)
        for path, data in self.operator.items():
            assert (repo / path).is_file() and (repo / path).read_bytes() == data, f"the operator's {path} was changed"
        stray = dirty(repo) - set(self.operator)
        self.baseline(entries)
        if not settled:
            return
        if self.env.tree == repo:
            # In place ([git] isolation = "none"), a cycle killed mid-agent leaves its edits in the
            # checkout: recovery records it crashed but does not revert (DESIGN §8.3). Counted.
            self.leftovers += bool(stray)
            return
        assert not stray, f"agent edits left in the operator's checkout: {sorted(stray)}"
        wt = self.env.tree
        if wt.exists():
            assert not dirty(wt), f"the agent worktree is dirty after recovery: {sorted(dirty(wt))}"

    def _branches(self) -> None:
        """Since the baseline: only the fire's own branches moved, forward, carrying no other branch's commits."""
        repo, b = self.env.repo, self.base
        now = branch_tips(repo)
        mine = {x for x in (b.branch, b.intent, *b.chains.values()) if x}
        for ref in sorted(set(now) | set(self.tips)):
            old, new = self.tips.get(ref), now.get(ref)
            if old == new:
                continue
            assert old is not None, f"evolve created branch {ref} (the operator did not)"
            assert new is not None, f"evolve deleted branch {ref}"
            assert ref in mine, f"evolve moved {ref} ({old[:12]} -> {new[:12]}), a branch it was not landing on {mine}"
            assert is_ancestor(repo, old, new), (
                f"{ref} moved from {old[:12]} to {new[:12]}, not forward: a landing over history it no longer has")
            others = [t for r, t in self.tips.items() if r != ref]
            brought = set(git_out(repo, "rev-list", new, "--not", old, *others).split())
            total = set(git_out(repo, "rev-list", f"{old}..{new}").split())
            assert brought == total, (
                f"landing on {ref} brought commits of another branch: {sorted(total - brought)[:5]}")
            subjects = git_out(repo, "log", "--format=%s", f"{old}..{new}").splitlines()
            foreign = [s for s in subjects if not s.startswith(self.EVOLVE_SUBJECTS)]
            assert not foreign, f"landing on {ref} carried commits that are not evolve's: {foreign[:5]}"
            self.moves += 1

    def _improved(self, e: dict[str, Any], on: dict[str, set[str]]) -> None:
        sha, c = e.get("sha"), e["cycle"]
        assert isinstance(sha, str), f"cycle {c} is improved without a commit"
        assert e.get("landed") is not False, f"cycle {c} is improved but says it did not land: {e}"
        repo = self.env.repo
        if sha not in self.checked:
            assert git_run(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0, (
                f"cycle {c} is improved but its commit {sha} does not exist")
            files = set(git_run(repo, "show", "--name-only", "--format=", sha).stdout.decode().split("\n")) - {""}
            theirs = files & set(self.operator)
            assert not theirs, f"evolve's commit {sha} holds the operator's {sorted(theirs)}"
            self.checked.add(sha)
        branch = self.landed_on.get(c)
        if sha in self.removed.get(branch or "", set()):  # the operator took it off that branch since
            self.exempt.add(c)
            return
        if branch is not None and branch in on:
            assert sha in on[branch], f"cycle {c}'s commit {sha[:12]} is not on {branch}, where it landed"
        else:  # landed before this watch began: on some branch at least, not only on a ref of evolve's
            assert any(sha in s for s in on.values()), f"cycle {c}'s commit {sha} is on no branch"

    def _pending(self, e: dict[str, Any]) -> None:
        sha, c = e.get("sha"), e["cycle"]
        assert e.get("landed") is False, f"cycle {c} is pending but says it landed: {e}"
        if c in self.pending_seen:
            return
        assert isinstance(sha, str) and git_run(self.env.repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0, (
            f"cycle {c} is pending but its commit {sha} does not exist")
        self.pending_seen.add(c)

    def _waiting(self) -> None:
        """Work that waits is kept: ``refs/evolve/pending/<branch>`` is the chain's tip, and each held
        cycle's commit is on the chain."""
        repo = self.env.repo
        for chain in pending.load(self.env.paths.pending).values():
            if chain.fate:
                continue
            ref = "refs/evolve/pending/" + chain.branch.removeprefix("refs/heads/")
            assert git_out(repo, "rev-parse", "--verify", "-q", ref) == chain.new, (
                f"{ref} does not hold the waiting chain's tip {chain.new[:12]}")
            for h in chain.held:
                assert is_ancestor(repo, chain.base, h.sha) and is_ancestor(repo, h.sha, chain.new), (
                    f"cycle {h.cycle}'s waiting commit {h.sha[:12]} is off its chain "
                    f"{chain.base[:12]}..{chain.new[:12]}")

    def _nothing_removed_comes_back(self, on: dict[str, set[str]]) -> None:
        # Per branch: a commit the operator removed from one branch may stay on another they kept it on.
        for ref, shas in on.items():
            back = self.removed.get(ref, set()) & shas
            assert not back, f"commits the operator removed from {ref} are on it again: {sorted(back)[:5]}"
        for secret in sorted(self.secrets):
            hits = git_out(self.env.repo, "log", "--branches", "--format=%H %D", f"-S{secret}")
            assert not hits, f"content the operator removed ({secret!r}) is on a branch again: {hits[:300]}"


def title_of(ref: object) -> str | None:
    """The item title of a queue work ref (``source_epic=E:item=T``)."""
    if isinstance(ref, str) and ref.startswith("source_epic=") and ":item=" in ref:
        return ref.split(":item=", 1)[1]
    return None


def consumes(e: dict[str, Any]) -> bool:
    """Whether this ledger entry finalized its claim (evolve.cycle.transition.claim_action)."""
    return e.get("result") in SUCCESS and not e.get("context_heavy")


class History:
    """Every appended line and every claim, from start to outcome, across a whole run.

    ``appended`` is fed by whoever appends (titles are unique ids); :meth:`observe` reads the queue,
    ``pending.json`` and the ledger after each trial and keeps a per-item timeline of its status changes.
    """

    def __init__(self) -> None:
        self.appended: list[str] = []
        self.timeline: dict[str, list[tuple[int, str]]] = {}
        self.claims: Counter[str] = Counter()  # outcome of every claim the ledger records
        self.pending: Counter[str] = Counter()  # pending cycles, and how they were settled

    def append(self, titles: list[str]) -> None:
        self.appended.extend(titles)

    def observe(self, env: Env, trial: int, *, all_landed: bool = False) -> None:
        """``all_landed``: nothing may wait any more (after the operator cleared the way and a clean fire)."""
        items = [i for e in live(env.paths.nextwork) for i in e["items"]] if env.paths.nextwork.exists() else []
        seen = Counter(i["title"] for i in items)
        missing = [t for t in self.appended if t not in seen]
        assert not missing, f"appended lines lost: {missing[:10]}"
        twice = [t for t, n in seen.items() if n > 1]
        assert not twice, f"lines live twice: {twice[:10]}"
        assert set(seen) == set(self.appended), f"lines nobody appended: {sorted(set(seen) - set(self.appended))[:10]}"
        status = {i["title"]: "consumed" if i.get("consumed") else str(i.get("claim_status") or "queued")
                  for i in items}
        for title, now in status.items():
            line = self.timeline.setdefault(title, [])
            if line and line[-1][1] == "consumed":
                assert now == "consumed", f"{title} was consumed at trial {line[-1][0]}, now {now}: {line}"
            if not line or line[-1][1] != now:
                line.append((trial, now))
        held = held_cycles(env)
        waiting = {t for _b, ref in held.values() if (t := title_of(ref)) is not None}
        released = sorted(t for t in waiting if status.get(t) != "in_progress")
        assert not released, f"items that wait to land lost their claim: {[(t, status.get(t)) for t in released]}"
        # ... and the claim is held in the queue itself, so that no other reader takes it over (§6.1).
        held_here = {i["title"] for i in items if i.get("claim_status") == "in_progress" and i.get("claim_held")}
        plain = sorted(waiting - held_here)
        assert not plain, f"items that wait to land are a plain in_progress claim any reader takes over: {plain}"
        stray_holds = sorted(held_here - waiting)
        assert not stray_holds, f"held claims nothing waits for (no one would ever take them): {stray_holds}"
        stuck = sorted(t for t, s in status.items() if s == "in_progress" and t not in waiting)
        assert not stuck, f"a claim outlived its fire and the recovery (pending.json holds none of them): {stuck}"
        if all_landed:
            assert not held, f"still waiting to land after a clean fire: cycles {sorted(held)}"
            refs = git_out(env.repo, "for-each-ref", "--format=%(refname)", "refs/evolve/pending/")
            assert not refs, f"pending refs left after everything landed: {refs}"
        self._ledger(env.ledger(), status, held, all_landed=all_landed)

    @staticmethod
    def claims_held(env: Env) -> None:
        """Before any recovery: every ``in_progress`` item is the claim session-state records (the
        fire that died or failed holds it, and the next fire settles it) or one a waiting chain holds
        (``pending.json``), never one nobody holds."""
        items = [i for e in live(env.paths.nextwork) for i in e["items"]] if env.paths.nextwork.exists() else []
        held = [i["title"] for i in items if i.get("claim_status") == "in_progress" and not i.get("consumed")]
        try:
            claimed = (orjson.loads(env.paths.state.read_bytes()).get("claimed_work") or {}).get("title")
        except (OSError, orjson.JSONDecodeError):
            claimed = None
        waiting = {title_of(ref) for _b, ref in held_cycles(env).values()}
        # A chain a dead fire settled (its fate recorded) holds its claims until the next fire says so.
        waiting |= {title_of(h.work_ref) for c in pending.load(env.paths.pending).values() for h in c.held}
        nobody = sorted(set(held) - {claimed} - waiting)
        assert not nobody, f"claims nobody holds: {nobody} (session-state records {claimed!r})"

    def _ledger(self, ledger: list[dict[str, Any]], status: dict[str, str], held: dict[int, tuple[str, str]],
                *, all_landed: bool) -> None:
        """Every claim ended consumed, released or still waiting; consumed exactly when a successful cycle
        says so; never done twice; every pending cycle settled at most once, by an entry for its item."""
        by: dict[str, list[dict[str, Any]]] = {}
        for e in ledger:
            if (t := title_of(e.get("work_ref"))) is not None:
                by.setdefault(t, []).append(e)
        pendings = {e["cycle"]: e for e in ledger if e.get("result") == "pending"}
        settles: dict[int, list[dict[str, Any]]] = {}
        for e in ledger:
            if is_landing(e):
                settles.setdefault(e["pending_cycle"], []).append(e)
        for c, ss in settles.items():
            assert c in pendings, f"cycle {[s['cycle'] for s in ss]} settles cycle {c}, which never was pending"
            assert len(ss) == 1, f"pending cycle {c} settled {len(ss)} times: {[s['cycle'] for s in ss]}"
            assert ss[0].get("work_ref") == pendings[c].get("work_ref"), (ss[0], pendings[c])
            assert ss[0]["result"] in ("improved", "failed"), ss[0]
        for c in pendings:
            if c in settles:
                assert c not in held, f"pending cycle {c} is settled, yet pending.json still holds it"
            elif all_landed:
                raise AssertionError(f"pending cycle {c} was neither landed nor settled after a clean fire")
            else:
                assert c in held, f"pending cycle {c} is unsettled and nothing holds it (its work is lost)"
        self.claims = Counter()
        for title, entries in by.items():
            assert title in status, f"the ledger names {title}, which is not in the queue"
            finals = [e["cycle"] for e in entries if consumes(e)]
            assert len(finals) <= 1, f"{title} consumed twice, by cycles {finals}"
            assert (status[title] == "consumed") == bool(finals), (
                f"{title} is {status[title]} but its successful cycles are {finals}")
            improved = [e["cycle"] for e in entries if e.get("result") == "improved"]
            waiting = [e["cycle"] for e in entries if e.get("result") == "pending" and e["cycle"] not in settles]
            assert len(improved) + len(waiting) <= 1, (
                f"{title} done twice: improved in cycles {improved}, still waiting to land in {waiting}")
            for e in entries:
                if is_landing(e):
                    continue  # the outcome of its pending cycle's claim, counted there
                if e.get("result") == "pending":
                    s = settles.get(e["cycle"])
                    self.claims["waiting" if not s else "consumed" if consumes(s[0]) else "released"] += 1
                else:
                    self.claims["consumed" if consumes(e) else "released"] += 1
        self.pending = Counter(cycles=len(pendings),
                               settled_landed=sum(1 for ss in settles.values() if ss[0]["result"] == "improved"),
                               settled_released=sum(1 for ss in settles.values() if ss[0]["result"] != "improved"))
        orphans = [t for t, s in status.items() if s == "consumed" and t not in by]
        assert not orphans, f"consumed without a ledger entry: {orphans[:10]}"

    def transitions(self) -> Counter[str]:
        """How many items went through each status sequence (for the report)."""
        return Counter(" > ".join(s for _, s in line) for line in self.timeline.values())
