"""Crash consistency: fires SIGKILLed at random moments (and agents killed under them), then one
recovery fire; the on-disk state must always be whole (issue: "Proof"). CI runs a reduced form;
``pytest -m slow`` runs at least 300 kills.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from support import Env, entry

from evolve.procgroup import group_alive

BATCH = 20  # items appended whenever fewer than LOW are left to select
LOW = 10
KINDS = ("bug", "feature", "tech-debt", "improvement", "pattern-fix", "task")
TEMP_AGE_S = 120  # how old leftover temp files are made before a recovery fire (its sweep takes > 60 s)

# Where a fire is made to die (evolve/crashpoint.py), and how many occurrences in a fire to pick from:
# half a ledger line written then death, death right after the ledger entry (before the claim is
# finalized), between a state file's temp write and its rename, after the queue's redo journal is
# written and between a moved line's appended copy and its tombstone (claims and finalizes;
# evolve/store/inplace.py), while the agent runs, and as the gate starts.
POINTS = {
    "ledger.torn": 3,
    "ledger.appended": 3,
    "replace:session-state.json": 8,
    "replace:cycle-state.json": 4,
    "queue.journal": 4,
    "queue.replace": 4,
    "agent.running": 3,
    "gate": 3,
}


def _evolve(env: Env, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env(**extra))


def _agent_pgid(env: Env) -> int | None:
    try:
        return (orjson.loads(env.paths.state.read_bytes()).get("fire") or {}).get("agent_pgid")
    except (OSError, orjson.JSONDecodeError):
        return None


def _items(env: Env) -> list[dict]:
    p = env.paths.nextwork
    return [i for line in p.read_bytes().splitlines() for i in orjson.loads(line)["items"]] if p.exists() else []


def _refill(env: Env, added: int) -> int:
    """Keep work available, as a harvester appending to the queue would."""
    open_items = [i for i in _items(env) if not i.get("consumed") and i.get("status") != "blocked"]
    if len(open_items) >= LOW:
        return added
    batch = entry(*[f"item-{added + n}" for n in range(BATCH)], epic=f"batch-{added // BATCH}")
    for n, item in enumerate(batch["items"]):  # mixed kinds of work, or the metronome blocks the repeats
        item["type"] = KINDS[n % len(KINDS)]
    env.queue(batch)
    return added + BATCH


def _temps(env: Env) -> list[Path]:
    return [p for d in (env.paths.evolve_dir, env.paths.nextwork.parent) if d.exists()
            for p in d.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


def _recover(env: Env, stats: Counter[str]) -> None:
    """Time passes (leftover temp files age), then one fire of one cycle; count what it repaired."""
    old = time.time() - TEMP_AGE_S
    for tmp in _temps(env):
        os.utime(tmp, (old, old))
        stats["temps_left_by_kills"] += 1
    recovery = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                              capture_output=True, env=env.env(), timeout=120)
    assert recovery.returncode in (0, 75), recovery.stderr
    for line in recovery.stderr.splitlines():  # the logs
        if line.startswith(b"{"):
            event = orjson.loads(line)
            name = event.get("event")
            if name == "reconcile.claim":
                stats[f"recovery_claim_{event.get('action')}"] += 1
            elif name in ("ledger.torn_line", "reconcile.crashed", "reconcile.kill_orphan", "store.temps_removed"):
                stats[f"recovery_{name.split('.', 1)[1]}"] += 1
    if env.paths.handoff.exists():
        env.paths.handoff.unlink()


def _check(env: Env, added: int) -> None:
    raw = env.paths.ledger.read_bytes() if env.paths.ledger.exists() else b""
    assert raw == b"" or raw.endswith(b"\n"), "a torn tail survived the recovery fire"
    ledger = [orjson.loads(line) for line in raw.splitlines()]  # every line parses
    cycles = [e["cycle"] for e in ledger]
    assert cycles == sorted(set(cycles)), "cycle numbers must strictly increase"
    state = orjson.loads(env.paths.state.read_bytes())
    assert state["fire"] is None and state["claimed_work"] is None
    items = _items(env)
    assert len(items) == added, "no queue item may be lost"
    assert not [i for i in items if i.get("claim_status") == "in_progress"], "claims left in progress"
    done = {e.get("work_ref") for e in ledger if e.get("result") in ("improved", "harvested", "unchanged")}
    epics = _epics(env)
    for i in items:
        if i.get("consumed"):
            ref = f"source_epic={next(e for e in epics if i['title'] in e[1])[0]}:item={i['title']}"
            assert ref in done, f"{ref} consumed without a successful cycle in the ledger"
    assert not _temps(env), "temp files of dead writers must be swept"
    # The git side (issue 15): no index.lock left behind, every improved cycle's commit exists.
    assert not (env.repo / ".git" / "index.lock").exists(), "a git index.lock survived the recovery fire"
    for e in ledger:
        if e.get("result") == "improved" and isinstance(e.get("sha"), str):
            found = subprocess.run(["git", "-C", str(env.repo), "cat-file", "-e", f"{e['sha']}^{{commit}}"],
                                   capture_output=True)
            assert found.returncode == 0, f"cycle {e['cycle']} is improved but its commit {e['sha']} does not exist"
    for call in env.calls():
        assert not group_alive(call["pgid"]), "an orphaned agent survived"


def _epics(env: Env) -> list[tuple[str, set[str]]]:
    return [(e["source_epic"], {i["title"] for i in e["items"]})
            for e in (orjson.loads(x) for x in env.paths.nextwork.read_bytes().splitlines())
            if not e.get("superseded")]  # (tombstones of moved lines)


def run_harness(env: Env, kills: int, seed: int) -> Counter[str]:
    """Kill ``kills`` fires (at named points, at random moments, some with their agent killed first),
    and kill agents alone under live fires; after each, one recovery fire and every invariant."""
    rng = random.Random(seed)
    env.write_config(fire={"max_cycles": 1000}, breaker={"max_consecutive_failures": 1000},
                     work={"max_attempts": 1000}, agent={"idle_timeout_s": 20, "timeout_s": 30})
    added = _refill(env, 0)
    # Short agent runs that write, sometimes commit, and leave a child behind: kills land everywhere.
    env.steps([
        {"write": [{"path": "src/a.txt", "content": "a {cycle}\n", "append": True}], "sleep": 0.05,
         "report": {"result": "improved"}},
        {"write": [{"path": "src/b.txt", "content": "b {cycle}\n", "append": True}], "commit": True,
         "report": {"result": "improved"}},
        {"spawn_sleeper": 30, "sleep": 0.1, "report": {"result": "unchanged"}},
        {"write": [{"path": "src/c.txt", "content": "c {cycle}\n", "append": True}], "commit": True,
         "report": {"result": "improved"}},
        {"sleep": 0.2, "report": {"result": "unchanged"}},
        {"report": {"result": "scout", "disposition": "context-too-heavy"}},
    ], loop=True)
    stats: Counter[str] = Counter()
    tries = 0
    while stats["kills"] < kills:
        tries += 1
        assert tries < kills * 3, f"too few kills landed: {dict(stats)}"
        added = _refill(env, added)
        mode = rng.random()
        if mode < 0.5:  # a named point
            point = rng.choice(sorted(POINTS))
            fire = _evolve(env, "fire", EVOLVE_CRASHPOINT=f"{point}:{rng.randint(1, POINTS[point])}")
            code = fire.wait(timeout=120)
            if code == -signal.SIGKILL:
                stats["kills"] += 1
                stats[f"killed_at {point}"] += 1
            else:
                stats["point_not_reached"] += 1
        elif mode < 0.85:  # a random moment
            fire = _evolve(env, "fire")
            time.sleep(rng.uniform(0.05, 0.6))
            if rng.random() < 0.3 and (pgid := _agent_pgid(env)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                    stats["killed_at random moment, agent first"] += 1
                time.sleep(rng.uniform(0.0, 0.2))
            fire.send_signal(signal.SIGKILL)
            fire.wait(timeout=30)
            stats["kills"] += 1
            stats["killed_at random moment"] += 1
        else:  # the agent alone, under a fire that lives on
            fire = _evolve(env, "fire", "--cycles", "1")
            deadline = time.monotonic() + 20
            while (pgid := _agent_pgid(env)) is None and fire.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if pgid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                    stats["agent_only_kills"] += 1
            assert fire.wait(timeout=60) in (0, 75)
        _recover(env, stats)
        _check(env, added)
    raw = env.paths.ledger.read_bytes()
    stats["cycles"] = len(raw.splitlines())
    stats["crashed_entries"] = raw.count(b'"result":"crashed"')
    stats["torn_files"] = len(list(env.paths.evolve_dir.glob("cycle-history.jsonl.torn-*")))
    stats["items_queued"] = added
    stats["items_consumed"] = sum(1 for i in _items(env) if i.get("consumed"))
    return stats


def _report(title: str, stats: Counter[str]) -> None:
    print(f"\n{title}")
    for key in sorted(stats):
        print(f"  {key:<44} {stats[key]:>6}")


def test_crash_consistency_reduced(env: Env) -> None:
    stats = run_harness(env, kills=int(os.environ.get("EVOLVE_CRASH_KILLS", "40")), seed=7)
    _report("crash harness (reduced)", stats)
    assert stats["kills"] >= 40 and stats["cycles"] > 0
    assert stats["recovery_crashed"] > 0 and stats["recovery_torn_line"] > 0 and stats["recovery_temps_removed"] > 0


@pytest.mark.slow
def test_crash_consistency_full(env: Env) -> None:
    stats = run_harness(env, kills=300, seed=11)
    _report("crash harness (full)", stats)
    assert stats["kills"] == 300
    assert all(stats[f"killed_at {p}"] > 0 for p in POINTS), "every named point must be hit"
    assert stats["agent_only_kills"] > 0 and stats["killed_at random moment, agent first"] > 0
