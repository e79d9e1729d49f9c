"""Consumed implies committed (issue 15 item 1): a failed ``git commit`` is a failed cycle, never an improvement."""

from __future__ import annotations

import os
import sys

from support import Env, entry, git, improved_step, live

from evolve.cycle import transition
from evolve.cycle.gate import committed
from evolve.results import CycleResult

# Leaves the index lock of the tree it runs in (the operator's checkout or evolve's worktree) behind.
LOCK_GATE = [sys.executable, "-c", "import subprocess as s; open(s.run(['git', 'rev-parse', '--git-path', "
             "'index.lock'], capture_output=True, text=True, check=True).stdout.strip(), 'w').close()"]


def _item(env: Env) -> dict:
    return live(env.paths.nextwork)[0]["items"][0]


def test_committed_is_pure_and_turns_a_failed_commit_into_a_failed_cycle() -> None:
    ok = committed(CycleResult.IMPROVED, None)
    assert ok.result is CycleResult.IMPROVED and not ok.fields
    bad = committed(CycleResult.IMPROVED, "git commit failed: index.lock exists")
    assert bad.result is CycleResult.FAILED
    assert bad.fields["error_class"] == "commit_failed" and "index.lock" in bad.fields["error"]
    assert transition.claim_action(bad.result, heavy=False) is transition.ClaimAction.RELEASE


def test_commit_failure_is_not_an_attempt_but_counts_for_the_breaker() -> None:
    from evolve.store.session_state import SessionState

    facts = transition.CycleFacts(cycle=1, result=CycleResult.FAILED, work_ref="r", source="queue", mode="queue:x",
                                  now=0.0, error_class="commit_failed")
    t = transition.after_cycle(SessionState(), facts, transition.Policy(max_attempts=1))
    assert t.claim is transition.ClaimAction.RELEASE and t.park is None and "r" not in t.state.attempts
    assert t.state.consecutive_failures == 1


def test_stale_index_lock_fails_the_cycle_keeps_the_change_and_the_next_fire_commits(env: Env, cli) -> None:
    start = git(env.repo, "rev-parse", "HEAD").strip()
    env.write_config(gate={"commands": [LOCK_GATE], "timeout_s": 60}, git={"isolation": "none"})
    env.queue(entry("write docs"))
    env.steps([improved_step(path="docs/a.md", content="hello\n")], loop=True)
    r = cli("fire", "--cycles", "3")
    assert r.code == 1 and len(env.ledger()) == 1  # the fire ends: every further cycle would fail the same way
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "commit_failed"), (r.stdout, r.stderr)
    assert "index.lock" in e["error"]
    assert git(env.repo, "rev-parse", "HEAD").strip() == start  # no new commit
    assert _item(env)["claim_status"] == "available"  # released, not consumed
    ref = e["uncommitted_ref"]
    assert e["uncommitted_paths"] == ["docs/a.md"]
    assert git(env.repo, "show", f"{ref}:docs/a.md") == "hello\n"  # the change is recoverable
    assert not (env.repo / "docs" / "a.md").exists()  # and the tree is back at the cycle's start
    s = cli("status")
    assert s.code == 1 and "commit failed:" in s.stdout and ref in s.stdout, s.stdout
    d = cli("doctor")
    assert d.code == 1 and "index.lock" in d.stdout and "rm " in d.stdout, d.stdout
    # The operator removes the lock; the next fire does the work again and commits it.
    os.unlink(env.repo / ".git" / "index.lock")
    env.write_config(gate={"commands": []})
    assert cli("fire", "--cycles", "1").code == 0
    e2 = env.ledger()[-1]
    assert e2["result"] == "improved", e2
    assert git(env.repo, "rev-list", "--count", f"{start}..HEAD").strip() == "1"
    assert _item(env)["claim_status"] != "available"


def test_a_stale_lock_in_the_agent_worktree_fails_the_cycle_and_the_next_fire_clears_it(env: Env, cli) -> None:
    """In evolve's own worktree nobody but a dead fire's git can have left the lock: the next fire removes it."""
    start = git(env.repo, "rev-parse", "HEAD").strip()
    env.write_config(gate={"commands": [LOCK_GATE], "timeout_s": 60})
    env.queue(entry("write docs"))
    env.steps([improved_step(path="docs/a.md", content="hello\n")], loop=True)
    r = cli("fire", "--cycles", "3")
    e = env.ledger()[-1]
    assert (r.code, e["result"], e["error_class"]) == (1, "failed", "commit_failed"), (r.stdout, r.stderr)
    assert git(env.repo, "show", f"{e['uncommitted_ref']}:docs/a.md") == "hello\n"
    assert git(env.repo, "rev-parse", "HEAD").strip() == start and _item(env)["claim_status"] == "available"
    assert not (env.repo / ".git" / "index.lock").exists()  # the operator's checkout was never locked
    env.write_config(gate={"commands": []})
    r2 = cli("fire", "--cycles", "1")
    assert r2.code == 0 and "workspace.stale_lock_removed" in r2.names(), r2.stderr
    e2 = env.ledger()[-1]
    assert e2["result"] == "improved" and e2["sha"] == git(env.repo, "rev-parse", "HEAD").strip()
    assert (env.repo / "docs" / "a.md").read_text() == "hello\n"  # landed in the operator's checkout
    assert not list((env.repo / ".git").rglob("index.lock"))


