"""GOALS as a work source end to end: measuring, snapshots, directives, quarantine, dormancy."""

from __future__ import annotations

import orjson
from support import Env, entry, git, improved_step, results

GOALS_YAML = """\
version: 3
mission: keep the demo healthy
goals:
  - id: fixed-file
    description: the fixed file exists
    check: "echo run >> {counter}; test -f fixed.txt"
    weight: 5
  - id: heavy-goal
    description: the heavy file exists
    check: "test -f heavy.txt"
    weight: 9
  - id: always-green
    description: passes
    check: "true"
    weight: 3
"""


def _goals(env: Env, text: str = GOALS_YAML, name: str = "GOALS.yaml") -> None:
    (env.repo / name).write_text(text.format(counter=env.root / "counter"))
    git(env.repo, "add", name)
    git(env.repo, "commit", "-q", "-m", "goals")


def test_failing_goals_are_worked_by_weight_and_snapshots_kept(env: Env, cli) -> None:
    _goals(env)
    env.steps([improved_step(path="heavy.txt"), improved_step(path="fixed.txt")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["selected_source"], e["work_ref"], e["result"]) == ("goal", "goal:heavy-goal", "improved")
    assert e["mode"] == "goal:heavy-goal"
    # Measured after the cycle: the latest snapshot (for the new HEAD) and the post one agree.
    snap = orjson.loads((env.paths.evolve_dir / "fitness-latest.json").read_bytes())
    assert {g["goal_id"]: g["result"] for g in snap["goals"]} == {
        "fixed-file": "fail", "heavy-goal": "pass", "always-green": "pass"}
    assert snap == orjson.loads((env.paths.evolve_dir / "fitness-latest-post.json").read_bytes())
    assert snap["git_sha"] == git(env.repo, "rev-parse", "HEAD").strip() and snap["goals_era"]
    assert (e["goals_passing"], e["goals_total"], e["gate"]) == (2, 3, "PASS")
    baselines = list((env.paths.evolve_dir / "fitness-baselines").glob("goals-*/*.json"))
    assert len(baselines) == 1
    assert "test -f heavy.txt" in env.calls()[0]["prompt"]
    # One measurement to select and one after the cycle; the next selection reuses the post one.
    assert len((env.root / "counter").read_text().splitlines()) == 2
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["work_ref"] == "goal:fixed-file"
    assert env.ledger()[-1]["goals_passing"] == 3
    assert len((env.root / "counter").read_text().splitlines()) == 3
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["target"] == "idle"
    assert len(list((env.paths.evolve_dir / "fitness-baselines").glob("goals-*/*.json"))) == 1


def test_snapshot_reused_while_head_is_unchanged(env: Env, cli) -> None:
    _goals(env)
    env.steps([{"report": {"result": "scout", "disposition": "defer:later"}}])
    cli("fire", "--cycles", "1")
    runs = len((env.root / "counter").read_text().splitlines())
    cli("fire", "--dry-run")
    assert len((env.root / "counter").read_text().splitlines()) == runs


def test_goal_measurement_timeout_keeps_the_last_snapshot_and_is_not_empty(env: Env, cli) -> None:
    _goals(env)
    env.steps([{"report": {"result": "scout", "disposition": "defer:later"}}])
    cli("fire", "--cycles", "1")
    snap_path = env.paths.evolve_dir / "fitness-latest.json"
    before = snap_path.read_bytes()
    hang = GOALS_YAML + "  - id: hangs\n    description: never ends\n    check: \"sleep 300\"\n    weight: 1\n"
    _goals(env, hang)
    env.write_config(work={"goals_timeout_s": 1, "goal_timeout_s": 30})
    for _ in range(3):
        r = cli("fire", timeout=120)
        assert r.code == 0
        assert any(e["event"] == "source.probe_error" and e["source"] == "goals" for e in r.events())
    assert snap_path.read_bytes() == before
    assert not env.paths.dormant.exists()


def test_beads_only_skips_goals(env: Env, cli) -> None:
    _goals(env)
    env.write_config(work={"beads_only": True})
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["target"] == "idle"
    assert not (env.root / "counter").exists()


GOALS_MD = """\
# Mission

Keep it small.

## Directives

### 1. Write the manual
Explain every command.
**Steer:** increase
**Directive ID:** manual

### 2. Hold the line
**Steer:** hold

## Gates

| ID | Check | Weight | Description | Tags |
|----|-------|--------|-------------|------|
| manual-exists | `test -f MANUAL.md` | 4 | the manual exists | docs |
"""


def test_directive_gap_first_then_failing_goal(env: Env, cli) -> None:
    _goals(env, GOALS_MD, "GOALS.md")
    env.steps([improved_step(path="notes.md"), improved_step(path="MANUAL.md")])
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert (e["selected_source"], e["work_ref"]) == ("directive", "directive:manual")
    assert "landed_directives" in env.state() and env.state()["landed_directives"][0].endswith("|directive:manual")
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert (e["selected_source"], e["work_ref"]) == ("goal", "goal:manual-exists")
    cli("fire", "--cycles", "1")
    assert env.ledger()[-1]["target"] == "idle"  # "hold" directives are not gaps


def test_oscillating_goal_is_quarantined_once_and_skipped(env: Env, cli) -> None:
    _goals(env)
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(3):
        rows.append({"cycle": 2 * i + 1, "result": "improved", "work_ref": "goal:heavy-goal", "mode": f"m{i}"})
        rows.append({"cycle": 2 * i + 2, "result": "regressed", "work_ref": "goal:heavy-goal", "mode": f"n{i}"})
    env.paths.ledger.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    q = [e for e in ledger if e["result"] == "quarantined"]
    assert len(q) == 1 and q[0]["work_ref"] == "goal:heavy-goal" and q[0]["oscillations"] == 3
    assert ledger[-1]["work_ref"] == "goal:fixed-file"
    cli("fire", "--cycles", "1")
    assert len([e for e in env.ledger() if e["result"] == "quarantined"]) == 1


def test_failing_goal_in_the_snapshot_clears_dormant(env: Env, cli) -> None:
    _goals(env)
    env.steps([{"report": {"result": "scout", "disposition": "defer:later"}}])
    cli("fire", "--cycles", "1")  # measures and writes the snapshot
    env.paths.dormant.write_text("cycle 9\n")
    env.steps([improved_step(path="heavy.txt")])
    r = cli("fire", "--cycles", "1")
    assert "dormant.cleared" in r.names()
    assert results(env.ledger())[-1] == "improved"


def test_harvested_outranks_goals(env: Env, cli) -> None:
    _goals(env)
    env.queue(entry("queue first"))
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert e["title"] == "queue first"
    # Goals are still measured before and after the cycle: the regression gate needs both.
    assert len((env.root / "counter").read_text().splitlines()) == 2
    assert (e["goals_passing"], e["goals_total"]) == (1, 3)
