"""Crash consistency: fires SIGKILLed at named points (the landing's among them) and while their agents
run (and agents killed under live fires), and fires whose landings wait on the operator's edit killed
while their work is held or as it lands; then one recovery fire. The on-disk state, the git side and the
history of every queue line and claim must always be whole (issues 15 and 22, docs/PROOF.md). CI runs a
reduced form; ``pytest -m slow`` runs 300 kills.

Every kill is planned from the seed alone (:func:`plan`): a named point and its occurrence
(``EVOLVE_CRASHPOINT``), or an agent-alive kill made once the agent says it runs (it writes a file,
then hangs) — never after a sleep. The same seed gives the same count per kind on any machine.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from invariants import GitWatch, History, git_run
from support import Env, entry

BATCH = 20  # items appended whenever fewer than LOW are left to select
LOW = 10
KINDS = ("bug", "feature", "tech-debt", "improvement", "pattern-fix", "task")
TEMP_AGE_S = 120  # how old leftover temp files are made before a recovery fire (its sweep takes > 60 s)
WAIT_S = 120  # only a hung run gets here
RELAUNCHES = 3  # fires a named-point trial may start before it counts the point as not reached

# Where a fire is made to die (evolve/crashpoint.py), and how many occurrences in a fire to pick from:
# half a ledger line written then death, death right after the ledger entry (before the claim is
# finalized), between a state file's temp write and its rename, after a queue edit is in evolve's
# lifecycle record (evolve/work/queue_record.py) and after its redo journal is written, and between a
# moved line's appended copy and its tombstone (claims and finalizes; evolve/store/inplace.py), while
# the agent runs, as the gate starts, and right before and right after the landing moves the branch (a
# fast-forward in the operator's checkout: landing.json is resolved by the next fire, docs/DESIGN.md §8.3).
POINTS = {
    "ledger.torn": 3,
    "ledger.appended": 3,
    "replace:session-state.json": 8,
    "replace:cycle-state.json": 4,
    "queue.record": 4,
    "queue.journal": 4,
    "queue.replace": 4,
    "agent.running": 3,
    "gate": 3,
    "land.before_move": 3,
    "land.moved": 3,
}
# Kills made while the agent runs (it has written its marker and hangs): the fire alone (its agent
# orphaned, for the recovery to reap), the agent's group then the fire (the fire stopped first, so
# it dies before it can see its agent die), and the agent's group alone under a fire that lives on.
AGENT_KILLS = {"agent: fire killed": 4, "agent: agent then fire": 3, "agent: agent alone": 3}
# The operator holds an uncommitted edit in the path the agent changes, so green cycles wait (``pending``,
# their items' claims kept by pending.json): a fire is killed right after a held cycle's ledger entry
# (checked while the work still waits), or, once the operator dropped the edit, as the fire lands the
# waiting chain: before or after the branch moves.
PENDING_KILLS = {"pending: held cycle killed": 2, "pending: landing killed before the move": 2,
                 "pending: landing killed after the move": 2}
HELD = "src/held.txt"  # the path both the operator and the agent change in a pending trial
HELD_STEP = {"write": [{"path": HELD, "content": "h {cycle}\n", "append": True}], "report": {"result": "improved"}}

# Short agent runs that write, sometimes commit, and leave a child behind; a trial starts at a
# planned position of this loop.
LOOP = [
    {"write": [{"path": "src/a.txt", "content": "a {cycle}\n", "append": True}], "report": {"result": "improved"}},
    {"write": [{"path": "src/b.txt", "content": "b {cycle}\n", "append": True}], "commit": True,
     "report": {"result": "improved"}},
    {"spawn_sleeper": 30, "report": {"result": "unchanged"}},
    {"write": [{"path": "src/c.txt", "content": "c {cycle}\n", "append": True}], "commit": True,
     "report": {"result": "improved"}},
    {"report": {"result": "unchanged"}},
    {"report": {"result": "scout", "disposition": "context-too-heavy"}},
]


@dataclass(frozen=True)
class Trial:
    kind: str  # a POINTS name, or an AGENT_KILLS kind
    nth: int = 1  # the occurrence of a named point
    pos: int = 0  # where in LOOP the agent starts


def plan(seed: int, kills: int) -> list[Trial]:
    """The run's kills, from the seed alone: half at named points (each point in turn, so a short run
    still reaches every one), half while the agent runs or while work waits to land, in proportion to
    AGENT_KILLS and PENDING_KILLS; shuffled."""
    rng = random.Random(seed)
    points = sorted(POINTS)
    kinds = [points[n % len(points)] for n in range(kills // 2)]
    others = {**AGENT_KILLS, **PENDING_KILLS}
    weights = sum(others.values())
    rest = kills - len(kinds)
    for n in range(rest):  # a deterministic spread, proportional to the weights
        acc = 0
        for kind, w in others.items():
            acc += w
            if n * weights < acc * rest:
                kinds.append(kind)
                break
    rng.shuffle(kinds)
    return [Trial(k, rng.randint(1, POINTS[k]) if k in POINTS else 1, rng.randrange(len(LOOP))) for k in kinds]


def planned(trials: list[Trial]) -> Counter[str]:
    """The kill counts a run of ``trials`` must report, per named point, agent-alive and pending kind."""
    return Counter(f"killed_at {t.kind}" for t in trials)


def _evolve(env: Env, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env(**extra))


def _wait(pred, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, f"{what} not reached within {WAIT_S}s"
        time.sleep(0.01)


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "T"


def _items(env: Env) -> list[dict]:
    p = env.paths.nextwork
    return [i for line in p.read_bytes().splitlines() for i in orjson.loads(line)["items"]] if p.exists() else []


def _refill(env: Env, history: History) -> None:
    """Keep work available, as a harvester appending to the queue would; titles are unique ids."""
    open_items = [i for i in _items(env) if not i.get("consumed") and i.get("status") != "blocked"]
    if len(open_items) >= LOW:
        return
    added = len(history.appended)
    titles = [f"item-{added + n}" for n in range(BATCH)]
    batch = entry(*titles, epic=f"batch-{added // BATCH}")
    for n, item in enumerate(batch["items"]):  # mixed kinds of work, or the metronome blocks the repeats
        item["type"] = KINDS[n % len(KINDS)]
    env.queue(batch)
    history.append(titles)


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
            elif name in ("ledger.torn_line", "reconcile.crashed", "reconcile.kill_orphan", "store.temps_removed",
                          "reconcile.landed", "reconcile.pending", "land.finished_after_crash", "land.settled"):
                stats[f"recovery_{name.split('.', 1)[1]}"] += 1
    if env.paths.handoff.exists():
        env.paths.handoff.unlink()


def _check(env: Env, gitw: GitWatch, history: History, trial: int, *, all_landed: bool = True) -> None:
    """Every invariant; ``all_landed``: the operator holds nothing in the way, so nothing may still wait."""
    raw = env.paths.ledger.read_bytes() if env.paths.ledger.exists() else b""
    assert raw == b"" or raw.endswith(b"\n"), "a torn tail survived the recovery fire"
    ledger = [orjson.loads(line) for line in raw.splitlines()]  # every line parses
    cycles = [e["cycle"] for e in ledger]
    assert cycles == sorted(set(cycles)), "cycle numbers must strictly increase"
    state = orjson.loads(env.paths.state.read_bytes())
    assert state["fire"] is None and state["claimed_work"] is None
    # Every line once, every claim ended or held by pending.json, consumed iff a successful cycle, every
    # pending cycle settled once (all of them, when nothing is in the way any more).
    history.observe(env, trial, all_landed=all_landed)
    assert not _temps(env), "temp files of dead writers must be swept"
    # No index.lock; improved commits on main, pending ones exist; main only moved forward, by evolve's
    # commits; the operator's files untouched.
    gitw.check(ledger)
    survivors = _ours_alive({c["env"].get("EVOLVE_FIRE_ID") for c in env.calls()} - {None})
    assert not survivors, f"orphaned agents survived: {survivors}"


def _ours_alive(fire_ids: set[str]) -> list[tuple[int, str]]:
    """Live processes started by any of these fires (``EVOLVE_FIRE_ID`` in their environment). A
    recorded group id alone proves nothing over a long run: pids wrap (pid_max 32768) and the same
    number names somebody else's group."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v)
            stat = (proc / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        fid = env.get(b"EVOLVE_FIRE_ID", b"").decode(errors="replace")
        if fid in fire_ids and stat[stat.rfind(")") + 2] not in "ZX":
            found.append((int(proc.name), fid))
    return found


def _point(env: Env, t: Trial, stats: Counter[str], history: History) -> None:
    """A fire that SIGKILLs itself at the t.nth occurrence of the named point. A fire that ends first
    (its queue ran dry for it, say) is followed by another with the same point, a few times at most."""
    env.steps(LOOP, loop=True)
    env.script.with_name(env.script.name + ".pos").write_text(str(t.pos))
    out = env.root / "point-fire.out"
    for _ in range(RELAUNCHES):
        _refill(env, history)
        with open(out, "wb") as fh:
            fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                                    stdout=fh, stderr=subprocess.STDOUT,
                                    env=env.env(EVOLVE_CRASHPOINT=f"{t.kind}:{t.nth}"))
        if fire.wait(timeout=WAIT_S) == -signal.SIGKILL:
            stats[f"killed_at {t.kind}"] += 1
            return
        ends = [e for e in _events(out) if e.get("event") == "fire.end"]
        stats[f"relaunched after a fire ended: {ends[-1].get('reason') if ends else 'no fire.end'}"] += 1
    stats[f"not reached {t.kind}"] += 1


