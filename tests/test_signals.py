"""Signals and a fire's processes (issue 15 item 5, docs/DESIGN.md §12): SIGHUP stops a fire and the
daemon as SIGTERM does, every fire reaps the escapees carrying its id, and reconcile kills a recorded
process group only when it is the dead fire's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from invariants import GitWatch
from support import Env, entry, live, results
from test_daemon import start_daemon, trap_agent, wait_file

from evolve.procgroup import group_alive


def wait_for(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``pred`` until it holds; the deadline is generous (a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout:g}s")


def fire_record(env: Env) -> dict:
    try:
        return env.state().get("fire") or {}
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def sig_mask(pid: int, field: str) -> int:
    """``SigCgt`` (caught) or ``SigIgn`` (ignored) of ``pid``, as a bit mask (bit n-1 = signal n)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for {pid}")


def claim_status(env: Env) -> str:
    queue = live(env.paths.nextwork)
    return queue[0]["items"][0]["claim_status"]


# -- SIGHUP ---------------------------------------------------------------------------------------


def start_hanging_fire(env: Env, **popen: object) -> subprocess.Popen[bytes]:
    """``evolve fire`` whose agent hangs after a partial change; returns once the agent runs."""
    env.queue(entry("alpha"))
    env.steps([{"write": [{"path": "half.txt", "content": "partial"}], "hang": True}])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env(), **popen)
    wait_for(lambda: fire_record(env).get("agent_pgid") is not None, what="agent_pgid recorded")
    wait_for(lambda: (env.tree / "half.txt").exists(), what="the agent's partial change")
    assert claim_status(env) == "in_progress"
    return fire


def test_sighup_stops_a_fire_like_sigterm(env: Env) -> None:
    fire = start_hanging_fire(env)
    pgid = fire_record(env)["agent_pgid"]
    fire.send_signal(signal.SIGHUP)
    _out, err = fire.communicate(timeout=120)
    assert fire.returncode == 143, (fire.returncode, err[-2000:])
    assert results(env.ledger()) == ["interrupted"]
    wait_for(lambda: not group_alive(pgid), what="the agent's group gone")
    assert not (env.tree / "half.txt").exists() and not (env.repo / "half.txt").exists()  # undone
    assert claim_status(env) == "available"  # the claim went back to the queue
    assert env.state()["fire"] is None and env.state()["claimed_work"] is None
    GitWatch(env).check()  # no index.lock left, nothing of the agent's in the checkout (with isolation)


