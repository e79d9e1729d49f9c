"""The regression gate, git discipline, the attempt budget, the breaker and the fire budgets (docs/DESIGN.md §8)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from support import Env, entry, git, improved_step, live, results

from evolve import log
from evolve.cycle.fire import Fire, FireOptions

APP = "def add(a, b):\n    return a + b\n"
TESTS = "from app import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
# -B: the gate runs with an allow-listed env (no PYTHONDONTWRITEBYTECODE), and .pyc files would be committed.
PYTEST = [sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_app.py"]


def project(env: Env) -> str:
    """A real project with a real test suite as the gate; returns the starting HEAD."""
    (env.repo / "app.py").write_text(APP)
    (env.repo / "test_app.py").write_text(TESTS)
    git(env.repo, "add", "app.py", "test_app.py")
    git(env.repo, "commit", "-q", "-m", "app")
    env.write_config(gate={"commands": [PYTEST], "timeout_s": 60})
    return git(env.repo, "rev-parse", "HEAD").strip()


def test_agent_that_breaks_a_test_is_reverted_and_operator_edits_survive(env: Env, cli) -> None:
    start = project(env)
    (env.repo / "README.md").write_text("# operator's unsaved edit\n")
    env.queue(entry("speed up add"))
    env.steps([{"write": [{"path": "app.py", "content": "def add(a, b):\n    return a - b\n"},
                          {"path": "new_module.py", "content": "x = 1\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["gate"]) == ("regressed", "FAIL") and "exit 1" in e["gate_detail"]
    assert "gate.fail" in r.names()
    assert git(env.repo, "rev-parse", "HEAD").strip() == start
    assert (env.repo / "app.py").read_text() == APP and not (env.repo / "new_module.py").exists()
    assert (env.repo / "README.md").read_text() == "# operator's unsaved edit\n"
    item = live(env.paths.nextwork)[0]["items"][0]
    assert item["claim_status"] == "available"


@pytest.mark.parametrize("isolation", ["worktree", "none"])
def test_agent_commits_that_break_the_gate_are_reverted(env: Env, cli, isolation: str) -> None:
    start = project(env)
    env.write_config(git={"isolation": isolation})
    env.queue(entry("x"))
    env.steps([{"write": [{"path": "app.py", "content": "def add(a, b):\n    return 0\n"}], "commit": True,
                "report": {"result": "improved"}}])
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["result"] == "regressed"
    assert (env.repo / "app.py").read_text() == APP
    subjects = git(env.repo, "log", "--format=%s", "-3").splitlines()
    if isolation == "none":  # in the operator's checkout the agent's own commit is reverted by a commit
        assert subjects[0].startswith("Revert") and subjects[1].startswith("agent: cycle 1")
    else:  # in the worktree it never reaches the branch at all, and the worktree is back at the start
        assert git(env.repo, "rev-parse", "HEAD").strip() == start and subjects[0] == "app"
        assert git(env.tree, "rev-parse", "HEAD").strip() == start
        assert git(env.tree, "status", "--porcelain").strip() == ""


def test_improvement_is_one_commit_with_the_message_format(env: Env, cli) -> None:
    start = project(env)
    env.queue(entry("add docs"))
    env.steps([improved_step(path="docs/add.md", content="add(a, b)\n")])
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert (e["result"], e["gate"]) == ("improved", "PASS")
    assert git(env.repo, "rev-list", "--count", f"{start}..HEAD").strip() == "1"
    assert git(env.repo, "log", "-1", "--format=%s").strip() == "evolve: cycle 1 -- add docs improved"
    assert e["sha"] == git(env.repo, "rev-parse", "HEAD").strip()
    assert git(env.repo, "show", "--name-only", "--format=", "HEAD").split() == ["docs/add.md"]


def test_agent_that_commits_itself_and_leaves_more_uncommitted(env: Env, cli) -> None:
    start = project(env)
    env.queue(entry("both"))
    env.steps([{"write": [{"path": "a.txt", "content": "a\n"}], "commit": True,
                "report": {"result": "improved"}},
               {"write": [{"path": "b.txt", "content": "b\n"}], "report": {"result": "improved"}}])
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["result"] == "improved"
    assert git(env.repo, "rev-list", "--count", f"{start}..HEAD").strip() == "1"
    cli("fire", "--cycles", "1")  # queue empty: idle; the working tree is clean
    assert git(env.repo, "status", "--porcelain").strip() == ""


def test_only_agents_dir_edits_are_downgraded_to_unchanged(env: Env, cli) -> None:
    start = project(env)
    env.queue(entry("notes"))
    env.steps([improved_step(path=".agents/notes.md"), improved_step(path="GOALS.md", content="# goals\n")])
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert (e["result"], e["downgraded_from"]) == ("unchanged", "improved")
    assert git(env.repo, "rev-parse", "HEAD").strip() == start


def test_structural_marker_overrides_a_zero_exit_and_hung_gates_are_killed(env: Env, cli) -> None:
    env.write_config(gate={"commands": [[sys.executable, "-c", "print('Pass 2: BLOCKED by lint')"]]})
    env.queue(entry("a", "b", type="bug"))  # bugs: still eligible in the restorative fire that follows
    env.steps([improved_step()])
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["gate_detail"].endswith("structural FAILED/BLOCKED marker")
    pidfile = env.root / "gate.pid"
    hang = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    env.write_config(gate={"commands": [[sys.executable, "-c", hang]], "timeout_s": 1})
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert e["result"] == "regressed" and "timed out" in e["gate_detail"]

    pid = int(pidfile.read_text())
    try:
        # A zombie is dead: under the sandbox the command's parent is bwrap, killed with it, so init reaps it.
        stat = Path(f"/proc/{pid}/stat").read_text()
        alive = stat[stat.rfind(")") + 2] not in "ZX"
    except OSError:
        alive = False
    assert not alive


def test_three_failures_park_the_item_and_the_loop_moves_on(env: Env, cli) -> None:
    env.write_config(breaker={"max_consecutive_failures": 10})
    # "fine" failed once before, like "cursed" after its first failure (a fresh item would go first: the
    # freshness rank, docs/DESIGN.md §6.1), and is process work, so the retried "cursed" stays ahead of it.
    env.queue(entry("cursed"), entry("fine", epic="e2", type="docs", failed_at="2026-01-01T00:00:00Z"))
    env.steps([{"exit": 1}, {"exit": 1}, {"exit": 1}, improved_step()])
    cli("fire", "--cycles", "4")
    assert results(env.ledger()) == ["failed", "failed", "failed", "improved"]
    assert [e["title"] for e in env.ledger()] == ["cursed"] * 3 + ["fine"]
    cursed = live(env.paths.nextwork)[0]["items"][0]
    assert cursed["status"] == "blocked" and cursed["failed_at"] and "3 failed attempts" in cursed["blocked_note"]
    assert env.state()["attempts"] == {}


def test_handoffs_and_limits_are_not_attempts(env: Env, cli) -> None:
    env.write_config(context={"streak_limit": 5})
    env.queue(entry("big"))
    env.steps([{"report": {"result": "failed", "context_overflow": True, "error_class": "transient"}}] * 3
              + [{"report": {"result": "failed", "error_class": "limit", "error": "x (retry_after=9999s)"}}])
    for _ in range(4):
        cli("fire", "--cycles", "1")
    item = live(env.paths.nextwork)[0]["items"][0]
    assert item.get("status") != "blocked"


def _fire(env: Env, now: float, **opts) -> object:
    with open(env.root / "log.jsonl", "ab") as fh:
        log.configure(json=True, stream=fh)
        return Fire(env.paths, env.cfg(), FireOptions(**opts), env=env.env(), clock=lambda: now).run()


def test_breaker_opens_halts_and_heals_after_the_cooldown(env: Env) -> None:
    env.write_config(breaker={"max_consecutive_failures": 3, "cooldown_minutes": 30})
    env.queue(entry("a", "b", "c", "d", "e"))
    env.steps([{"exit": 1}, {"exit": 1}, {"exit": 1}, improved_step()])
    t0 = 1_900_000_000.0
    out = _fire(env, t0)
    assert out.reason == "breaker_open" and results(env.ledger()) == ["failed"] * 3
    assert _fire(env, t0 + 29 * 60).halt == "breaker_open"  # still cooling down
    out = _fire(env, t0 + 31 * 60, cycles=1)  # half-open: one probe cycle, success closes it
    assert out.halt is None and env.ledger()[-1]["result"] == "improved"
    st = env.state()
    assert st["breaker_open_until"] is None and st["consecutive_failures"] == 0


def test_breaker_probe_failure_reopens_at_once(env: Env) -> None:
    env.write_config(breaker={"max_consecutive_failures": 2, "cooldown_minutes": 10})
    env.queue(entry("a", "b", "c", "d"))
    env.steps([{"exit": 1}])
    t0 = 1_900_000_000.0
    _fire(env, t0)
    out = _fire(env, t0 + 11 * 60)
    assert out.reason == "breaker_open" and len(env.ledger()) == 3


def test_usd_budget_stops_the_fire_after_the_cycle_that_crossed_it(env: Env, cli) -> None:
    env.write_config(fire={"max_cost_usd": 1.0, "max_cycles": 10})
    env.queue(entry("a", "b", "c", "d"))
    env.steps([improved_step(cost_usd=0.6)])
    r = cli("fire")
    assert len(env.ledger()) == 2
    end = next(e for e in r.events() if e["event"] == "fire.end")
    assert end["reason"] == "max_cost_usd" and end["cost_usd"] == 1.2


def _budget_fire(env: Env, wall, mono) -> object:
    with open(env.root / "log.jsonl", "ab") as fh:
        log.configure(json=True, stream=fh)
        return Fire(env.paths, env.cfg(), FireOptions(), env=env.env(), clock=wall, mono=mono).run()


def test_time_budget(env: Env) -> None:
    env.write_config(fire={"max_minutes": 1, "max_cycles": 10})
    env.queue(entry("a", "b", "c"))
    # Each logged cycle "takes" 40 seconds of an injected monotonic clock: the second one crosses the minute.
    out = _budget_fire(env, time.time, lambda: 40.0 * len(env.ledger()))
    assert out.reason == "max_minutes" and len(env.ledger()) == 2


def test_a_forward_clock_step_does_not_end_the_fire(env: Env) -> None:
    env.write_config(fire={"max_minutes": 1, "max_cycles": 3})
    env.queue(entry("a", "b", "c", "d"))
    t0 = 1_900_000_000.0
    # The wall clock jumps 2 h forward after the first cycle; the monotonic one barely moves.
    out = _budget_fire(env, lambda: t0 + (7200.0 if env.ledger() else 0.0), lambda: 1.0 * len(env.ledger()))
    assert out.reason == "max_cycles" and len(env.ledger()) == 3


def test_a_backward_clock_step_does_not_extend_the_fire(env: Env) -> None:
    env.write_config(fire={"max_minutes": 1, "max_cycles": 10})
    env.queue(entry("a", "b", "c", "d"))
    t0 = 1_900_000_000.0
    # 40 s of monotonic time per cycle while the wall clock goes back an hour after each.
    out = _budget_fire(env, lambda: t0 - 3600.0 * len(env.ledger()), lambda: 40.0 * len(env.ledger()))
    assert out.reason == "max_minutes" and len(env.ledger()) == 2


GOALS = """version: 3
goals:
  - id: adds
    description: add works
    check: "python3 -c 'import app; assert app.add(2, 3) == 5'"
    weight: 5
  - id: docs
    description: docs exist
    check: "test -f docs.md"
    weight: 2
"""


def test_a_goal_that_stops_passing_reverts_the_cycle(env: Env, cli) -> None:
    start = project(env)
    env.write_config(gate={"commands": []})
    (env.repo / "GOALS.yaml").write_text(GOALS)
    git(env.repo, "add", "GOALS.yaml")
    git(env.repo, "commit", "-q", "-m", "goals")
    start = git(env.repo, "rev-parse", "HEAD").strip()
    env.queue(entry("refactor add"))
    env.steps([{"write": [{"path": "app.py", "content": "def add(a, b):\n    return a * b * 1\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert (e["result"], e["gate"], e["goals_regressed"]) == ("regressed", "FAIL", ["adds"])
    assert (e["goals_passing"], e["goals_total"]) == (1, 2)  # the measurement that stands after the revert
    assert (env.repo / "app.py").read_text() == APP
    assert git(env.repo, "diff", start, "HEAD", "--stat").strip() == ""
    # The next fire is restorative, not halted: the reverted drop is not a goal regression.
    env.steps([improved_step(path="docs.md")])
    r = cli("fire", "--cycles", "1")
    assert "halt" not in r.names() and "restorative" in r.names()
