"""``[git] push``: publish what landed, where it landed (docs/DESIGN.md §8.3).

After a landing on ``<branch>`` evolve runs ``git push <remote> <sha>:refs/heads/<branch>`` with
``<remote>`` from ``[land] remote``: the landed commit, never whatever the operator's checkout has
checked out (a bare ``git push`` would publish another branch's unpublished commits). A landing made
later from ``refs/evolve/pending/`` is pushed the same way. ``push.json`` keeps, per branch, the last
landed sha and whether it was published; a failed push is retried at every fire (status and metrics
show it) until it goes through, the branch moves past it (the newer landing is pushed instead), or the
operator removes it from the branch (then it is never pushed: nothing they removed comes back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve import redact
from evolve.git import land
from evolve.git import refs as gitrefs
from evolve.git.run import GitError, GitPolicy, run_git
from evolve.store.atomic import read_json, write_json
from evolve.timeutil import utc_iso


@dataclass(frozen=True)
class PushState:
    branch: str
    sha: str
    remote: str
    ok: bool
    error: str = ""
    attempts: int = 0
    at: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"branch": self.branch, "sha": self.sha, "remote": self.remote, "ok": self.ok,
                "error": self.error, "attempts": self.attempts, "at": self.at}


def read_states(path: Path) -> dict[str, PushState]:
    raw = read_json(path)
    out: dict[str, PushState] = {}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("branches"), Mapping):
        return out
    for branch, rec in raw["branches"].items():
        if not (isinstance(rec, Mapping) and isinstance(branch, str) and isinstance(rec.get("sha"), str)):
            continue
        attempts = rec.get("attempts") if isinstance(rec.get("attempts"), int) else 0
        out[branch] = PushState(branch, str(rec["sha"]), str(rec.get("remote") or ""), rec.get("ok") is True,
                                str(rec.get("error") or "")[:300], attempts, str(rec.get("at") or ""))
    return out


def failing(path: Path) -> list[PushState]:
    """Pushes that have not gone through (for ``status`` and the metrics: a file read, no git)."""
    return [s for s in read_states(path).values() if not s.ok]


def mark_unpushed(path: Path, branch: str, sha: str, remote: str) -> None:
    """A landing made without a push (settled after a death): the next fire's retry publishes it."""
    states = read_states(path)
    states[branch] = PushState(branch, sha, remote, False, "landed by a fire that died before it pushed", 0,
                               utc_iso())
    write_json(path, redact.current().json(
        {"version": 1, "branches": {b: s.as_json() for b, s in sorted(states.items())}}))


def push_urls(repo: Path, remote: str) -> list[str]:
    """Where ``git push <remote>`` sends, as git resolves it (``insteadOf``/``pushInsteadOf`` expanded)."""
    proc = run_git(repo, "remote", "get-url", "--push", "--all", "--", remote)
    return sorted(proc.stdout.split()) if proc.returncode == 0 else [remote]  # not a remote's name: a URL


def _url_digest(urls: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(urls).encode("utf-8", "surrogateescape")).hexdigest()


def pin_problem(repo: Path, remote: str, pins: Path | None) -> str:
    """Why the push may not go (the remote now points elsewhere than when it was first configured), or "".
    The first push pins it (§8.5): the agent, or a repository's config, cannot redirect what evolve publishes."""
    if pins is None:
        return ""
    urls = push_urls(repo, remote)
    rec = read_json(pins) if pins.exists() else {}
    remotes = rec.get("remotes") if isinstance(rec, dict) and isinstance(rec.get("remotes"), dict) else {}
    pinned = remotes.get(remote) if isinstance(remotes.get(remote), dict) else None
    if pinned is None:
        pin(pins, remote, urls)
        return ""
    if pinned.get("digest") == _url_digest(urls):
        return ""
    shown = redact.current().text(", ".join(urls))[:200]
    return (f"the push remote {remote} now points at {shown}, not where it did when evolve first pushed "
            f"({pinned.get('shown', '?')}): not pushed; if you changed it, run `evolve trust`")


def pin_digest(pins: Path, remote: str) -> str | None:
    """The pinned digest of ``remote``'s push URLs, None when it was never pinned."""
    rec = read_json(pins) if pins.exists() else {}
    remotes = rec.get("remotes") if isinstance(rec, dict) and isinstance(rec.get("remotes"), dict) else {}
    pinned = remotes.get(remote)
    return pinned.get("digest") if isinstance(pinned, dict) and isinstance(pinned.get("digest"), str) else None


def url_digest(urls: list[str]) -> str:
    return _url_digest(urls)


def pin(pins: Path, remote: str, urls: list[str]) -> None:
    """Record where ``remote`` pushes now as the operator's (the first push, or ``evolve trust``)."""
    from evolve.store.dirfd import ensure_dir

    ensure_dir(pins.parent)
    rec = read_json(pins) if pins.exists() else {}
    remotes = dict(rec.get("remotes") or {}) if isinstance(rec, dict) and isinstance(rec.get("remotes"), dict) else {}
    remotes[remote] = {"digest": _url_digest(urls), "shown": redact.current().text(", ".join(urls))[:200],
                       "pinned_at": utc_iso()}
    write_json(pins, {"version": 1, "remotes": remotes})


class Publisher:
    def __init__(self, repo: Path, state: Path, remote: str, enabled: bool, policy: GitPolicy, log: Any,
                 pins: Path | None = None) -> None:
        self.repo, self.state, self.remote, self.enabled = repo, state, remote, enabled
        self.policy, self.log = policy, log
        self.pins = pins  # the operator's record of where the remote pointed when first pushed (§8.5)

    def landed(self, branch: str, sha: str) -> None:
        """``sha`` is now on ``branch``: push it (when ``[git] push`` is on)."""
        if self.enabled:
            self._push(PushState(branch, sha, self.remote, False))

    def retry(self) -> None:
        """At a fire's start: push again what did not go through, if it is still on its branch."""
        if not self.enabled:
            return
        for st in failing(self.state):
            tip = gitrefs.rev(self.repo, st.branch)
            if tip is None or not gitrefs.is_ancestor(self.repo, st.sha, tip):
                self.log.warning("git.push_dropped", branch=st.branch, sha=st.sha,
                                 why="no longer on the branch (the operator removed it): not pushed")
                self._save(st.branch, None)
                continue
            self._push(st)

    def _push(self, st: PushState) -> None:
        branch = land.short_branch(st.branch)
        try:
            error = pin_problem(self.repo, self.remote, self.pins)
            if not error:
                proc = run_git(self.repo, "push", "--porcelain", "--", self.remote, f"{st.sha}:refs/heads/{branch}",
                               policy=self.policy)
                error = "" if proc.returncode == 0 else " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
        except (GitError, OSError) as exc:
            error = str(exc)[:300]
        done = PushState(st.branch, st.sha, self.remote, not error, error, st.attempts + 1, utc_iso())
        self._save(st.branch, done)
        if error:
            self.log.error("git.push_failed", branch=branch, sha=st.sha, remote=self.remote, error=error,
                           attempts=done.attempts, retry="at the next fire")
        else:
            self.log.info("git.push", branch=branch, sha=st.sha, remote=self.remote)

    def _save(self, branch: str, st: PushState | None) -> None:
        states = read_states(self.state)
        if st is None:
            states.pop(branch, None)
        else:
            states[branch] = st
        # The sink: git's complaint may quote a remote URL with its credentials.
        write_json(self.state, redact.current().json(
            {"version": 1, "branches": {b: s.as_json() for b, s in sorted(states.items())}}))