def test_failing_signer_fails_the_cycle(env: Env, cli) -> None:
    start = git(env.repo, "rev-parse", "HEAD").strip()
    gpg = env.root / "bad-gpg"
    gpg.write_text("#!/bin/sh\necho 'no secret key' >&2\nexit 2\n")
    gpg.chmod(0o755)
    glob = env.root / "gitconfig"
    glob.write_text(f"[gpg]\n\tprogram = {gpg}\n[user]\n\tname = t\n\temail = t@example.com\n")
    env.write_config(git={"sign": True})
    env.queue(entry("signed"))
    env.steps([improved_step(path="b.txt", content="b\n")])
    cli("fire", "--cycles", "1", extra_env={"GIT_CONFIG_GLOBAL": str(glob)})
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "commit_failed")
    assert git(env.repo, "rev-parse", "HEAD").strip() == start
    assert git(env.repo, "show", f"{e['uncommitted_ref']}:b.txt") == "b\n"
    assert git(env.repo, "status", "--porcelain", "--untracked-files=no").strip() == ""  # nothing left staged


def test_doctor_names_a_stale_index_lock(env: Env, cli) -> None:
    lock = env.repo / ".git" / "index.lock"
    lock.write_text("")
    os.utime(lock, (1, 1))
    d = cli("doctor")
    assert d.code == 1 and f"rm {lock}" in d.stdout, d.stdout


def test_an_agent_cannot_claim_commit_failed() -> None:
    from evolve.agent.report import parse_report

    r = parse_report({"result": "failed", "error_class": "commit_failed", "error": "x"})
    assert r.error_class == "transient"  # or it would escape the attempt budget


def test_a_change_that_cannot_be_saved_stays_in_the_tree_and_is_recorded(env: Env, fire_inproc, monkeypatch) -> None:
    from evolve.git import change as gitchange
    from evolve.git import run as gitrun

    def refuse(*_a: object, **_k: object) -> str:
        raise gitrun.GitError("git update-ref failed: read-only file system")

    monkeypatch.setattr(gitchange, "save_uncommitted", refuse)
    env.write_config(gate={"commands": [LOCK_GATE], "timeout_s": 60})
    env.queue(entry("x"))
    env.steps([improved_step(path="c.txt", content="c\n")])
    out = fire_inproc(cycles=1)
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"], out.exit_code) == ("failed", "commit_failed", 1)
    assert e["uncommitted_left_in_tree"] is True and e["uncommitted_paths"] == ["c.txt"]
    assert (env.tree / "c.txt").read_text() == "c\n"  # never reverted when it could not be saved


def _fake_proc(root, repo, started_after_boot_s: float) -> object:
    """A /proc with one ``git`` whose cwd is ``repo``, booted at t=1000, ticks at SC_CLK_TCK."""
    proc = root / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "stat").write_text("cpu 0\nbtime 1000\n")
    (proc / "42" / "comm").write_text("git\n")
    (proc / "42" / "cwd").symlink_to(repo)
    ticks = int(started_after_boot_s * os.sysconf("SC_CLK_TCK"))
    (proc / "42" / "stat").write_text("42 (git) S " + " ".join(["0"] * 18) + f" {ticks} 0 0\n")
    return proc


def test_doctor_index_lock_held_by_a_running_git_is_only_a_warning(env: Env) -> None:
    from evolve.doctor import FAIL, WARN, check_index_lock

    lock = env.repo / ".git" / "index.lock"
    lock.write_text("")
    os.utime(lock, (5000, 5000))
    # The git started before the lock was made: it may be the one holding it.
    held = check_index_lock(env.repo, now=5010, proc=_fake_proc(env.root / "a", env.repo, 3000))
    assert held is not None and held.level == WARN
    # Every running git started after the lock, and the lock is old: nobody holds it.
    stale = check_index_lock(env.repo, now=5000 + 3600, proc=_fake_proc(env.root / "b", env.repo, 4500))
    assert stale is not None and stale.level == FAIL and f"rm {lock}" in stale.fix
    assert check_index_lock(env.repo, now=5010, proc=env.root / "nowhere") is not None  # no /proc: no git seen
    lock.unlink()
    assert check_index_lock(env.repo) is None
