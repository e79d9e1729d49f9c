"""Issue 22: the landing lands exactly the agent's change, on the branch evolve planned, over nothing of the
operator's, and the record says what git says.

The pure plan (``evolve/git/land.py``) is a table; the rest are real fires (``python -m evolve``) on real
repositories, with a real bare remote for pushes and real operator actions (drop, amend, switch branch,
detach, rebase) made while the agent is certainly running (it waits for a file the test writes). Every
test asserts the git state: what is on the branch and the remote, the operator's files byte for byte.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry, git, improved_step, live

from evolve import sandbox
from evolve.cycle import pending
from evolve.git import land
from evolve.git.land import Snapshot, Step

T, B, N = "t" * 40, "b" * 40, "n" * 40


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def wait_until(pred, what: str, timeout: float = 120.0) -> None:
    """A hang guard only: the condition is an event, never a speed."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def no_lock(repo: Path) -> None:
    assert not (repo / ".git" / "index.lock").exists()


def commit_file(repo: Path, path: str, content: str, msg: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(content)
    git(repo, "add", "--", path)
    git(repo, "commit", "-q", "-m", msg)
    return head(repo)


def start_fire(env: Env, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env.env())


def events(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


# -- the plan, as a table ----------------------------------------------------------------------------


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = {"branch": "refs/heads/main", "tip": B, "base": B, "new": N}
    return Snapshot(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "step", "says"),
    [
        ({"new": B}, Step.NOTHING, ""),
        ({"stopping": True}, Step.STOP, "stop"),
        ({"stopping": True, "tip": None}, Step.STOP, "stop"),  # a stop outranks everything else
        ({"too_large": (("big.bin", 60_000_000),), "limit_mb": 50}, Step.REFUSE, "big.bin (60.0 MB)"),
        ({"tip": None}, Step.GONE, "main no longer exists"),
        ({"tip": T}, Step.REPLAY, "moved to tttttttttttt"),
        ({"tip": T, "base_on_branch": False}, Step.REPLAY, "rewritten"),
        ({"tip": T, "holder": "/op", "in_the_way": ("a",)}, Step.REPLAY, "moved"),  # replay first, then look
        ({}, Step.CAS, ""),
        ({"holder": "/op"}, Step.FAST_FORWARD, ""),
        ({"holder": "/op", "holder_busy": "a rebase is in progress"}, Step.HOLD, "a rebase is in progress"),
        ({"holder": "/op", "holder_locked": True}, Step.HOLD, "index.lock"),
        ({"holder": "/op", "in_the_way": ("local.conf",)}, Step.HOLD, "local.conf"),
        ({"holder": "/op", "in_the_way": tuple(f"f{i}" for i in range(8))}, Step.HOLD, "and 3 more"),
    ],
)
def test_the_landing_plan(kw: dict[str, Any], step: Step, says: str) -> None:
    got = land.plan(snap(**kw))
    assert got.step is step and says in got.reason


@pytest.mark.parametrize(
    ("landing", "dirty", "present", "blocked", "way"),
    [
        ({"a": True}, set(), {"a"}, set(), ()),  # a tracked path, unchanged in the checkout: git updates it
        ({"a": True}, {"a"}, {"a"}, set(), ("a",)),  # the operator changed it
        ({"new.txt": False}, set(), set(), set(), ()),  # added, nothing there
        ({"local.conf": False}, set(), {"local.conf"}, set(), ("local.conf",)),  # ignored, or untracked
        ({"d/x": False}, set(), set(), {"d/x"}, ("d/x",)),  # d is a file or a link in the checkout
        ({"a": True, "b": False}, {"c"}, {"c"}, set(), ()),  # their other edits are not in the way
    ],
)
def test_what_is_in_the_way(landing, dirty, present, blocked, way) -> None:
    assert land.in_the_way(landing, dirty, present, blocked) == way


@pytest.mark.parametrize(
    ("names", "head_text", "says"),
    [
        (set(), "ref: refs/heads/main\n", ""),
        (set(), "0123456789abcdef0123456789abcdef01234567\n", "detached"),
        ({"rebase-merge"}, "ref: refs/heads/main\n", "rebase"),
        ({"rebase-apply"}, "0123456789abcdef0123456789abcdef01234567\n", "rebase"),
        ({"MERGE_HEAD"}, "ref: refs/heads/main\n", "merge"),
        ({"CHERRY_PICK_HEAD"}, "ref: refs/heads/main\n", "cherry-pick"),
        ({"REVERT_HEAD"}, "ref: refs/heads/main\n", "revert"),
        ({"BISECT_LOG"}, "ref: refs/heads/main\n", "bisect"),
        (set(), None, "cannot be read"),
        (set(), "ref: refs/remotes/origin/main\n", "not a branch"),
    ],
)
def test_operator_busy(names, head_text, says) -> None:
    why = land.operator_busy(names, head_text)
    assert (says in why) if says else why == ""


def test_remap_follows_the_replayed_commits() -> None:
    held = (pending.Held(cycle=3, work_ref="a", sha="x", commits=2), pending.Held(cycle=4, work_ref="b", sha="y"))
    replayed = [("1" * 40, "agent: x"), ("2" * 40, "evolve: cycle 3 -- a improved"), ("3" * 40, "evolve: cycle 4 -- b")]
    assert [h.sha for h in pending.remap(held, replayed, T)] == ["2" * 40, "3" * 40]
    # One commit was already on the branch (the rebase dropped it): found by its subject, the rest by the tip.
    dropped = [("3" * 40, "evolve: cycle 4 -- b")]
    assert [h.sha for h in pending.remap(held, dropped, T)] == [T, "3" * 40]


def test_records_keep_what_validates(tmp_path: Path) -> None:
    p = tmp_path / "pending.json"
    chain = pending.Chain("refs/heads/main", B.replace("b", "1"), N.replace("n", "2"),
                          (pending.Held(cycle=2, work_ref="r", sha="2" * 40),))
    pending.save(p, {"refs/heads/main": chain})
    assert pending.load(p) == {"refs/heads/main": chain}
    p.write_bytes(orjson.dumps({"chains": {"x": {"branch": "main", "base": "zz"}, "y": chain.as_json()}}))
    assert list(pending.load(p)) == ["refs/heads/main"]  # the bad one is left out, nothing raised
    p.write_bytes(b"\xff not json")
    assert pending.load(p) == {} and pending.held_refs(p) == frozenset()


# -- only the cycle's own commits land, on the branch evolve planned ------------------------------------


def test_an_agent_that_checks_out_another_branch_lands_nothing_and_moves_no_branch(env: Env, cli) -> None:
    main = head(env.repo)
    git(env.repo, "branch", "feature")
    git(env.repo, "checkout", "-q", "feature")
    feature = commit_file(env.repo, "feature.txt", "unfinished\n", "operator: feature work in progress")
    git(env.repo, "checkout", "-q", "main")
    env.queue(entry("fix"))
    env.steps([{"run": [["git", "checkout", "-q", "feature"]],
                "write": [{"path": "fix.txt", "content": "fix\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "land_refused"), e
    assert "checked out feature" in e["error"] or "did not make" in e["error"], e["error"]
    assert head(env.repo) == main and not (env.repo / "feature.txt").exists()  # nothing of feature on main
    assert head(env.repo, "refs/heads/feature") == feature  # feature never moved
    proc = subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=env.tree, capture_output=True, text=True)
    assert proc.returncode != 0  # the worktree is detached again: the operator can check out feature
    git(env.repo, "checkout", "-q", "feature")
    assert (env.repo / "feature.txt").read_text() == "unfinished\n"
    git(env.repo, "checkout", "-q", "main")
    kept = e["unlanded_ref"]
    assert git(env.repo, "show", f"{kept}:fix.txt") == "fix\n"  # the agent's work is kept, not lost
    no_lock(env.repo)


def test_an_agent_that_commits_on_a_new_branch_of_its_own_lands_only_its_commits(env: Env, cli) -> None:
    main = head(env.repo)
    env.queue(entry("feat"))
    env.steps([{"write": [{"path": "a.txt", "content": "a\n"}],
                "run": [["git", "checkout", "-q", "-b", "agent-branch"], ["git", "add", "a.txt"],
                        ["git", "commit", "-q", "-m", "agent: a"]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["sha"] == head(env.repo), e
    assert git(env.repo, "rev-list", "--count", f"{main}..main").strip() == "1"
    assert (env.repo / "a.txt").read_text() == "a\n"
    if sandbox.probe(os.environ).ok:  # refs/heads/ is read-only to the agent (docs/DESIGN.md §8.6): no branch
        assert not (env.repo / ".git" / "refs" / "heads" / "agent-branch").exists()
        assert "agent-branch" not in git(env.repo, "branch", "--list")
    else:  # evolve moved only main: the agent's own branch stays where the agent left it.
        assert head(env.repo, "refs/heads/agent-branch") == e["sha"]


def test_an_agent_that_resets_below_the_cycle_start_lands_nothing(env: Env, cli) -> None:
    commit_file(env.repo, "one.txt", "1\n", "one")
    two = commit_file(env.repo, "two.txt", "2\n", "two")
    env.queue(entry("undo"))
    env.steps([{"run": [["git", "reset", "-q", "--hard", "HEAD~1"]],
                "write": [{"path": "x.txt", "content": "x\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["error_class"] == "land_refused"
    assert head(env.repo) == two and (env.repo / "two.txt").exists()


def run_with_operator(env: Env, action, *, steps: list[dict[str, Any]] | None = None,
                      args: tuple[str, ...] = ("--cycles", "1")) -> tuple[int, str]:
    """A fire whose agent waits until the operator's ``action`` is done (while the cycle certainly runs)."""
    go = env.root / "go"
    go.unlink(missing_ok=True)
    env.steps(steps or [{"write": [{"path": "agent.txt", "content": "agent\n"}], "wait_for": str(go),
                         "report": {"result": "improved"}}])
    fire = start_fire(env, *args)
    wait_until(lambda: (env.tree / "agent.txt").exists() or any(env.tree.glob("*.agent")), "the agent's edit")
    action()
    go.write_text("")
    _, err = fire.communicate(timeout=300)
    return fire.returncode, err


def test_a_commit_the_operator_drops_during_a_cycle_never_comes_back(env: Env) -> None:
    base = head(env.repo)
    commit_file(env.repo, "secret.txt", "AKIA-not-for-git\n", "oops: committed a secret")
    env.queue(entry("work"))

    def drop() -> None:
        git(env.repo, "reset", "-q", "--hard", base)  # the operator drops the commit with the secret

    code, err = run_with_operator(env, drop)
    assert code == 0, err
    e = env.ledger()[-1]
    assert e["result"] == "improved", e
    assert e["sha"] == head(env.repo)  # the sha that landed (after the replay), not the pre-replay one
    log = git(env.repo, "log", "--format=%s", "main")
    assert "oops: committed a secret" not in log and not (env.repo / "secret.txt").exists()
    assert git(env.repo, "ls-tree", "-r", "--name-only", "main").split() == ["README.md", "agent.txt"]
    assert git(env.repo, "rev-parse", "main~1").strip() == base  # replayed onto the new tip: one commit
    assert git(env.repo, "status", "--porcelain").strip() == ""
    no_lock(env.repo)


def test_a_commit_the_operator_amends_during_a_cycle_stays_amended(env: Env) -> None:
    commit_file(env.repo, "conf.txt", "password=hunter2\n", "conf")
    env.queue(entry("work"))

    def amend() -> None:
        (env.repo / "conf.txt").write_text("password=<from the vault>\n")
        git(env.repo, "commit", "-q", "-a", "--amend", "-m", "conf (no password)")

    amended = None

    def act() -> None:
        nonlocal amended
        amend()
        amended = head(env.repo)

    code, err = run_with_operator(env, act)
    assert code == 0, err
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["sha"] == head(env.repo)
    assert git(env.repo, "rev-parse", "main~1").strip() == amended
    assert "hunter2" not in git(env.repo, "log", "-p", "main")  # the amended-away content is gone for good
    assert (env.repo / "conf.txt").read_text() == "password=<from the vault>\n"


def test_a_replayed_change_that_goes_red_on_the_operator_s_new_tip_does_not_land(env: Env) -> None:
    base = head(env.repo)
    env.write_config(gate={"commands": [[sys.executable, "-c",
                                         "import pathlib,sys; sys.exit(pathlib.Path('block.txt').exists())"]]})
    env.queue(entry("work"))

    def operator_commit() -> None:
        commit_file(env.repo, "block.txt", "the gate fails with this file\n", "operator: block")

    code, err = run_with_operator(env, operator_commit)
    assert code == 0, err
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "land_conflict") and "red after replaying" in e["error"]
    assert git(env.repo, "rev-list", "--count", f"{base}..main").strip() == "1"  # only the operator's commit
    assert not (env.repo / "agent.txt").exists()
    assert git(env.repo, "show", f"{e['unlanded_ref']}:agent.txt") == "agent\n"


# -- the operator's files -----------------------------------------------------------------------------------


def test_an_ignored_file_of_the_operator_is_never_overwritten(env: Env, cli) -> None:
    commit_file(env.repo, ".gitignore", "local.conf\n", "ignore local.conf")
    (env.repo / "local.conf").write_text("password=operator-only\n")
    env.queue(entry("conf"))
    env.steps([{"write": [{"path": "local.conf", "content": "agent's version\n"}],
                "run": [["git", "add", "-f", "local.conf"], ["git", "commit", "-q", "-m", "agent: local.conf"]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "pending" and e["landed"] is False and "local.conf" in e["pending_reason"], e
    assert (env.repo / "local.conf").read_text() == "password=operator-only\n"  # byte for byte
    assert head(env.repo, "refs/evolve/pending/main") == e["sha"]
    s = cli("status", "--json")
    info = orjson.loads(s.stdout)
    assert "local.conf" in orjson.dumps(info).decode()


def test_an_untracked_file_and_a_file_where_a_directory_must_go_hold_the_landing(env: Env, cli) -> None:
    (env.repo / "docs").write_text("the operator's notes, a file named docs\n")
    (env.repo / "new.txt").write_text("untracked, the operator's\n")
    env.queue(entry("docs"))
    env.steps([{"write": [{"path": "docs/a.md", "content": "a\n"}, {"path": "new.txt", "content": "agent\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "pending" and "docs/a.md" in e["pending_reason"] and "new.txt" in e["pending_reason"]
    assert (env.repo / "docs").read_text() == "the operator's notes, a file named docs\n"
    assert (env.repo / "new.txt").read_text() == "untracked, the operator's\n"


def test_a_stale_index_lock_holds_the_landing_with_the_reason(env: Env, cli) -> None:
    start = head(env.repo)
    (env.repo / ".git" / "index.lock").write_text("")
    env.queue(entry("x"))
    env.steps([improved_step(path="x.txt", content="x\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "pending" and "index.lock" in e["pending_reason"], e
    assert head(env.repo) == start and not (env.repo / "x.txt").exists()
    (env.repo / ".git" / "index.lock").unlink()
    env.steps([{"report": {"result": "unchanged"}}])
    env.queue(entry("y"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert (env.repo / "x.txt").read_text() == "x\n" and head(env.repo) == e["sha"]


def test_a_file_over_max_file_mb_never_lands(env: Env, cli) -> None:
    start = head(env.repo)
    env.write_config(git={"max_file_mb": 1})
    env.queue(entry("big"))
    env.steps([{"write": [{"path": "big.bin", "content": "x" * 1_500_000}, {"path": "ok.txt", "content": "ok\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "land_refused") and "big.bin (1.5 MB)" in e["error"], e
    assert head(env.repo) == start and not (env.repo / "big.bin").exists()
    assert git(env.repo, "cat-file", "-s", f"{e['unlanded_ref']}:big.bin").strip() == "1500000"  # kept
    assert env.state()["attempts"]  # the agent made it: an attempt is charged


# -- push what landed, where it landed ------------------------------------------------------------------


def bare_remote(env: Env) -> Path:
    remote = env.root / "remote.git"
    git(env.root, "init", "-q", "--bare", str(remote))
    git(env.repo, "remote", "add", "origin", str(remote))
    git(env.repo, "push", "-q", "origin", "main")
    return remote


def test_push_publishes_the_landed_sha_to_its_branch_even_after_the_operator_switched(env: Env) -> None:
    remote = bare_remote(env)
    env.write_config(git={"push": True})
    git(env.repo, "branch", "feature")
    env.queue(entry("work"))

    def switch() -> None:
        git(env.repo, "checkout", "-q", "feature")
        commit_file(env.repo, "wip.txt", "unpublished\n", "operator: unpublished feature work")

    code, err = run_with_operator(env, switch)
    assert code == 0, err
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["sha"] == head(env.repo, "refs/heads/main")
    assert head(remote, "refs/heads/main") == e["sha"]  # main's landing is published
    refs = git(remote, "for-each-ref", "--format=%(refname)").split()
    assert refs == ["refs/heads/main"]  # feature's unpublished work is not
    assert head(env.repo) == head(env.repo, "refs/heads/feature")  # the operator is still on feature


def test_a_failed_push_is_visible_and_retried(env: Env, cli) -> None:
    remote = bare_remote(env)
    env.write_config(git={"push": True})
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'remote: not today' >&2\nexit 1\n")
    hook.chmod(0o755)
    env.queue(entry("one"))
    env.steps([improved_step(path="a.txt", content="a\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "git.push_failed" in r.names()
    landed = env.ledger()[-1]["sha"]
    assert head(remote, "refs/heads/main") != landed
    s = cli("status", "--json")
    info = orjson.loads(s.stdout)
    assert s.code == 1 and any("push" in reason for reason in info["reasons"]), info["reasons"]
    hook.unlink()
    env.steps([{"report": {"result": "unchanged"}}])
    env.queue(entry("two"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and "git.push" in r.names(), r.stderr
    assert head(remote, "refs/heads/main") == landed
    assert orjson.loads(cli("status", "--json").stdout)["exit_code"] == 0


def test_a_landing_from_pending_is_pushed_too(env: Env, cli) -> None:
    remote = bare_remote(env)
    env.write_config(git={"push": True})
    (env.repo / "x.txt").write_text("the operator's, untracked\n")
    env.queue(entry("x"))
    env.steps([improved_step(path="x.txt", content="agent\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    pend = env.ledger()[-1]
    assert pend["result"] == "pending" and head(remote, "refs/heads/main") != pend["sha"]
    (env.repo / "x.txt").unlink()
    env.steps([{"report": {"result": "unchanged"}}])
    env.queue(entry("y"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert head(env.repo) == pend["sha"] == head(remote, "refs/heads/main")


# -- the operator mid-operation -------------------------------------------------------------------------


def test_a_rebase_in_progress_runs_no_agent_and_status_says_why(env: Env, cli) -> None:
    commit_file(env.repo, "f.txt", "base\n", "base")
    git(env.repo, "checkout", "-q", "-b", "topic")
    commit_file(env.repo, "f.txt", "topic\n", "topic")
    git(env.repo, "checkout", "-q", "main")
    commit_file(env.repo, "f.txt", "main\n", "main")
    git(env.repo, "checkout", "-q", "topic")
    proc = subprocess.run(["git", "rebase", "main"], cwd=env.repo, capture_output=True, text=True,
                          env={**os.environ, "GIT_EDITOR": "true"})
    assert proc.returncode != 0  # stopped on the conflict: a rebase is in progress
    before = (env.repo / "f.txt").read_bytes()
    env.queue(entry("x"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and "fire.operator_busy" in r.names(), r.stderr
    assert env.calls() == [] and env.ledger() == []
    assert (env.repo / "f.txt").read_bytes() == before and (env.repo / ".git" / "rebase-merge").is_dir()
    s = cli("status")
    assert "rebase is in progress" in s.stdout, s.stdout


def test_in_place_mode_with_a_detached_head_commits_nothing(env: Env, cli) -> None:
    env.write_config(git={"isolation": "none"})
    git(env.repo, "checkout", "-q", "--detach")
    before = head(env.repo)
    env.queue(entry("x"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and "fire.operator_busy" in r.names(), r.stderr
    assert head(env.repo) == before and env.ledger() == []


# -- every death settled truthfully ---------------------------------------------------------------------


@pytest.mark.parametrize("point", ["land.before_move", "land.moved"])
def test_a_death_at_the_landing_is_settled_from_the_branch(env: Env, cli, point: str) -> None:
    start = head(env.repo)
    env.queue(entry("once"))
    env.steps([improved_step(path="once.txt", content="once\n")])
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_CRASHPOINT": point})
    assert r.code == -signal.SIGKILL
    env.steps([improved_step(path="twice.txt", content="twice\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    first = ledger[0]
    once = [c for c in git(env.repo, "log", "--format=%H", f"{start}..main").split()
            if "once.txt" in git(env.repo, "show", "--name-only", "--format=", c)]
    if point == "land.moved" or first["result"] == "improved":
        # On the branch (or its fast-forward finished by the next fire): improved, finalized, never redone.
        assert (first["result"], first["recovered"]) == ("improved", "landing") and once == [first["sha"]]
        assert (env.repo / "once.txt").read_text() == "once\n"
        assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "consumed"
    else:  # the ref never moved: crashed, the work stranded, the item retried
        assert first["result"] == "crashed" and git(env.repo, "for-each-ref", "refs/evolve/stranded/").strip()
    assert not env.paths.landing_intent.exists()
    assert git(env.repo, "status", "--porcelain").strip() == ""
    no_lock(env.repo)
    for e in env.ledger():
        if e["result"] == "improved":
            git(env.repo, "cat-file", "-e", e["sha"])  # every improved entry names a commit that exists


def test_a_fast_forward_killed_half_way_is_finished_not_left_half_done(env: Env, cli) -> None:
    """git died inside the fast-forward: some files new, the index and branch old, git's index.lock left."""
    old = head(env.repo)
    commit_file(env.repo, "a.txt", "a\n", "evolve: cycle 1 -- x improved")
    (env.repo / "b.txt").write_text("b\n")
    git(env.repo, "add", "b.txt")
    git(env.repo, "commit", "-q", "--amend", "--no-edit")
    new = head(env.repo)
    git(env.repo, "reset", "-q", "--hard", old)
    (env.repo / "a.txt").write_text("a\n")  # git wrote one file, then died holding the lock
    (env.repo / ".git" / "index.lock").write_bytes((env.repo / ".git" / "index").read_bytes())
    held = {"cycle": 1, "work_ref": "source_epic=e1:item=x", "source": "harvested", "claimed_by": "evolve:cycle-1",
            "title": "x", "sha": new, "commits": 1, "start": old}
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.landing_intent.write_bytes(orjson.dumps(
        {"kind": "cycle", "branch": "refs/heads/main", "base": old, "new": new, "held": [held],
         "phase": "fast_forward", "old": old, "checkout": str(env.repo)}))
    env.queue(entry("x"))
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert head(env.repo) == new and git(env.repo, "status", "--porcelain").strip() == ""
    assert (env.repo / "b.txt").read_text() == "b\n"
    no_lock(env.repo)
    assert env.ledger()[0]["result"] == "improved" and env.ledger()[0]["sha"] == new


def test_a_half_done_landing_over_the_operator_s_later_edit_touches_nothing(env: Env, cli) -> None:
    old = head(env.repo)
    new = commit_file(env.repo, "a.txt", "a\n", "evolve: cycle 1 -- x improved")
    git(env.repo, "reset", "-q", "--hard", old)
    (env.repo / "a.txt").write_text("the operator wrote this after the crash\n")
    held = {"cycle": 1, "work_ref": "r", "source": "harvested", "claimed_by": "evolve:cycle-1", "title": "x",
            "sha": new, "commits": 1, "start": old}
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.landing_intent.write_bytes(orjson.dumps(
        {"kind": "cycle", "branch": "refs/heads/main", "base": old, "new": new, "held": [held],
         "phase": "fast_forward", "old": old, "checkout": str(env.repo)}))
    r = cli("fire", "--cycles", "1")
    assert "land.finish_refused" in r.names(), r.stderr
    assert (env.repo / "a.txt").read_text() == "the operator wrote this after the crash\n"
    assert head(env.repo) == old


def test_kill_during_the_gate_stops_it_and_nothing_lands(env: Env, cli) -> None:
    start = head(env.repo)
    started = env.root / "gate-started"
    gate = (f"import os,pathlib,time; pathlib.Path({str(started)!r}).write_text(str(os.getpid()));"
            " time.sleep(600)")
    env.write_config(gate={"commands": [[sys.executable, "-c", gate]], "timeout_s": 900})
    env.queue(entry("x"))
    env.steps([improved_step(path="x.txt", content="x\n")])
    fire = start_fire(env, "--cycles", "1")
    wait_until(started.exists, "the gate command")
    pid = int(started.read_text())
    r = cli("kill", "--reason", "stop it now")
    assert r.code == 0 and "gate" in r.stdout, r.stdout
    _, err = fire.communicate(timeout=120)
    assert fire.returncode == 143, err
    e = env.ledger()[-1]
    assert e["result"] == "interrupted", e
    assert head(env.repo) == start and not (env.repo / "x.txt").exists()  # nothing landed
    assert git(env.repo, "show", f"{e['interrupted_ref']}:x.txt") == "x\n"  # the work is kept
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
               "the gate's process to be gone")
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"
    no_lock(env.repo)


def test_sigterm_during_the_agent_keeps_its_edits_under_a_ref(env: Env) -> None:
    env.queue(entry("x"))
    env.steps([{"write": [{"path": "half.txt", "content": "half done\n"}], "hang": True}])
    fire = start_fire(env, "--cycles", "1")
    wait_until(lambda: (env.tree / "half.txt").exists(), "the agent's edit")
    fire.send_signal(signal.SIGTERM)
    _, err = fire.communicate(timeout=120)
    assert fire.returncode == 143, err
    e = env.ledger()[-1]
    assert e["result"] == "interrupted" and git(env.repo, "show", f"{e['interrupted_ref']}:half.txt") == "half done\n"
    assert not (env.repo / "half.txt").exists()


# -- the record matches git -----------------------------------------------------------------------------


def test_history_and_report_show_what_landed_and_what_waits(env: Env, cli) -> None:
    (env.repo / "w.txt").write_text("the operator's\n")
    env.queue(entry("waits", "lands"))
    env.steps([improved_step(path="w.txt", content="agent\n"), improved_step(path="ok.txt", content="ok\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    waiting = env.ledger()[-1]
    assert waiting["result"] == "pending"
    h = cli("history", "--json")
    rows = [orjson.loads(line) for line in h.stdout.splitlines() if line.strip()]
    row = next(x for x in rows if x["cycle"] == waiting["cycle"])
    assert row["result"] == "pending" and row.get("landed") is False
    text = cli("history").stdout
    assert "pending" in text
    (env.repo / "w.txt").unlink()
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    rows = [orjson.loads(line) for line in cli("history", "--json").stdout.splitlines() if line.strip()]
    settle = next(x for x in rows if x.get("pending_cycle") == waiting["cycle"])
    assert settle["result"] == "improved" and settle["sha"] == head(env.repo) == waiting["sha"]


def test_dormant_never_keeps_waiting_commits_from_landing(env: Env, cli) -> None:
    (env.repo / "w.txt").write_text("the operator's\n")
    env.queue(entry("waits"))
    env.steps([improved_step(path="w.txt", content="agent\n")])
    assert cli("fire", "--cycles", "1").code == 0
    waiting = env.ledger()[-1]
    assert waiting["result"] == "pending"
    # Idle passes would write DORMANT; with commits waiting they must not.
    env.steps([{"report": {"result": "unchanged"}}])
    for _ in range(4):
        assert cli("fire", "--cycles", "1").code == 0
    assert not env.paths.dormant.exists()
    # A DORMANT written meanwhile (another tool) does not stop the landing either.
    env.paths.dormant.write_text("cycle 1\n2026-12-01T00:00:00Z\nstagnation\n")
    (env.repo / "w.txt").unlink()
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "dormant.cleared" in r.names() and head(env.repo) == waiting["sha"]  # landed; then it may rest


def test_a_waiting_item_keeps_its_claim_however_old(env: Env, cli) -> None:
    (env.repo / "w.txt").write_text("the operator's\n")
    env.write_config(work={"claim_visibility_minutes": 0.01})
    env.queue(entry("waits"))
    env.steps([improved_step(path="w.txt", content="agent\n")])
    assert cli("fire", "--cycles", "1").code == 0
    time.sleep(1.0)  # past the visibility window: a plain in_progress claim would be taken over now
    env.steps([improved_step(path="other.txt", content="o\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert [e["result"] for e in env.ledger()] == ["pending", "unchanged"]  # idle: the held item is not work
    assert len(env.calls()) == 1


def test_the_pending_ref_deleted_by_hand_releases_the_items(env: Env, cli) -> None:
    (env.repo / "w.txt").write_text("the operator's\n")
    env.queue(entry("waits"))
    env.steps([improved_step(path="w.txt", content="agent\n")])
    assert cli("fire", "--cycles", "1").code == 0
    git(env.repo, "update-ref", "-d", "refs/evolve/pending/main")
    env.steps([{"report": {"result": "unchanged"}}])
    env.queue(entry("next"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    released = next(e for e in env.ledger() if e.get("pending_cycle") == 1)
    assert released["result"] == "failed" and "deleted" in released["error"]


# -- limits ---------------------------------------------------------------------------------------------


def test_worktree_dir_naming_the_operator_s_own_worktree_is_refused(env: Env, cli) -> None:
    mine = env.root / "operator-wt"
    git(env.repo, "worktree", "add", "-q", "-b", "mywork", str(mine))
    tip = commit_file(mine, "m.txt", "mine\n", "operator: my work")
    env.write_config(git={"worktree_dir": str(mine)})
    env.queue(entry("x"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 1 and "did not create" in r.stderr, r.stderr
    assert head(mine) == tip and (mine / "m.txt").read_text() == "mine\n"
    assert head(env.repo, "refs/heads/mywork") == tip


def test_in_place_paths_are_literal_a_file_named_star_stages_nothing_else(env: Env, cli) -> None:
    env.write_config(git={"isolation": "none"})
    commit_file(env.repo, "mine.txt", "v1\n", "mine")
    (env.repo / "mine.txt").write_text("the operator's unsaved edit\n")
    env.queue(entry("star"))
    env.steps([improved_step(path="*", content="a file named star\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved"
    assert git(env.repo, "show", "--name-only", "--format=", e["sha"]).split() == ["*"]
    assert git(env.repo, "show", "HEAD:mine.txt") == "v1\n"  # the operator's edit was not committed
    assert (env.repo / "mine.txt").read_text() == "the operator's unsaved edit\n"


def test_a_committed_claude_link_is_never_written_through(env: Env, cli) -> None:
    """The repository commits ``.claude`` as a link that, from evolve's worktree, points outside the repo."""
    outside = env.root / "outside"
    outside.mkdir()
    (env.repo / ".claude").symlink_to("../../../../outside")  # from .agents/evolve/worktree: env.root/outside
    git(env.repo, "add", ".claude")
    git(env.repo, "commit", "-q", "-m", "a committed .claude link")
    (env.repo / ".claude").unlink()  # the operator's own checkout has a real .claude with local settings
    (env.repo / ".claude").mkdir()
    (env.repo / ".claude" / "settings.local.json").write_text("{}\n")
    env.queue(entry("x"))
    env.steps([improved_step(path="x.txt", content="x\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert list(outside.iterdir()) == []  # nothing written where the link points
    assert "workspace.link_not_followed" in r.names()


# -- a tracked .agents/ -----------------------------------------------------------------------------------


def tracked_agents_repo(env: Env) -> None:
    """An agentops-style repository: the queue and the learnings are committed, evolve's state ignored."""
    (env.repo / ".agents" / ".gitignore").unlink()
    (env.repo / ".gitignore").write_text(".agents/evolve/\n")
    (env.repo / ".agents" / "learnings").mkdir(parents=True)
    (env.repo / ".agents" / "learnings" / "l1.md").write_text("first learning\n")
    env.queue(entry("work"))
    git(env.repo, "add", ".gitignore", ".agents")
    git(env.repo, "commit", "-q", "-m", "agentops: queue and learnings are tracked")


def test_a_tracked_agents_dir_gets_the_agent_s_follow_ups_and_learnings(env: Env, cli) -> None:
    tracked_agents_repo(env)
    follow_up = orjson.dumps({"source_epic": "agent", "timestamp": "2026-12-01T00:00:00Z", "consumed": True,
                              "items": [{"title": "a follow-up the agent found", "claim_status": "consumed",
                                         "consumed": True, "type": "bug"}]}).decode()
    env.steps([{"write": [{"path": "code.txt", "content": "code\n"},
                          {"path": ".agents/rpi/next-work.jsonl", "content": follow_up + "\n", "append": True},
                          {"path": ".agents/learnings/new.md", "content": "what the agent learned\n"},
                          {"path": ".agents/learnings/l1.md", "content": "first learning, refined\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved" and (env.repo / "code.txt").read_text() == "code\n"
    learn = env.repo / ".agents" / "learnings"
    assert (learn / "new.md").read_text() == "what the agent learned\n"
    assert (learn / "l1.md").read_text() == "first learning, refined\n"
    items = [i for e in live(env.paths.nextwork) for i in e["items"]]
    found = [i for i in items if i["title"] == "a follow-up the agent found"]
    assert len(found) == 1 and found[0].get("consumed") is not True  # queued as work, never as done
    assert found[0].get("claim_status") in (None, "available")
    # evolve committed none of it: .agents/ stays the operator's to commit.
    assert ".agents" not in git(env.repo, "show", "--name-only", "--format=", "HEAD")


def test_a_learning_the_operator_changed_meanwhile_is_not_overwritten(env: Env) -> None:
    tracked_agents_repo(env)
    learn = env.repo / ".agents" / "learnings"

    def operator_edit() -> None:
        (learn / "l1.md").write_text("the operator's own edit\n")

    code, err = run_with_operator(env, operator_edit, steps=[
        {"write": [{"path": "agent.txt", "content": "agent\n"},
                   {"path": ".agents/learnings/l1.md", "content": "the agent's version\n"}],
         "wait_for": str(env.root / "go"), "report": {"result": "improved"}}])
    assert code == 0, err
    assert (learn / "l1.md").read_text() == "the operator's own edit\n"
    cycle = env.ledger()[-1]["cycle"]
    assert (learn / f"l1.md.evolve-{cycle}").read_text() == "the agent's version\n"


def test_a_worktree_an_older_evolve_made_at_the_default_path_is_adopted(env: Env, cli) -> None:
    tree = env.paths.evolve_dir / "worktree"
    tree.parent.mkdir(parents=True, exist_ok=True)
    git(env.repo, "worktree", "add", "-q", "--detach", str(tree))  # as evolve did before it marked its own
    env.queue(entry("x"))
    env.steps([improved_step(path="x.txt", content="x\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved" and (env.repo / "x.txt").exists()


def test_a_learning_the_agent_wrote_does_not_stop_a_replay_onto_the_operator_s_commit(env: Env) -> None:
    # Found trying a real project: the agent's .agents/ writes (carried by the door, left out of its
    # commits) stayed dirty in the worktree, and the replay's rebase refused to start: land_conflict.
    tracked_agents_repo(env)

    def operator_commit() -> None:
        commit_file(env.repo, "OPNOTES.md", "the operator's notes\n", "operator: notes")

    code, err = run_with_operator(env, operator_commit, steps=[
        {"write": [{"path": "agent.txt", "content": "agent\n"},
                   {"path": ".agents/learnings/l1.md", "content": "refined\n", "append": True}],
         "wait_for": str(env.root / "go"), "report": {"result": "improved"}}])
    assert code == 0, err
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["sha"] == head(env.repo), e
    assert git(env.repo, "show", "main:agent.txt") == "agent\n"
    assert git(env.repo, "log", "-1", "--format=%s", "main~1").strip() == "operator: notes"
    assert (env.repo / ".agents" / "learnings" / "l1.md").read_text() == "first learning\nrefined\n"
    assert not (env.repo / ".git" / "index.lock").exists()
