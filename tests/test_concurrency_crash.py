"""Real concurrent processes on one repo, and a fire killed with SIGKILL mid-cycle (docs/DESIGN.md §4.0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
from support import Env, entry, improved_step, live, results

from evolve.procgroup import group_alive


def test_twenty_fires_at_once_one_runs_the_rest_exit_75(env: Env) -> None:
    env.queue(entry(*[f"item-{i}" for i in range(6)]))
    # Each agent run lasts a while so the winner surely holds the lock while the others try.
    env.steps([{**improved_step(), "sleep": 0.4}])
    procs = []
    for _ in range(20):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env(),
        ))
    started = time.monotonic()
    codes = []
    skipped_within = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        codes.append(p.returncode)
        if p.returncode == 75:
            events = [orjson.loads(x) for x in err.splitlines() if x.startswith(b"{")]  # logs: stderr
            assert [e["event"] for e in events] == ["fire.skipped"], (out, err)
            skipped_within.append(time.monotonic() - started)
    assert sorted(codes) == [0] + [75] * 19, codes
    ledger = env.ledger()
    cycles = [e["cycle"] for e in ledger]
    assert cycles == [1, 2, 3], cycles  # no duplicate, no gap
    assert results(ledger) == ["improved"] * 3
    assert len({e["fire_id"] for e in ledger}) == 1
    assert len(env.calls()) == 3
    # The losers gave up immediately (the winner's cycles took well over a second).
    assert max(skipped_within) < 30


def test_wait_flag_waits_for_the_lock(env: Env) -> None:
    env.queue(entry("a", "b"))
    env.steps([{**improved_step(), "sleep": 1.0}])
    first = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    deadline = time.time() + 20
    while not env.calls() and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1",
                             "--wait", "30"], capture_output=True, env=env.env(), timeout=60)
    first.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert [e["cycle"] for e in env.ledger()] == [1, 2]


def _agent_pgid(env: Env) -> int | None:
    try:
        return (env.state().get("fire") or {}).get("agent_pgid")
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def _wait_for(pred, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_sigkilled_fire_is_reconciled_by_the_next(env: Env, cli) -> None:
    # One item: a released claim stamps failed_at, and a fresh item would go first (docs/DESIGN.md §6.1).
    env.queue(entry("alpha"))
    # Step 1 hangs after spawning a child that would outlive it; step 2 improves.
    env.steps([{"spawn_sleeper": 300, "hang": True}, improved_step()])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    _wait_for(lambda: bool(env.calls()))
    _wait_for(lambda: _agent_pgid(env) is not None)
    agent_pgid = env.state()["fire"]["agent_pgid"]
    assert env.calls()[0]["pgid"] == agent_pgid
    # The claim is held while the cycle runs.
    queue = live(env.paths.nextwork)
    assert queue[0]["items"][0]["claim_status"] == "in_progress"
    fire.send_signal(signal.SIGKILL)
    fire.communicate(timeout=30)
    # The orphaned agent group survives its parent's death...
    assert group_alive(agent_pgid)

    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    names = r.names()
    assert "reconcile.kill_orphan" in names and "reconcile.crashed" in names
    # ...until the next fire kills it.
    _wait_for(lambda: not group_alive(agent_pgid), timeout=10)
    ledger = env.ledger()
    assert results(ledger) == ["crashed", "improved"]
    assert ledger[0]["cycle"] == 1 and ledger[0]["error_class"] == "crashed"
    assert ledger[0]["work_ref"] == "source_epic=e1:item=alpha"
    # The claim was released and the next fire took the same item again.
    assert ledger[1]["work_ref"] == "source_epic=e1:item=alpha"
    queue = live(env.paths.nextwork)
    alpha = queue[0]["items"][0]
    assert alpha["claim_status"] == "consumed" and alpha["failed_at"]
    st = env.state()
    assert st["fire"] is None and st["claimed_work"] is None


def test_an_agent_whose_group_was_never_recorded_is_still_reaped(env: Env, cli) -> None:
    """A fire killed between starting its agent and saving the agent's group id: the agent (and a
    child it moved to a session of its own) are found by the dead fire's id in their environment."""
    env.queue(entry("alpha", "beta"))
    env.steps([{"spawn_sleeper": 300, "hang": True}, improved_step()])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    _wait_for(lambda: _agent_pgid(env) is not None and bool(env.calls()))
    call = env.calls()[0]
    fire_id = env.state()["fire"]["fire_id"]
    assert call["env"]["EVOLVE_FIRE_ID"] == fire_id
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                               env={**call["env"]})  # as if the agent had started it with setsid
    fire.send_signal(signal.SIGKILL)
    fire.communicate(timeout=30)
    state = env.state()
    state["fire"]["agent_pgid"] = None  # the save that would have recorded it never happened
    env.paths.state.write_bytes(orjson.dumps(state))
    assert group_alive(call["pgid"]) and group_alive(escaped.pid)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    reaped = sorted(e["pgid"] for e in r.events() if e.get("event") == "reconcile.kill_orphan")
    assert reaped == sorted([call["pgid"], escaped.pid])
    assert {e.get("found_by") for e in r.events() if e.get("event") == "reconcile.kill_orphan"} == {"EVOLVE_FIRE_ID"}
    escaped.wait(timeout=10)
    _wait_for(lambda: not group_alive(call["pgid"]), timeout=10)
    assert results(env.ledger()) == ["crashed", "improved"]


