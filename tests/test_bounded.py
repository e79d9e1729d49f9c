"""Every step of a fire is bounded (issue 15 item 6): git, and every child, within ``max_minutes``.

No assertion depends on speed: each test asserts what happened (an exception, a ledger entry, a dead
process); the thread joins and deadlines are only guards against a hang failing the suite forever.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest
from support import Env, entry, improved_step

from evolve import log, procgroup
from evolve.cycle.fire import Fire, FireOptions
from evolve.cycle.gate import Gate
from evolve.git import change as gitchange
from evolve.git import refs as gitrefs
from evolve.git import run as gitrun

HANG_GUARD_S = 120.0


def _alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper is dead: killed, just not yet collected)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat_line[stat_line.rfind(")") + 2 :].split()[0] != "Z"


def _hanging_hook(repo: Path, name: str, pidfile: Path) -> None:
    """A hook whose child sleeps far past any limit (as a hung ``git push`` or network filesystem would)."""
    hook = repo / ".git" / "hooks" / name
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)


def _in_thread(fn) -> dict[str, object]:
    """Run ``fn`` with a hang guard; returns {"value": ...} or {"error": exc}."""
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test to assert on
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG_GUARD_S)
    assert not t.is_alive(), "hung past the hang guard"
    return out


def test_a_hanging_hook_times_out_as_a_git_error_and_its_group_is_killed(env: Env) -> None:
    pidfile = env.root / "hook-child.pid"
    _hanging_hook(env.repo, "post-commit", pidfile)  # post-commit runs even with --no-verify
    (env.repo / "a.txt").write_text("a\n")
    policy = gitrun.GitPolicy(run_hooks=True, timeout_s=1)
    out = _in_thread(lambda: gitchange.commit_paths(env.repo, ["a.txt"], "evolve: x", policy))
    err = out.get("error")
    assert isinstance(err, gitrun.GitError) and isinstance(err, gitrun.GitTimeout), out
    assert "git commit timed out" in str(err)
    assert not _alive(int(pidfile.read_text()))  # the hook's own child went with the group


def test_git_is_capped_by_the_fires_remaining_budget(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procgroup, "STEP_GRACE_S", 0.5)
    pidfile = env.root / "hook-child.pid"
    _hanging_hook(env.repo, "post-commit", pidfile)
    (env.repo / "a.txt").write_text("a\n")
    policy = gitrun.GitPolicy(run_hooks=True, timeout_s=3600)  # its own limit would let it hang an hour

    def commit() -> str | None:
        with procgroup.fire_budget(lambda: -5.0):  # the fire is already past max_minutes
            return gitchange.commit_paths(env.repo, ["a.txt"], "evolve: x", policy)

    err = _in_thread(commit).get("error")
    assert isinstance(err, gitrun.GitTimeout)
    assert not _alive(int(pidfile.read_text()))


def test_git_outside_a_fire_keeps_its_ordinary_results(env: Env) -> None:
    assert gitrefs.head(env.repo)
    assert gitrun.run_git(env.repo, "rev-parse", "--verify", "-q", "nope").returncode != 0
    (env.repo / "caf\u00e9.txt").write_text("x\n")
    assert "caf\u00e9.txt" in gitchange.dirty_paths(env.repo)


def test_every_child_is_capped_by_the_remaining_budget(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(procgroup, "STEP_GRACE_S", 0.5)
    limits = procgroup.Limits(timeout_s=3600, grace_s=1.0)

    def run() -> procgroup.ProcessResult:
        with procgroup.fire_budget(lambda: 0.0):
            return procgroup.run_group(["sleep", "600"], cwd=tmp_path, env=dict(os.environ), limits=limits)

    res = _in_thread(run)["value"]
    assert isinstance(res, procgroup.ProcessResult) and res.timed_out == "hard"
    assert procgroup.capped(0) == 0.0 and procgroup.capped(10) == 10  # no fire: the step's own limit


def test_a_gate_past_max_minutes_is_killed_and_the_cycle_fails(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procgroup, "STEP_GRACE_S", 1.0)
    # The fire runs out of time as its gate starts: its remaining budget reads negative from then on.
    # (Out of time from the start, the 1 s grace would cap the agent and git too, which a loaded machine
    # may not start within it.)
    over = threading.Event()
    real = Gate.run_commands

    def run_commands(self: Gate, *args: object, **kwargs: object) -> object:
        over.set()
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Gate, "run_commands", run_commands)
    monkeypatch.setattr(Fire, "_remaining_s", lambda self: -1.0 if over.is_set() else 3600.0)
    hang = [sys.executable, "-c", "import time; time.sleep(90)"]  # exit 0 if nothing stops it
    env.write_config(gate={"commands": [hang], "timeout_s": 1800}, fire={"max_minutes": 30})
    env.queue(entry("a"))
    env.steps([improved_step()])

    def fire() -> object:
        with open(env.root / "log.jsonl", "ab") as fh:
            log.configure(json=True, stream=fh)
            return Fire(env.paths, env.cfg(), FireOptions(cycles=1), env=env.env()).run()

    assert "value" in _in_thread(fire)
    e = env.ledger()[-1]
    assert e["result"] == "regressed" and "timed out" in e["gate_detail"]


def test_a_hanging_commit_hook_fails_the_commit_and_the_fire_ends(env: Env) -> None:
    pidfile = env.root / "hook-child.pid"
    _hanging_hook(env.repo, "post-commit", pidfile)
    # Every git call of the fire gets this limit: long enough for a loaded machine's worktree and
    # status calls, far short of the hook's 600 s.
    env.write_config(git={"run_hooks": True, "timeout_s": 8})
    env.queue(entry("a"))
    env.steps([improved_step()])
    logfile = env.root / "log.jsonl"

    def fire() -> object:
        with open(logfile, "ab") as fh:
            log.configure(json=True, stream=fh)
            return Fire(env.paths, env.cfg(), FireOptions(cycles=1), env=env.env()).run()

    assert "value" in _in_thread(fire)
    text = logfile.read_text()
    assert "git.commit_failed" in text and "timed out" in text
    assert not _alive(int(pidfile.read_text()))


def test_goal_checks_are_capped_by_the_remaining_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evolve.work.goals import Goal, GoalsFile, MeasureError, measure

    monkeypatch.setattr(procgroup, "STEP_GRACE_S", 0.5)
    slow = Goal(id="slow", description="d", check="sleep 90", weight=5)
    gf = GoalsFile(path=tmp_path / "GOALS.yaml", era="0123456789ab", goals=(slow,), directives=(), version="2")

    def run() -> object:
        with procgroup.fire_budget(lambda: 0.0):  # out of time: an hour of goal timeouts must not count
            return measure(tmp_path, gf, goal_timeout_s=3600, total_timeout_s=3600, parallel=1)

    assert isinstance(_in_thread(run).get("error"), MeasureError)