def _events(out: Path) -> list[dict]:
    rows = [orjson.loads(x) for x in out.read_bytes().splitlines() if x.startswith(b"{")]
    return [r for r in rows if isinstance(r, dict)]


def _agent_kill(env: Env, t: Trial, marker: Path, stats: Counter[str]) -> None:
    """Kill once the agent has written ``marker`` (it then hangs, a child of its own beside it)."""
    hang = {"write": [{"path": "src/a.txt", "content": "a {cycle}\n", "append": True},
                      {"path": str(marker), "content": "running\n"}], "spawn_sleeper": 30, "hang": True}
    env.steps([hang, *LOOP], loop=True)  # the recovery fire's agent plays LOOP
    marker.unlink(missing_ok=True)
    alone = t.kind == "agent: agent alone"
    fire = _evolve(env, "fire", *(("--cycles", "1") if alone else ()))
    _wait(lambda: marker.exists() or fire.poll() is not None, "the agent's marker")
    assert fire.poll() is None, f"the fire ended ({fire.returncode}) before its agent ran"
    pgid = env.calls()[-1]["pgid"]  # the scripted agent records its own group before it writes
    if t.kind == "agent: fire killed":
        fire.send_signal(signal.SIGKILL)
    elif t.kind == "agent: agent then fire":
        fire.send_signal(signal.SIGSTOP)  # it cannot see its agent die: it dies first
        _wait(lambda: _stopped(fire.pid), "the fire stopped")
        os.killpg(pgid, signal.SIGKILL)
        fire.send_signal(signal.SIGKILL)
    else:
        os.killpg(pgid, signal.SIGKILL)
    code = fire.wait(timeout=WAIT_S)
    assert code == (0 if alone else -signal.SIGKILL), f"{t.kind}: exit {code}"
    stats[f"killed_at {t.kind}"] += 1


