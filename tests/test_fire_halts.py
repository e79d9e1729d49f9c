"""Step 1 end to end through the real CLI: every halt exits 0, writes no cycle and re-arms nothing."""

from __future__ import annotations

import os
import sys
import time

import orjson
import pytest
from support import Env, entry, improved_step, results


def _age(path, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(path, (t, t))


def _mk(path, text: str = "operator says stop\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("which", ["global_kill", "kill", "stop"])
def test_fresh_operator_markers_halt_with_exit_0(env: Env, cli, which: str) -> None:
    env.queue(entry("a"))
    marker = getattr(env.paths, which)
    _mk(marker)
    _mk(env.paths.handoff, "h\n")
    r = cli("fire")
    assert r.code == 0
    halt = next(e for e in r.events() if e["event"] == "halt")
    assert halt["reason"] == ("user_halt" if which == "stop" else "kill")
    assert marker.exists()  # operator markers are never cleared by the loop
    assert env.paths.handoff.exists()  # HANDOFF is only cleared past KILL/STOP/DORMANT
    assert env.ledger() == [] and env.calls() == []


def test_kill_beats_stop(env: Env, cli) -> None:
    _mk(env.paths.kill)
    _mk(env.paths.stop)
    r = cli("fire")
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["kill"]


def test_stale_markers_are_ignored_loudly_and_kept(env: Env, cli) -> None:
    env.queue(entry("a"))
    for m in (env.paths.kill, env.paths.stop, env.paths.global_kill):
        _mk(m)
        _age(m, 7.01)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0
    warnings = [e for e in r.events() if e["event"] == "halt.warning"]
    assert len(warnings) == 3 and all("stale" in w["detail"] for w in warnings)
    assert all(m.exists() for m in (env.paths.kill, env.paths.stop, env.paths.global_kill))
    assert results(env.ledger()) == ["improved"]


def test_kill_ttl_from_env(env: Env, cli) -> None:
    _mk(env.paths.stop)
    _age(env.paths.stop, 2)
    env.queue(entry("a"))
    assert "halt" in cli("fire", "--cycles", "1").names()
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_KILL_TTL_DAYS": "1"})
    assert "halt" not in r.names() and results(env.ledger()) == ["improved"]


def test_dormant_halts_without_work_and_clears_with_work(env: Env, cli) -> None:
    _mk(env.paths.dormant, "cycle 3\n2026-01-01T00:00:00Z\nstagnation\n")
    r = cli("fire")
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["dormant"]
    assert env.paths.dormant.exists()
    env.queue(entry("new work"))
    r = cli("fire", "--cycles", "1")
    assert "dormant.cleared" in r.names() and not env.paths.dormant.exists()
    assert results(env.ledger()) == ["improved"]


def test_dormant_with_probe_error_fails_open(env: Env, cli) -> None:
    _mk(env.paths.dormant)
    env.paths.nextwork.mkdir(parents=True)  # a directory where the queue file should be: unreadable
    r = cli("fire", "--cycles", "1")
    assert r.code == 0
    assert "halt" not in r.names()
    assert "source.probe_error" in r.names()


def test_governor_exit_3_halts_other_codes_warn(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    gov = [sys.executable, "-c", "import sys; sys.exit(3)"]
    r = cli("fire", extra_env={"EVOLVE_GOVERNOR_CMD": orjson.dumps(gov).decode()})
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["governor_budget_burned"]
    gov = [sys.executable, "-c", "import sys; sys.exit(1)"]
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_GOVERNOR_CMD": orjson.dumps(gov).decode()})
    assert "halt" not in r.names()
    assert any("governor exited 1" in e.get("detail", "") for e in r.events())
    assert results(env.ledger()) == ["improved"]


def test_governor_not_run_when_kill_present(env: Env, cli) -> None:
    flag = env.root / "governor-ran"
    gov = [sys.executable, "-c", f"open({str(flag)!r}, 'w').close()"]
    _mk(env.paths.kill)
    cli("fire", extra_env={"EVOLVE_GOVERNOR_CMD": orjson.dumps(gov).decode()})
    assert not flag.exists()


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped by init."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "zombie" not in fh.read()
    except FileNotFoundError:
        return False


def test_governor_runs_in_its_own_group_with_the_fire_id_and_is_killed_whole_on_timeout(env: Env, cli) -> None:
    """The governor is a child like the agent: its own process group, the fire's id in its environment,
    and on a timeout the whole group (what it started too) is killed and the fire carries on."""
    env.queue(entry("a"))
    seen = env.root / "governor.json"
    gov = env.root / "gov.py"
    gov.write_text(
        "import json, os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(seen)!r}, 'w').write(json.dumps({{'pid': os.getpid(), 'pgid': os.getpgrp(),\n"
        "    'fire': os.environ.get('EVOLVE_FIRE_ID'), 'child': child.pid}))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    r = cli("fire", "--cycles", "1", extra_env={
        "EVOLVE_GOVERNOR_CMD": orjson.dumps([sys.executable, str(gov)]).decode(), "EVOLVE_HALT_TIMEOUT": "1"})
    assert r.code == 0, r.stderr
    assert time.monotonic() - started < 45  # not the governor's 60 s
    info = orjson.loads(seen.read_bytes())
    assert info["pgid"] == info["pid"] != os.getpgrp()  # it leads a group of its own
    fire_ids = {e.get("fire_id") for e in r.events() if e["event"] == "fire.end"}
    assert info["fire"] and fire_ids == {info["fire"]}
    assert any(e["event"] == "governor.error" and "timed out" in e["error"] for e in r.events())
    for pid in (info["pid"], info["child"]):  # the group went, the child it started included
        deadline = time.monotonic() + 10
        while _running(pid):
            assert time.monotonic() < deadline, f"{pid} outlived the governor's timeout"
            time.sleep(0.05)


def test_breaker_opens_after_three_failures_and_halts(env: Env, cli) -> None:
    env.queue(entry("a", "b", "c", "d"))
    env.steps([{"exit": 1}])
    r = cli("fire")
    assert r.code == 0
    assert results(env.ledger()) == ["failed"] * 3
    assert next(e for e in r.events() if e["event"] == "fire.end")["reason"] == "breaker_open"
    assert env.state()["breaker_open_until"]
    r = cli("fire")
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["breaker_open"]
    # Past the cooldown one probe cycle runs; success closes the breaker.
    st = env.state()
    st["breaker_open_until"] = "2020-01-01T00:00:00Z"
    env.paths.state.write_bytes(orjson.dumps(st))
    env.steps([improved_step()])
    r = cli("fire", "--cycles", "1")
    assert "breaker.half_open" in r.names() and "breaker.closed" in r.names()
    assert env.state()["breaker_open_until"] is None and env.state()["consecutive_failures"] == 0


def _ledger_with(env: Env, *entries: dict) -> None:
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.ledger.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))


