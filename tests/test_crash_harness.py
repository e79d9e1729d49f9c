"""Crash consistency: fires SIGKILLed at random moments (and agents killed under them), then one
recovery fire; the on-disk state must always be whole (issue: "Proof"). CI runs a reduced form;
``pytest -m slow`` runs at least 300 kills.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import orjson
import pytest
from support import Env, entry

from evolve.agent.process import group_alive

ITEMS = 60


def _start(env: Env) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env())


def _agent_pgid(env: Env) -> int | None:
    try:
        return (orjson.loads(env.paths.state.read_bytes()).get("fire") or {}).get("agent_pgid")
    except (OSError, orjson.JSONDecodeError):
        return None


def _check(env: Env, stats: dict[str, int]) -> None:
    raw = env.paths.ledger.read_bytes() if env.paths.ledger.exists() else b""
    assert raw == b"" or raw.endswith(b"\n"), "a torn tail survived the recovery fire"
    cycles = [orjson.loads(line)["cycle"] for line in raw.splitlines()]  # every line parses
    assert cycles == sorted(set(cycles)), "cycle numbers must strictly increase"
    state = orjson.loads(env.paths.state.read_bytes())
    assert state["fire"] is None and state["claimed_work"] is None
    items = [i for line in env.paths.nextwork.read_bytes().splitlines() for i in orjson.loads(line)["items"]]
    assert len(items) == ITEMS, "no queue item may be lost"
    assert not [i for i in items if i.get("claim_status") == "in_progress"], "claims left in progress"
    for call in env.calls():
        assert not group_alive(call["pgid"]), "an orphaned agent survived"
    stats["torn_moved"] = len(list(env.paths.evolve_dir.glob("cycle-history.jsonl.torn-*")))
    stats["crashed_entries"] = sum(1 for line in raw.splitlines() if b'"result":"crashed"' in line)
    stats["cycles"] = len(cycles)


def run_harness(env: Env, kills: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    env.write_config(fire={"max_cycles": 1000}, breaker={"max_consecutive_failures": 1000},
                     work={"max_attempts": 1000}, agent={"idle_timeout_s": 20, "timeout_s": 30})
    env.queue(entry(*[f"item-{n}" for n in range(ITEMS)]))
    # Short agent runs that write, sometimes commit, and leave a child behind: kills land everywhere.
    env.steps([
        {"write": [{"path": "src/a.txt", "content": "a {cycle}\n", "append": True}], "sleep": 0.05,
         "report": {"result": "improved"}},
        {"write": [{"path": "src/b.txt", "content": "b {cycle}\n", "append": True}], "commit": True,
         "report": {"result": "improved"}},
        {"spawn_sleeper": 30, "sleep": 0.1, "report": {"result": "unchanged"}},
        {"report": {"result": "scout", "disposition": "context-too-heavy"}},
    ])
    stats = {"kills": 0, "agent_kills": 0}
    for _ in range(kills):
        fire = _start(env)
        time.sleep(rng.uniform(0.05, 0.6))
        if rng.random() < 0.25 and (pgid := _agent_pgid(env)):
            try:
                os.killpg(pgid, signal.SIGKILL)
                stats["agent_kills"] += 1
            except ProcessLookupError:
                pass
            time.sleep(rng.uniform(0.0, 0.2))
        fire.send_signal(signal.SIGKILL)
        fire.wait(timeout=30)
        stats["kills"] += 1
        # The step script cycles by position; keep it cycling whatever was interrupted.
        recovery = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                                  capture_output=True, env=env.env(), timeout=120)
        assert recovery.returncode in (0, 75), recovery.stderr
        if env.paths.handoff.exists():
            env.paths.handoff.unlink()
        _check(env, stats)
    return stats


def test_crash_consistency_reduced(env: Env) -> None:
    stats = run_harness(env, kills=int(os.environ.get("EVOLVE_CRASH_KILLS", "40")), seed=7)
    print(f"crash harness: {stats}")
    assert stats["kills"] >= 40 and stats["cycles"] > 0


@pytest.mark.slow
def test_crash_consistency_full(env: Env) -> None:
    stats = run_harness(env, kills=300, seed=11)
    print(f"crash harness (full): {stats}")
    assert stats["kills"] == 300