def _hold(env: Env, gitw: GitWatch) -> None:
    """The operator edits HELD in their checkout (tracked there or not) and leaves the edit uncommitted."""
    path = env.repo / HELD
    data = (path.read_bytes() if path.exists() else b"") + b"the operator's own edit, not to be landed over\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    gitw.operator[HELD] = data


def _unhold(env: Env, gitw: GitWatch) -> None:
    """The operator drops their edit: the committed version back, or the untracked file gone."""
    assert (env.repo / HELD).read_bytes() == gitw.operator.pop(HELD), "the operator's held edit was changed"
    if git_run(env.repo, "cat-file", "-e", f"HEAD:{HELD}").returncode == 0:
        assert git_run(env.repo, "checkout", "-q", "--", HELD).returncode == 0
    else:
        (env.repo / HELD).unlink()


def _fire(env: Env, out: Path, *args: str, crash: str = "") -> int:
    with open(out, "wb") as fh:
        fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", *args],
                                stdout=fh, stderr=subprocess.STDOUT,
                                env=env.env(**({"EVOLVE_CRASHPOINT": crash} if crash else {})))
    return fire.wait(timeout=WAIT_S * 3)


def _loop_from(env: Env, pos: int) -> None:
    env.steps(LOOP, loop=True)
    env.script.with_name(env.script.name + ".pos").write_text(str(pos))


