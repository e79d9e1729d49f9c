"""The agent's own worktree (issue 15 item 2, docs/DESIGN.md §8.3): no stranded work, no misattribution.

Every test works on real git repositories and real fires; each asserts the git state: the operator's
commits stay on the branch, their edits and new files stay byte-identical and uncommitted, evolve's
commits hold only the agent's paths, and a dead cycle's work is kept under a ref, never lost.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
from support import Env, entry, git, improved_step, live, results

from evolve.procgroup import group_alive


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def evolve_commits(env: Env, since: str) -> list[str]:
    return [s for s in git(env.repo, "log", "--format=%H %s", f"{since}..HEAD").splitlines() if " evolve: " in s]


def files_of(env: Env, sha: str) -> set[str]:
    return set(git(env.repo, "show", "--name-only", "--format=", sha).split())


def wait_until(pred, what: str, timeout: float = 120.0) -> None:
    """A hang guard only: the condition is an event, never a speed."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_green_cycle_lands_in_a_clean_checkout_and_the_agent_never_touches_it(env: Env, cli) -> None:
    start = head(env.repo)
    env.queue(entry("add docs"))
    env.steps([improved_step(path="docs/a.md", content="a\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["sha"] == head(env.repo) and e["landed"] is True
    assert (env.repo / "docs" / "a.md").read_text() == "a\n"
    assert git(env.repo, "status", "--porcelain").strip() == ""  # fast-forwarded: nothing staged or left over
    assert env.calls()[0]["cwd"] == str(env.tree)  # the agent ran in evolve's worktree
    assert head(env.tree) == head(env.repo) and git(env.tree, "status", "--porcelain").strip() == ""
    assert len(evolve_commits(env, start)) == 1


def test_operator_edits_and_commits_during_a_cycle_are_never_reverted_or_committed(env: Env, cli) -> None:
    (env.repo / "notes.md").write_text("v1\n")
    git(env.repo, "add", "notes.md")
    git(env.repo, "commit", "-q", "-m", "operator: notes")
    start = head(env.repo)
    (env.repo / "notes.md").write_text("operator's unsaved edit\n")  # dirty before the fire
    go = env.root / "go"
    env.queue(entry("agent work"))
    env.steps([{"write": [{"path": "agent.txt", "content": "agent\n"}], "wait_for": str(go),
                "report": {"result": "improved"}}])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    wait_until(lambda: (env.tree / "agent.txt").exists(), "the agent's change")
    # The operator keeps working in their checkout while the agent runs: a commit and a new file.
    (env.repo / "theirs.py").write_text("x = 1\n")
    git(env.repo, "add", "theirs.py")
    git(env.repo, "commit", "-q", "-m", "operator: theirs")
    operator_commit = head(env.repo)
    (env.repo / "scratch.txt").write_text("untracked, mine\n")
    go.write_text("")
    _out, err = fire.communicate(timeout=300)
    assert fire.returncode == 0, err.decode()[-3000:]
    e = env.ledger()[-1]
    assert e["result"] == "improved", e
    # The branch moved during the cycle: the agent's commit was replayed onto it and landed.
    assert git(env.repo, "merge-base", "--is-ancestor", operator_commit, "HEAD").strip() == ""
    assert e["sha"] == head(env.repo) and files_of(env, e["sha"]) == {"agent.txt"}
    assert (env.repo / "agent.txt").read_text() == "agent\n"
    # Their uncommitted edit and untracked file are exactly as they left them, and still uncommitted.
    assert (env.repo / "notes.md").read_text() == "operator's unsaved edit\n"
    assert (env.repo / "scratch.txt").read_text() == "untracked, mine\n"
    status = git(env.repo, "status", "--porcelain").splitlines()
    assert sorted(status) == [" M notes.md", "?? scratch.txt"], status
    for line in evolve_commits(env, start):
        assert files_of(env, line.split()[0]) == {"agent.txt"}


def test_a_change_in_a_path_the_operator_has_dirty_waits_and_lands_later(env: Env, cli) -> None:
    (env.repo / "shared.txt").write_text("base\n")
    git(env.repo, "add", "shared.txt")
    git(env.repo, "commit", "-q", "-m", "base")
    start = head(env.repo)
    (env.repo / "shared.txt").write_text("operator is editing this\n")
    env.queue(entry("one", "two"))
    env.steps([{"write": [{"path": "shared.txt", "content": "agent\n"}], "report": {"result": "improved"}},
               improved_step(path="other.txt", content="two\n")])
    r = cli("fire", "--cycles", "2")
    assert r.code == 0, r.stderr
    first, second = env.ledger()[-2:]
    assert first["result"] == second["result"] == "pending"  # green and committed, not on the branch yet
    assert first["landed"] is False and first["pending_ref"] == "refs/evolve/pending/main"
    items = live(env.paths.nextwork)[0]["items"]
    assert [i["claim_status"] for i in items] == ["in_progress", "in_progress"]  # held with their commits
    assert head(env.repo) == start  # nothing moved under the operator's edit
    assert (env.repo / "shared.txt").read_text() == "operator is editing this\n"
    # The second cycle built on the first (its base is the waiting commit), and waits with it.
    assert head(env.repo, "refs/evolve/pending/main") == second["sha"]
    assert git(env.repo, "merge-base", "--is-ancestor", first["sha"], second["sha"]).strip() == ""
    s = cli("status")
    assert "refs/evolve/pending/main" in s.stdout and "2 commit" in s.stdout, s.stdout
    # The operator is done: their edit goes; the next fire lands both by fast-forward.
    git(env.repo, "checkout", "-q", "--", "shared.txt")
    env.steps([{"report": {"result": "unchanged"}}])
    env.queue(entry("three"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert head(env.repo) == second["sha"] and (env.repo / "shared.txt").read_text() == "agent\n"
    assert git(env.repo, "for-each-ref", "refs/evolve/pending/").strip() == ""
    assert git(env.repo, "status", "--porcelain").strip() == ""
    # The landing is recorded: each waiting cycle settled as improved with the sha now on the branch.
    landed = [e for e in env.ledger() if e.get("mode") == "land"]
    assert [(e["pending_cycle"], e["result"], e["sha"]) for e in landed] == [
        (first["cycle"], "improved", first["sha"]), (second["cycle"], "improved", second["sha"])]
    assert [i.get("claim_status") for i in live(env.paths.nextwork)[0]["items"]] == ["consumed", "consumed"]


def test_a_change_that_conflicts_with_the_operator_s_commit_is_kept_and_the_item_retried(env: Env, cli) -> None:
    (env.repo / "shared.txt").write_text("base\n")
    git(env.repo, "add", "shared.txt")
    git(env.repo, "commit", "-q", "-m", "base")
    go = env.root / "go"
    env.queue(entry("edit shared"))
    env.steps([{"write": [{"path": "shared.txt", "content": "agent\n"}], "wait_for": str(go),
                "report": {"result": "improved"}}])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    shared = env.tree / "shared.txt"
    wait_until(lambda: shared.exists() and shared.read_text() == "agent\n", "the agent's change")
    (env.repo / "shared.txt").write_text("operator\n")
    git(env.repo, "commit", "-q", "-am", "operator: same line")
    theirs = head(env.repo)
    go.write_text("")
    fire.communicate(timeout=300)
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "land_conflict"), e
    assert head(env.repo) == theirs and (env.repo / "shared.txt").read_text() == "operator\n"
    assert git(env.repo, "show", f"{e['unlanded_ref']}:shared.txt") == "agent\n"  # kept, recoverable
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"  # retried next fire
    assert "edit shared" not in orjson.dumps(env.state().get("attempts", {})).decode()  # not charged
    assert git(env.tree, "status", "--porcelain").strip() == "" and head(env.tree) == theirs
    s = cli("status")
    assert s.code == 1 and e["unlanded_ref"] in s.stdout, s.stdout


def test_a_killed_fire_s_work_is_set_aside_and_the_next_fire_starts_clean(env: Env, cli) -> None:
    start = head(env.repo)
    (env.repo / "mine.txt").write_text("operator's own, untracked\n")
    env.queue(entry("alpha", "beta"))
    env.steps([{"write": [{"path": "half.txt", "content": "partial"}, {"path": "README.md", "content": "x\n"}],
                "hang": True}, improved_step(path="beta.txt", content="beta\n")])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env())
    wait_until(lambda: (env.tree / "half.txt").exists(), "the agent's partial change")
    pgid = env.state()["fire"]["agent_pgid"]
    fire.send_signal(signal.SIGKILL)  # a power cut, an OOM kill, TimeoutStartSec
    fire.wait(timeout=60)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    wait_until(lambda: not group_alive(pgid), "the dead fire's agent gone")
    assert results(env.ledger()) == ["crashed", "improved"]
    ref = git(env.repo, "for-each-ref", "--format=%(refname)", "refs/evolve/stranded/").split()
    assert ref == ["refs/evolve/stranded/1"], ref
    assert git(env.repo, "show", f"{ref[0]}:half.txt") == "partial"  # the dead cycle's work, kept
    assert "workspace.stranded" in r.names()
    # The operator's checkout never saw the dead cycle's edits, and the next cycle's commit holds only its own.
    assert not (env.repo / "half.txt").exists() and (env.repo / "mine.txt").read_text().startswith("operator")
    e = env.ledger()[-1]
    assert files_of(env, e["sha"]) == {"beta.txt"} and git(env.repo, "rev-list", "--count", f"{start}..HEAD") == "1\n"
    assert git(env.repo, "status", "--porcelain").split() == ["??", "mine.txt"]
    s = cli("status")  # a warning, not DEGRADED: the item was released and is retried (issue 22 item 11)
    assert s.code == 0 and "refs/evolve/stranded/1" in s.stdout, s.stdout


def test_what_the_agent_writes_under_agents_reaches_the_repository_s_own(env: Env, cli) -> None:
    env.queue(entry("one"))
    follow_up = orjson.dumps(entry("found while working", epic="agent-follow-up")).decode() + "\n"
    env.steps([{"write": [{"path": ".agents/rpi/next-work.jsonl", "content": follow_up, "append": True},
                          {"path": ".agents/learnings/x.md", "content": "learned\n"},
                          {"path": "done.txt", "content": "1\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    titles = [i["title"] for e in live(env.paths.nextwork) for i in e["items"]]
    assert "found while working" in titles
    assert (env.repo / ".agents" / "learnings" / "x.md").read_text() == "learned\n"
    assert files_of(env, env.ledger()[-1]["sha"]) == {"done.txt"}  # never the links themselves
    assert git(env.tree, "status", "--porcelain").strip() == ""


def test_a_fast_forward_cut_short_is_finished_by_the_next_fire(env: Env, cli) -> None:
    """Death inside git's fast-forward: the files and index at the new commit, the branch still at the old."""
    old = head(env.repo)
    (env.repo / "f.txt").write_text("new\n")
    git(env.repo, "add", "f.txt")
    git(env.repo, "commit", "-q", "-m", "evolve: cycle 1 -- f improved")
    new = head(env.repo)
    git(env.repo, "update-ref", "refs/heads/main", old)  # the ref move never happened
    assert git(env.repo, "status", "--porcelain").strip() == "A  f.txt"  # it would look like the operator's
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    held = {"cycle": 1, "work_ref": "source_epic=e1:item=f", "source": "harvested", "claimed_by": "evolve:cycle-1",
            "title": "f", "sha": new, "commits": 1, "start": old}
    env.paths.landing_intent.write_bytes(orjson.dumps(
        {"kind": "cycle", "branch": "refs/heads/main", "base": old, "new": new, "held": [held],
         "phase": "fast_forward", "old": old, "checkout": str(env.repo)}))
    env.steps([{"report": {"result": "unchanged"}}])
    env.queue(entry("x"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "land.finished_after_crash" in r.names()
    assert head(env.repo) == new and git(env.repo, "status", "--porcelain").strip() == ""
    assert not env.paths.landing_intent.exists()
    # The cycle the dead fire never recorded: improved, with the sha now on the branch; never redone.
    first = env.ledger()[0]
    assert (first["cycle"], first["result"], first["sha"], first["recovered"]) == (1, "improved", new, "landing")


def test_a_detached_head_runs_no_agent_and_touches_nothing(env: Env, cli) -> None:
    git(env.repo, "checkout", "-q", "--detach")
    before = head(env.repo)
    env.queue(entry("a"))
    env.steps([improved_step(path="a.txt", content="a\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and "fire.operator_busy" in r.names(), r.stderr
    assert env.calls() == [] and env.ledger() == []  # no agent, no cycle
    assert head(env.repo) == before and not (env.repo / "a.txt").exists() and not env.tree.exists()
    assert git(env.repo, "status", "--porcelain").strip() == ""


def test_the_morning_report_lists_work_set_aside(env: Env, cli) -> None:
    git(env.repo, "update-ref", "refs/evolve/stranded/7", head(env.repo))
    out = env.root / "report.html"
    r = cli("report", "-o", str(out))
    assert r.code == 0, r.stderr
    html = out.read_text()
    assert "refs/evolve/stranded/7" in html and "a dead cycle&#x27;s work" in html.replace("&#39;", "&#x27;")