def test_sigterm_records_interrupted_and_exits_143(env: Env) -> None:
    env.queue(entry("alpha"))
    env.steps([{"write": [{"path": "half.txt", "content": "partial"}], "hang": True}])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    _wait_for(lambda: _agent_pgid(env) is not None)
    _wait_for(lambda: (env.tree / "half.txt").exists())
    pgid = env.state()["fire"]["agent_pgid"]
    fire.send_signal(signal.SIGTERM)
    fire.communicate(timeout=60)
    assert fire.returncode == 143
    assert results(env.ledger()) == ["interrupted"]
    assert not group_alive(pgid)
    # The cycle's partial change is undone; the claim is back in the queue.
    assert not (env.tree / "half.txt").exists() and not (env.repo / "half.txt").exists()
    queue = live(env.paths.nextwork)
    assert queue[0]["items"][0]["claim_status"] == "available"
    assert env.state()["fire"] is None


def test_hard_and_idle_timeouts_kill_the_agent_group(env: Env, fire_inproc) -> None:
    env.write_config(agent={"idle_timeout_s": 1, "timeout_s": 30})
    env.queue(entry("a", "b"))
    env.steps([{"spawn_sleeper": 300, "hang": True}, improved_step()])
    fire_inproc(cycles=1)
    e = env.ledger()[-1]
    assert e["result"] == "failed" and e["error_class"] == "timeout" and "idle" in e["error"]
    pgid = env.calls()[0]["pgid"]
    assert not group_alive(pgid)
    env.write_config(agent={"idle_timeout_s": 0, "timeout_s": 1})
    env.steps([{"stdout": "busy", "spawn_sleeper": 300, "sleep": 0.2, "hang": True}])
    fire_inproc(cycles=1)
    e = env.ledger()[-1]
    assert e["result"] == "failed" and e["error_class"] == "timeout" and "hard" in e["error"]
    assert not group_alive(env.calls()[-1]["pgid"])
    assert os.path.exists(env.paths.ledger)


def test_unexpected_error_mid_cycle_is_reconciled_as_a_crash(env: Env, cli) -> None:
    env.write_config(git={"isolation": "none"})  # the agent breaks the operator's own checkout
    env.queue(entry("alpha"))
    head = (env.repo / ".git" / "HEAD").read_bytes()
    # The agent breaks the repository under evolve's feet: git itself now fails.
    env.steps([{"write": [{"path": ".git/HEAD", "content": "garbage\n"}],
                "report": {"result": "improved"}}, improved_step()])
    r = cli("fire")
    assert r.code == 1
    assert len(r.error_lines()) == 1 and "unexpected error" in r.stderr
    assert "fire.error" in r.names()
    assert env.state()["fire"]["cycle"] == 1  # left for the next fire to reconcile
    (env.repo / ".git" / "HEAD").write_bytes(head)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "reconcile.crashed" in r.names()
    assert results(env.ledger()) == ["crashed", "improved"]


def test_heartbeat_while_the_agent_runs(env: Env, cli) -> None:
    env.write_config(agent={"heartbeat_s": 0.2})
    env.queue(entry("a"))
    env.steps([{**improved_step(), "sleep": 1.0}])
    r = cli("fire", "--cycles", "1")
    beats = [e for e in r.events() if e["event"] == "agent.heartbeat"]
    assert len(beats) >= 3
    assert all(b["cycle"] == 1 for b in beats)
    assert beats[-1]["elapsed_s"] > beats[0]["elapsed_s"]