def _pending_trial(env: Env, t: Trial, stats: Counter[str], history: History, gitw: GitWatch, n: int) -> None:
    """Green cycles held by the operator's edit of HELD; a death while they wait or as they land."""
    env.steps([HELD_STEP], loop=True)
    _hold(env, gitw)
    out = env.root / "pending-fire.out"
    before = len(env.ledger())
    if t.kind == "pending: held cycle killed":
        # Death right after the first held cycle's entry (its claim kept by pending.json, not yet by the fire).
        code = _fire(env, out, "--cycles", "2", crash="ledger.appended:1")
        assert code == -signal.SIGKILL, f"{t.kind}: exit {code}: {out.read_bytes()[-2000:]!r}"
        assert env.ledger()[-1]["result"] == "pending", env.ledger()[-1]
        stats[f"killed_at {t.kind}"] += 1
        History.claims_held(env)
        _loop_from(env, t.pos)  # the recovery fire's cycle chains onto the held work: it waits too
        _recover(env, stats)
        stats["pending_checked_while_held"] += 1
        _check(env, gitw, history, n, all_landed=False)  # the held items still claimed, the work on a ref
        _unhold(env, gitw)  # the run's recovery fire lands it all
        return
    code = _fire(env, out, "--cycles", "2")
    assert code == 0, f"{t.kind}: exit {code}: {out.read_bytes()[-2000:]!r}"
    waiting = [e for e in env.ledger()[before:] if e["result"] == "pending"]
    assert waiting and all(HELD in e["pending_reason"] for e in waiting), env.ledger()[before:]
    stats["pending_cycles_held"] += len(waiting)
    stats["pending_checked_while_held"] += 1
    _check(env, gitw, history, n, all_landed=False)
    _unhold(env, gitw)
    _loop_from(env, t.pos)
    point = "land.before_move" if t.kind.endswith("before the move") else "land.moved"
    code = _fire(env, out, crash=f"{point}:1")  # the waiting chain is the fire's first landing (prepare)
    assert code == -signal.SIGKILL, f"{t.kind}: exit {code}: {out.read_bytes()[-2000:]!r}"
    stats[f"killed_at {t.kind}"] += 1


def run_harness(env: Env, trials: list[Trial]) -> tuple[Counter[str], GitWatch, History]:
    """Run each planned kill; after each, one recovery fire and every invariant."""
    env.write_config(fire={"max_cycles": 1000}, breaker={"max_consecutive_failures": 1000},
                     work={"max_attempts": 1000}, agent={"idle_timeout_s": 60, "timeout_s": 120})
    gitw, history = GitWatch(env), History()
    gitw.plant()  # the operator's uncommitted edit and untracked file, there all along
    _refill(env, history)
    marker = env.root / "agent-running"
    stats: Counter[str] = Counter()
    for n, t in enumerate(trials):
        _refill(env, history)
        if t.kind in POINTS:
            _point(env, t, stats, history)
        elif t.kind in PENDING_KILLS:
            _pending_trial(env, t, stats, history, gitw, n)
        else:
            _agent_kill(env, t, marker, stats)
        stats["kills"] += 1
        History.claims_held(env)  # before the recovery: any claim in progress is the one recorded
        _recover(env, stats)
        _check(env, gitw, history, n)
    raw = env.paths.ledger.read_bytes()
    stats["cycles"] = len(raw.splitlines())
    stats["crashed_entries"] = raw.count(b'"result":"crashed"')
    stats["torn_files"] = len(list(env.paths.evolve_dir.glob("cycle-history.jsonl.torn-*")))
    stats["items_queued"] = len(history.appended)
    stats["items_consumed"] = sum(1 for i in _items(env) if i.get("consumed"))
    stats.update({f"claims_{k}": v for k, v in history.claims.items()})
    stats.update({f"pending_{k}": v for k, v in history.pending.items()})
    stats["trials_leaving_agent_edits_in_place"] = gitw.leftovers
    stats["improved_commits_checked"] = len(gitw.checked)
    stats["pending_commits_checked"] = len(gitw.pending_seen)
    stats["branch_moves_checked"] = gitw.moves
    return stats, gitw, history


