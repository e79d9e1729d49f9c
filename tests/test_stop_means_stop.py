"""Stop means stop (docs/DESIGN.md §4.4): a KILL or STOP written while a fire runs ends it.

No new cycle starts once either exists (checked between cycles and right before every agent start);
a KILL also interrupts the agent that is running, in a standalone fire and under the daemon, with no
signal sent to anyone. Markers `evolve stop`/`kill` write hold until resumed, whatever the clock does.

Every wait here is for a condition with a generous deadline; the scripted agent's ``wait_for`` keeps
it running until the test has acted, so nothing depends on how fast a loaded machine is.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from support import CliResult, Env, entry, improved_step, jsonl, results

from evolve.cycle.fire import Fire

LONG = {"timeout_s": 900, "idle_timeout_s": 900}  # the agent is ended by the halt, never by a timeout


def wait_until(pred, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout:g}s")


def start_fire(env: Env, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = env.root / f"fire-{time.monotonic_ns()}.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", *args],
                                stdout=fh, stderr=subprocess.STDOUT, env=env.env())
    return proc, out


def events(out: Path) -> list[dict[str, Any]]:
    rows = [orjson.loads(x) for x in out.read_bytes().splitlines() if x.startswith(b"{")]
    return [r for r in rows if isinstance(r, dict) and "event" in r]


def queue_items(env: Env) -> dict[str, dict[str, Any]]:
    return {i["title"]: i for e in jsonl(env.paths.nextwork) for i in e["items"]}


def test_stop_written_mid_cycle_lets_it_finish_and_starts_no_new_cycle(env: Env, cli) -> None:
    env.queue(entry("a", "b", "c"))
    # The agent of cycle 1 runs until the test's `evolve stop` exists, then finishes normally.
    env.steps([{**improved_step(), "wait_for": str(env.paths.stop)}, improved_step()])
    env.write_config(agent=LONG)
    proc, out = start_fire(env, "--cycles", "3")
    try:
        wait_until(lambda: env.calls(), what="the agent of cycle 1 started")
        r: CliResult = cli("stop", "--reason", "release freeze")
        assert r.code == 0
        assert f"a fire (pid {proc.pid}) is running cycle 1" in r.stdout
        assert "finishes that cycle (gate and landing included) and starts no new cycle" in r.stdout
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert results(env.ledger()) == ["improved"], "cycle 1 finished; cycles 2 and 3 never started"
    assert len(env.calls()) == 1
    (end,) = [e for e in events(out) if e["event"] == "fire.end"]
    assert end["reason"] == "halt:user_halt" and end["exit_code"] == 0 and end["cycles"] == 1
    assert [e["phase"] for e in events(out) if e["event"] == "halt"] == ["between_cycles"]
    assert env.paths.stop.exists(), "the loop never removes an operator marker"
    assert queue_items(env)["b"].get("claim_status") in (None, "available"), "b was never claimed"


def test_kill_interrupts_the_running_agent_of_a_standalone_fire(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    env.steps([{"hang": True}])  # only a stop can end this agent (its timeouts are 15 minutes)
    env.write_config(agent=LONG)
    proc, out = start_fire(env, "--cycles", "2")
    try:
        wait_until(lambda: env.calls(), what="the agent started")
        wait_until(lambda: (env.state().get("fire") or {}).get("agent_pgid"), what="the agent group recorded")
        r = cli("kill", "--reason", "bad deploy")
        assert r.code == 0
        assert f"a fire (pid {proc.pid}) is running cycle 1" in r.stdout and "interrupts its agent" in r.stdout
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, "a running agent was cut short: 143, as for SIGTERM"
    ledger = env.ledger()
    assert results(ledger) == ["interrupted"] and len(env.calls()) == 1
    (end,) = [e for e in events(out) if e["event"] == "fire.end"]
    assert end["reason"] == "halt:kill" and end["exit_code"] == 143
    (h,) = [e for e in events(out) if e["event"] == "halt"]
    assert h["reason"] == "kill" and h["phase"] == "agent_running" and "bad deploy" in h["detail"]
    assert queue_items(env)["a"]["claim_status"] == "available", "the claim is released"
    st = env.state()
    assert st.get("fire") is None and st.get("claimed_work") is None
    # The next fire halts in Step 1, and so does every one after it: the marker holds until resumed.
    again = cli("fire")
    assert again.code == 0 and [e["reason"] for e in again.events() if e["event"] == "halt"] == ["kill"]


def test_a_kill_found_right_before_the_agent_starts_it_never(env: Env, fire_inproc, monkeypatch) -> None:
    """Measuring goals can take minutes: a KILL written meanwhile stops the agent from starting."""
    env.queue(entry("a", "b"))
    original = Fire._goals_before

    def measure_then_kill(self: Fire) -> tuple[Any, Any]:
        got = original(self)
        self.paths.kill.write_text("2026-01-01T00:00:00Z\nstop now\n")
        return got

    monkeypatch.setattr(Fire, "_goals_before", measure_then_kill)
    outcome = fire_inproc(cycles=2)
    assert outcome.reason == "halt:kill" and outcome.exit_code == 0 and outcome.halt == "kill"
    assert env.calls() == [], "no agent started"
    (e,) = env.ledger()
    assert e["result"] == "interrupted" and "agent not started" in e["error"]
    assert queue_items(env)["a"]["claim_status"] == "available"
    assert env.state().get("fire") is None


def test_kill_under_the_daemon_interrupts_that_fire_and_the_daemon_runs_on(env: Env, cli) -> None:
    from test_daemon import EVERY_2S, start_daemon

    env.queue(entry("a", "b"))
    env.steps([{"hang": True}])
    env.write_config(schedule={"cron": EVERY_2S}, agent=LONG)
    d = start_daemon(env)
    try:
        d.wait_for(lambda ev: any(e["event"] == "agent.started" for e in ev), timeout=120)
        assert cli("kill").code == 0  # no signal: the daemon's pid is never touched
        d.wait_for(lambda ev: any(e["event"] == "fire.end" for e in ev), timeout=300)
        # The daemon is still up and its next fire halts in Step 1 (a `halt` without a phase).
        d.wait_for(lambda ev: sum(e["event"] == "fire.end" for e in ev) >= 2, timeout=120)
        assert d.proc.poll() is None
    finally:
        code, _ = d.stop(signal.SIGTERM, timeout=120)
    assert code == 143
    ends = d.named("fire.end")
    assert ends[0]["reason"] == "halt:kill" and ends[0]["exit_code"] == 143
    assert all(e["reason"] == "halt:kill" and e["exit_code"] == 0 for e in ends[1:])
    assert results(env.ledger()) == ["interrupted"] and len(env.calls()) == 1
    done = d.named("daemon.fire_done")
    assert done[0]["reason"] == "halt:kill"


def test_stop_and_kill_say_so_when_no_fire_runs_and_record_their_author(env: Env, cli) -> None:
    r = cli("stop", "--for", "8h")
    assert r.code == 0 and "no fire is running; the next fire halts in Step 1" in r.stdout
    lines = env.paths.stop.read_text().splitlines()
    assert lines[1] == "operator stop" and "written-by: evolve stop" in lines
    assert any(x.startswith("expires: ") for x in lines)
    info = orjson.loads(cli("status", "--json").stdout)
    stop = info["markers"]["STOP"]
    assert stop["written_by"] == "evolve stop" and 8 * 3600 - 600 < stop["expires_in_s"] <= 8 * 3600
    assert stop["ttl_left_s"] is None, "the TTL does not apply to a marker with its own expiry"
    assert "expires in" in cli("status").stdout
    assert cli("kill", "--until", "2001-01-01T00:00:00Z").code == 2, "an expiry in the past is refused"
    assert cli("kill", "--for", "soon").code == 2
    assert not env.paths.kill.exists()
    assert cli("kill").code == 0
    kill = orjson.loads(cli("status", "--json").stdout)["markers"]["KILL"]
    assert kill["written_by"] == "evolve kill" and kill["expires_in_s"] is None and kill["ttl_left_s"] is None


def test_a_forward_clock_step_does_not_void_an_evolve_kill(env: Env, cli) -> None:
    """The real thing: `evolve kill` now, then status and a fire on a clock 30 days ahead.

    Needs ``faketime`` (README and .ci/run install it); missing, this fails rather than skips.
    """
    assert shutil.which("faketime"), "faketime is not installed (apt-get install -y faketime)"
    assert cli("kill").code == 0
    ahead = ["faketime", "-f", "+30d", sys.executable, "-m", "evolve", "--repo", str(env.repo)]
    st = subprocess.run([*ahead, "status", "--json"], capture_output=True, env=env.env(), timeout=120)
    assert st.returncode == 75 and orjson.loads(st.stdout)["halt"]["reason"] == "kill"
    env.queue(entry("a"))
    fire = subprocess.run([*ahead, "fire"], capture_output=True, env=env.env(), timeout=120)
    assert fire.returncode == 0 and env.calls() == [] and env.ledger() == []
    # A KILL written by hand carries no author: the TTL applies to it, and 30 days exceed it.
    env.paths.kill.write_text("by hand\n")
    st = subprocess.run([*ahead, "status", "--json"], capture_output=True, env=env.env(), timeout=120)
    assert st.returncode == 0 and orjson.loads(st.stdout)["markers"]["KILL"]["stale"] is True


def test_a_kill_ends_a_rate_limit_wait_and_no_retry_starts(env: Env, fire_inproc, monkeypatch) -> None:
    """A usage limit waits (60 s by default, up to the fire's budget): a KILL cuts the wait short."""
    import threading

    from evolve.agent.report import AgentReport

    env.queue(entry("a"))
    runs: list[str] = []

    class LimitedThenKilled:
        name = "fake"

        def run(self, inv: Any, **_: Any) -> AgentReport:
            runs.append(inv.work.title)
            env.paths.kill.write_text("by hand\nstop during the wait\n")
            return AgentReport("failed", error_class="limit", error="usage limit reached")

    monkeypatch.setattr(Fire, "_runner", lambda self: LimitedThenKilled())
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(fire_inproc(cycles=1)), daemon=True)
    t.start()
    t.join(timeout=120)  # the limit wait alone is 60 s; the KILL is seen within about a second
    assert got, "the fire was still waiting for the rate limit to reset"
    outcome = got[0]
    assert runs == ["a"], "no retry started once KILL existed"
    assert outcome.reason == "halt:kill" and outcome.exit_code == 0, "no agent was running: exit 0"
    (e,) = env.ledger()
    assert e["result"] == "interrupted" and "retry wait ended" in e["error"]