def test_goal_regression_halts_until_acknowledged(env: Env, cli) -> None:
    env.queue(entry("a"))
    _ledger_with(env,
                 {"cycle": 1, "result": "improved", "goals_passing": 5, "goals_total": 6},
                 {"cycle": 2, "result": "improved", "goals_passing": 4, "goals_total": 6})
    r = cli("fire")
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["goal_regression"]
    _mk(env.paths.ack_regression, "looked at it\n")
    r = cli("fire", "--cycles", "1")
    assert "regression.acknowledged" in r.names() and not env.paths.ack_regression.exists()
    assert env.ledger()[-1]["result"] == "improved"
    # The acknowledgement sticks: the same drop does not halt the next fire.
    env.queue(entry("b"))
    r = cli("fire", "--cycles", "1")
    assert "halt" not in r.names()


def test_goal_drop_with_different_total_is_not_a_regression(env: Env, cli) -> None:
    env.queue(entry("a"))
    _ledger_with(env,
                 {"cycle": 1, "result": "improved", "goals_passing": 5, "goals_total": 6},
                 {"cycle": 2, "result": "improved", "goals_passing": 1, "goals_total": 1})
    r = cli("fire", "--cycles", "1")
    assert "halt" not in r.names()


def test_restorative_mode_only_takes_red_reducing_work(env: Env, cli) -> None:
    env.queue(entry("feature work", type="feature"), entry("fix the build", epic="e2", type="bug"))
    _ledger_with(env, {"cycle": 1, "result": "regressed", "gate": "FAIL"})
    r = cli("fire", "--cycles", "1")
    assert "restorative" in r.names()
    assert env.ledger()[-1]["title"] == "fix the build"
    assert "restorative" in env.calls()[0]["prompt"]


def test_dry_run_writes_nothing(env: Env, cli) -> None:
    env.queue(entry("alpha"))
    _mk(env.paths.handoff, "x\n")
    _mk(env.paths.dormant, "cycle 1\n")
    before = {p: p.read_bytes() for p in env.repo.rglob("*") if p.is_file() and ".git/" not in str(p)}
    r = cli("fire", "--dry-run")
    assert r.code == 0, r.stderr
    after = {p: p.read_bytes() for p in env.repo.rglob("*") if p.is_file() and ".git/" not in str(p)}
    assert before == after
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    assert plan["step1"]["would_clear_handoff"] is True and plan["step1"]["would_clear_dormant"] is True
    assert plan["selection"]["title"] == "alpha"
    agent = plan["agent"]
    assert agent["mode"] == "first"
    assert agent["argv"][:3] == [sys.executable, "-m", "evolve.agent.scripted"]
    assert agent["env"]["EVOLVE_CYCLE"] == "1" and "alpha" in agent["prompt"]
    assert env.calls() == []
    # Where the agent would work (docs/DESIGN.md §8.3), shown, not made.
    assert plan["workspace"] == {"isolation": "worktree", "tree": str(env.tree), "branch": "refs/heads/main",
                                 "pending_ref": "refs/evolve/pending/main", "waiting": []}
    assert agent["env"]["EVOLVE_REPO"] == str(env.tree) and not env.tree.exists()


def test_observers_hear_halts_and_fire_ends_and_never_break_a_fire(env: Env) -> None:
    from evolve import log
    from evolve.cycle.fire import Fire, FireOptions

    heard: list[tuple[str, dict]] = []

    def boom(event: str, payload: dict) -> None:
        raise RuntimeError("observer bug")

    env.queue(entry("a"))
    with open(env.root / "log.jsonl", "ab") as fh:
        log.configure(json=True, stream=fh)
        Fire(env.paths, env.cfg(), FireOptions(cycles=1), env=env.env(),
             observers=[boom, lambda e, p: heard.append((e, p))]).run()
        _mk(env.paths.stop)
        Fire(env.paths, env.cfg(), FireOptions(), env=env.env(), observers=[lambda e, p: heard.append((e, p))]).run()
    events = [e for e, _ in heard]
    assert events == ["cycle.end", "fire.end", "halt", "fire.end"]
    assert heard[0][1]["entry"]["result"] == "improved" and heard[2][1]["reason"] == "user_halt"
    assert "observer.error" in (env.root / "log.jsonl").read_text()