def _report(title: str, stats: Counter[str]) -> None:
    print(f"\n{title}")
    for key in sorted(stats):
        print(f"  {key:<52} {stats[key]:>6}")


def test_the_plan_is_the_seed_alone() -> None:
    """A plan is a pure function of (seed, kills): every named point and agent kind in the counts."""
    assert plan(11, 300) == plan(11, 300) and plan(11, 300) != plan(12, 300)
    counts = planned(plan(11, 300))
    assert sum(counts.values()) == 300
    assert sum(counts[f"killed_at {p}"] for p in POINTS) == 150
    assert all(counts[f"killed_at {k}"] > 0 for k in (*POINTS, *AGENT_KILLS, *PENDING_KILLS))
    reduced = planned(plan(7, 40))
    assert all(reduced[f"killed_at {k}"] > 0 for k in (*POINTS, *PENDING_KILLS))  # CI reaches each
    assert all(1 <= t.nth <= POINTS.get(t.kind, 1) and 0 <= t.pos < len(LOOP) for t in plan(11, 300))


def _assert_counts(stats: Counter[str], trials: list[Trial]) -> None:
    """Per point and per kind, the kills made are the kills planned (so: the same on any machine)."""
    made = Counter({k: v for k, v in stats.items() if k.startswith(("killed_at ", "not reached "))})
    assert made == planned(trials), (made, planned(trials))


def test_crash_consistency_reduced(env: Env) -> None:
    trials = plan(7, int(os.environ.get("EVOLVE_CRASH_KILLS", "40")))
    stats, _gitw, _history = run_harness(env, trials)
    _report("crash harness (reduced)", stats)
    _assert_counts(stats, trials)
    assert stats["cycles"] > 0 and stats["claims_consumed"] > 0 and stats["claims_released"] > 0
    assert stats["recovery_crashed"] > 0 and stats["recovery_torn_line"] > 0 and stats["recovery_temps_removed"] > 0
    assert stats["recovery_kill_orphan"] > 0  # agents left by killed fires were reaped
    # Landings cut short were found on the branch (finished first when the fast-forward had not begun);
    # waiting work was held, checked while held, and landed by a later fire.
    assert stats["recovery_landed"] > 0 and stats["recovery_finished_after_crash"] > 0
    assert stats["pending_cycles_held"] > 0 and stats["pending_settled_landed"] > 0


@pytest.mark.slow
def test_crash_consistency_full(env: Env) -> None:
    trials = plan(11, 300)
    stats, _gitw, history = run_harness(env, trials)
    _report("crash harness (full)", stats)
    _report("item timelines (statuses after each trial: items)", history.transitions())
    _assert_counts(stats, trials)
    assert stats["kills"] == 300


def test_a_death_right_after_a_held_cycle_keeps_its_claim(env: Env) -> None:
    """A fire dies right after a ``pending`` entry (its landing waits on the operator's edit): the next
    fire keeps the item's claim for pending.json, never releases it while the work waits; once the
    operator's edit is gone the work lands, settled once, and the item is consumed once."""
    gitw, history = GitWatch(env), History()
    gitw.plant()
    titles = ["held-1", "held-2"]
    env.queue(entry(*titles))
    history.append(titles)
    env.steps([HELD_STEP], loop=True)
    _hold(env, gitw)
    out = env.root / "fire.out"
    assert _fire(env, out, "--cycles", "1", crash="ledger.appended:1") == -signal.SIGKILL
    assert [e["result"] for e in env.ledger()] == ["pending"]
    History.claims_held(env)
    assert _fire(env, out, "--cycles", "1") == 0, out.read_bytes()[-3000:]
    assert [e["result"] for e in env.ledger()] == ["pending", "pending"]  # the second chains onto the first
    _check(env, gitw, history, 1, all_landed=False)  # held-1 still in_progress: the chain holds its claim
    _unhold(env, gitw)
    assert _fire(env, out, "--cycles", "1") == 0, out.read_bytes()[-3000:]
    settles = [(e["pending_cycle"], e["result"]) for e in env.ledger() if e.get("pending_cycle")]
    assert settles == [(1, "improved"), (2, "improved")], env.ledger()
    _check(env, gitw, history, 2)
    assert history.claims["consumed"] == 2