def test_a_fire_under_nohup_keeps_ignoring_sighup(env: Env) -> None:
    """``nohup evolve fire``: the hang-up was meant to be survived, so the fire does not catch it."""
    fire = start_hanging_fire(env, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    hup = 1 << (signal.SIGHUP - 1)
    # The agent runs, so the fire's handlers are installed: TERM is caught, HUP still ignored.
    assert sig_mask(fire.pid, "SigCgt") & (1 << (signal.SIGTERM - 1))
    assert sig_mask(fire.pid, "SigIgn") & hup and not sig_mask(fire.pid, "SigCgt") & hup
    fire.send_signal(signal.SIGTERM)
    fire.communicate(timeout=120)
    assert fire.returncode == 143 and results(env.ledger()) == ["interrupted"]


def test_sighup_stops_the_daemon_like_sigterm(env: Env) -> None:
    marks = trap_agent(env, "trap", grace_s=60)
    d = start_daemon(env)
    pgid = int(wait_file(marks / "started", timeout=60))
    code, _took = d.stop(signal.SIGHUP, timeout=120)
    assert code == 143, d.err.read_text()[-2000:]
    assert (marks / "signal").read_text() == "SIGTERM"  # the agent's group got TERM, as on SIGTERM
    assert results(env.ledger()) == ["interrupted"]
    wait_for(lambda: not group_alive(pgid), what="the agent's group gone")
    assert claim_status(env) == "available"
    assert env.state()["fire"] is None
    (sig,) = d.named("daemon.signal")
    assert sig["signal"] == "SIGHUP"
    (stopped,) = d.named("daemon.stop")
    assert stopped["exit_code"] == 143 and stopped["interrupted"] == 1 and stopped["unfinished"] == []


# -- every fire reaps what its children left ------------------------------------------------------

ESCAPING_AGENT = """
setsid sh -c 'echo $$ > "$1"; exec sleep 1000' escapee "$1" </dev/null >/dev/null 2>&1 &
while [ ! -s "$1" ]; do sleep 0.05; done  # (the pid is written before the fire can end)
echo '{"result": "unchanged", "summary": "left a daemon behind"}' > "$EVOLVE_REPORT_FILE"
"""


def test_a_setsid_escapee_is_reaped_when_its_fire_ends(env: Env, cli) -> None:
    """The agent starts ``setsid sleep 1000 &`` (its own session, still carrying EVOLVE_FIRE_ID) and exits."""
    pidfile = env.root / "escapee.pid"
    env.write_config(agent={"argv": ["sh", "-c", ESCAPING_AGENT, "agent", str(pidfile)]})
    env.queue(entry("alpha"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    pid = int(wait_for_text(pidfile))
    try:
        # The escapee led a session of its own: no recorded group held it, the fire's end did.
        (reaped,) = [e for e in r.events() if e["event"] == "fire.reaped"]
        assert reaped["pgids"] == [pid]
        wait_for(lambda: not alive(pid), what="the escapee gone")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_setsid_escapee_is_reaped_when_its_fire_raises(env: Env, cli) -> None:
    """The same escapee, then the agent breaks git under evolve's feet: the fire fails (exit 1) and
    leaves session-state.fire for the next fire, but its escapee is gone already."""
    pidfile = env.root / "escapee.pid"
    breaking = ESCAPING_AGENT + 'echo garbage > "$(git rev-parse --git-path HEAD)"\n'
    env.write_config(agent={"argv": ["sh", "-c", breaking, "agent", str(pidfile)]})
    env.queue(entry("alpha"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 1 and "fire.error" in r.names(), r.stderr
    pid = int(wait_for_text(pidfile))
    try:
        (reaped,) = [e for e in r.events() if e["event"] == "fire.reaped"]
        assert reaped["pgids"] == [pid]
        wait_for(lambda: not alive(pid), what="the escapee gone")
        assert env.state()["fire"] is not None  # still left for the next fire to reconcile
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def wait_for_text(path: Path) -> str:
    wait_for(lambda: path.exists() and path.read_text().strip() != "", what=f"{path} written")
    return path.read_text().strip()


# -- reconcile kills a recorded group only once it is the dead fire's -----------------------------

# Unique to this run: another suite running on the same host (its reconcile reads every /proc/*/environ)
# must never find, or kill, this run's sleepers.
DEAD_ID = "dead" + uuid.uuid4().hex[:8]


def plant_dead_fire(env: Env, cli, agent_pgid: int, fire_id: str) -> None:
    """session-state as a fire that died mid-run leaves it, naming ``agent_pgid`` as its agent's group."""
    env.queue(entry("alpha", "beta"))
    assert cli("fire", "--cycles", "1").code == 0  # a real session-state to start from
    state = env.state()
    state["fire"] = {"pid": 2**22 + 1, "pgid": 2**22 + 1, "agent_pgid": agent_pgid,
                     "started_at": "2026-01-01T00:00:00Z", "cycle": None, "fire_id": fire_id}
    env.paths.state.write_bytes(orjson.dumps(state))


def sleeper(env: Env, tag: str | None) -> subprocess.Popen[bytes]:
    """A live process group of its own, started with ``EVOLVE_FIRE_ID=tag`` (or without it)."""
    extra = {"EVOLVE_FIRE_ID": tag} if tag else {}
    return subprocess.Popen(["sleep", "1000"], start_new_session=True, env={**env.env(), **extra})


@pytest.mark.parametrize(("tag", "recorded_id"), [
    (None, DEAD_ID),  # pid reuse / a reboot: somebody else's group now has that number
    ("0ther" + uuid.uuid4().hex[:7], DEAD_ID),  # another fire's child, not the dead one's
    (None, ""),  # a record without a fire id cannot be verified at all
])
def test_reconcile_leaves_an_unverified_recorded_group_alone(env: Env, cli, tag: str | None,
                                                              recorded_id: str) -> None:
    other = sleeper(env, tag)
    try:
        plant_dead_fire(env, cli, other.pid, recorded_id)
        r = cli("fire", "--cycles", "1")
        assert r.code == 0, r.stderr
        assert "reconcile.kill_orphan" not in r.names()
        (skipped,) = [e for e in r.events() if e["event"] == "reconcile.pgid_reused"]
        assert skipped["pgid"] == other.pid
        assert other.poll() is None and group_alive(other.pid)  # still running: never signalled
        assert env.state()["fire"] is None  # the dead fire is settled all the same
    finally:
        other.kill()
        other.wait(timeout=30)


def test_reconcile_kills_a_recorded_group_that_carries_the_dead_fires_id(env: Env, cli) -> None:
    orphan = sleeper(env, DEAD_ID)
    try:
        plant_dead_fire(env, cli, orphan.pid, DEAD_ID)
        r = cli("fire", "--cycles", "1")
        assert r.code == 0, r.stderr
        kills = [e for e in r.events() if e["event"] == "reconcile.kill_orphan"]
        assert [(e["pgid"], e["found_by"]) for e in kills] == [(orphan.pid, "recorded pgid")]
        assert "reconcile.pgid_reused" not in r.names()
        orphan.wait(timeout=30)  # our child: reaped here once killed
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait(timeout=30)
