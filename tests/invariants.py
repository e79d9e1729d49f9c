"""What must hold after any fault (issue 15, docs/PROOF.md): the git side and the history of every
queue line and claim. Shared by the crash harness and the nemeses, so every fault test checks the same.

* :class:`GitWatch` — no ``index.lock`` left by evolve, every ``improved`` entry's ``sha`` a commit
  that exists and that a ref holds, no commit of evolve's touches the operator's paths, the
  operator's files byte-identical, and (with agent worktree isolation) no agent edit in the
  operator's checkout and a clean agent worktree.
* :class:`History` — every appended line live exactly once, a consumed item never comes back, no
  item is consumed twice, consumed exactly when a successful cycle for it is in the ledger.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from support import GIT_ENV, Env, live

from evolve.results import SUCCESS


def git_run(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env={**os.environ, **GIT_ENV})


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


class GitWatch:
    """The git invariants, checked after every fault; commits already checked are remembered."""

    def __init__(self, env: Env, operator: dict[str, bytes] | None = None) -> None:
        self.env = env
        self.operator = dict(operator or {})  # path -> the bytes the operator left there
        self.checked: set[str] = set()
        self.leftovers = 0  # in-place mode: checks that found agent edits left in the checkout

    def plant(self) -> None:
        """The operator's own uncommitted work: an edit of a tracked file and an untracked file."""
        repo = self.env.repo
        readme = (repo / "README.md").read_bytes() + b"operator's uncommitted line\n"
        self.operator = {"README.md": readme, "notes/operator.txt": b"operator's untracked notes\n"}
        for path, data in self.operator.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_bytes(data)

    def check(self, ledger: list[dict[str, Any]] | None = None, *, settled: bool = True) -> None:
        """``settled``: after a fire that ended normally or a recovery fire (a failed fire may leave its
        cycle's edits in the agent worktree until the next fire)."""
        repo = self.env.repo
        assert not index_locks(repo), f"a git index.lock survived: {index_locks(repo)}"
        for e in self.env.ledger() if ledger is None else ledger:
            if e.get("result") == "improved":
                self._commit(e)
        for path, data in self.operator.items():
            assert (repo / path).read_bytes() == data, f"the operator's {path} was changed"
        stray = dirty(repo) - set(self.operator)
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

    def _commit(self, e: dict[str, Any]) -> None:
        sha = e.get("sha")
        assert isinstance(sha, str), f"cycle {e['cycle']} is improved without a commit"
        if sha in self.checked:
            return
        repo = self.env.repo
        assert git_run(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0, (
            f"cycle {e['cycle']} is improved but its commit {sha} does not exist")
        refs = git_run(repo, "for-each-ref", "--contains", sha, "--format=%(refname)").stdout.split()
        assert refs, f"cycle {e['cycle']}'s commit {sha} is on no ref (lost by a reset)"
        files = set(git_run(repo, "show", "--name-only", "--format=", sha).stdout.decode().split("\n")) - {""}
        theirs = files & set(self.operator)
        assert not theirs, f"evolve's commit {sha} holds the operator's {sorted(theirs)}"
        self.checked.add(sha)


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

    ``appended`` is fed by whoever appends (titles are unique ids); :meth:`observe` reads the queue
    and the ledger after each trial and keeps a per-item timeline of its status changes.
    """

    def __init__(self) -> None:
        self.appended: list[str] = []
        self.timeline: dict[str, list[tuple[int, str]]] = {}
        self.claims: Counter[str] = Counter()  # outcome of every claim the ledger records

    def append(self, titles: list[str]) -> None:
        self.appended.extend(titles)

    def observe(self, env: Env, trial: int) -> None:
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
        assert "in_progress" not in status.values(), "a claim outlived its fire and the recovery"
        self._ledger(env.ledger(), status)

    @staticmethod
    def claims_held(env: Env) -> None:
        """Before any recovery: every ``in_progress`` item is the claim session-state records (the
        fire that died or failed holds it, and the next fire settles it), never one nobody holds."""
        items = [i for e in live(env.paths.nextwork) for i in e["items"]] if env.paths.nextwork.exists() else []
        held = [i["title"] for i in items if i.get("claim_status") == "in_progress" and not i.get("consumed")]
        try:
            claimed = (orjson.loads(env.paths.state.read_bytes()).get("claimed_work") or {}).get("title")
        except (OSError, orjson.JSONDecodeError):
            claimed = None
        assert set(held) <= {claimed}, f"claims nobody holds: {held} (session-state records {claimed!r})"

    def _ledger(self, ledger: list[dict[str, Any]], status: dict[str, str]) -> None:
        """Every claim ended consumed or released; consumed exactly when a successful cycle says so."""
        by: dict[str, list[dict[str, Any]]] = {}
        for e in ledger:
            if (t := title_of(e.get("work_ref"))) is not None:
                by.setdefault(t, []).append(e)
        self.claims = Counter()
        for title, entries in by.items():
            assert title in status, f"the ledger names {title}, which is not in the queue"
            finals = [e["cycle"] for e in entries if consumes(e)]
            assert len(finals) <= 1, f"{title} consumed twice, by cycles {finals}"
            assert (status[title] == "consumed") == bool(finals), (
                f"{title} is {status[title]} but its successful cycles are {finals}")
            self.claims["consumed"] += len(finals)
            self.claims["released"] += len(entries) - len(finals)
        orphans = [t for t, s in status.items() if s == "consumed" and t not in by]
        assert not orphans, f"consumed without a ledger entry: {orphans[:10]}"

    def transitions(self) -> Counter[str]:
        """How many items went through each status sequence (for the report)."""
        return Counter(" > ".join(s for _, s in line) for line in self.timeline.values())
