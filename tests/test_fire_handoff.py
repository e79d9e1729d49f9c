"""The headline behaviour: context exhaustion is a hand-off across fires, never a stop (docs/DESIGN.md §4.3)."""

from __future__ import annotations

import subprocess

import orjson
import pytest
from support import Env, entry, heavy_step, improved_step, live, results


def test_two_fires_back_to_back_hand_off_and_resume(env: Env, cli) -> None:
    env.queue(entry("alpha", "beta", "gamma"))
    env.steps([heavy_step("scout"), heavy_step("harvested"), improved_step(), improved_step()])

    first = cli("fire")
    assert first.code == 0, first.stderr
    # After fire 1: HANDOFF has exactly the four lines.
    lines = env.paths.handoff.read_text().splitlines()
    assert len(lines) == 4
    assert lines[0].endswith("Z") and lines[0][:4].isdigit()
    assert lines[1] == "context_streak=2 (this session's context grew too heavy)"
    parked = orjson.loads(lines[2].removeprefix("parked_work: "))
    assert parked == ["source_epic=e1:item=alpha"]
    assert lines[3] == "next-action: cron-fire will resume on compacted/fresh context"
    ledger = env.ledger()
    assert results(ledger) == ["scout", "harvested", "context-handoff"]
    last = ledger[-1]
    assert last["cycle"] == 3
    assert last["selected_source"] == "harvested"
    assert last["work_ref"] == "source_epic=e1:item=alpha"
    assert last["milestone"] == (
        "Context-handoff after 2 heavy cycles. Parked: source_epic=e1:item=alpha. "
        "Next cron-fire (compacted/fresh) resumes."
    )
    state = env.state()
    assert state["context_streak"] == 0
    assert state["parked_work"] == ["source_epic=e1:item=alpha"]
    assert state["agent_session"]["ended_heavy"] is True
    assert state["fire"] is None and state["claimed_work"] is None
    assert "fire.end" in first.names() and "handoff.written" in first.names()
    end = next(e for e in first.events() if e["event"] == "fire.end")
    assert end["reason"] == "context-handoff" and end["exit_code"] == 0

    # The parked item went back to the queue, still available.
    queue = live(env.paths.nextwork)
    alpha = queue[0]["items"][0]
    assert alpha["claim_status"] == "available" and alpha.get("consumed") is not True

    second = cli("fire", "--cycles", "1")
    assert second.code == 0, second.stderr
    names = second.names()
    # Step 1 clears HANDOFF (logging its content) before the cycle runs.
    assert names.index("handoff.cleared") < names.index("cycle.start")
    cleared = next(e for e in second.events() if e["event"] == "handoff.cleared")
    assert "context_streak=2" in cleared["content"]
    assert not env.paths.handoff.exists()
    ledger = env.ledger()
    assert results(ledger) == ["scout", "harvested", "context-handoff", "improved"]
    assert ledger[-1]["work_ref"] == "source_epic=e1:item=alpha"
    # A session that ended in a hand-off is never resumed: the next cycle is a fresh First.
    mode = next(e for e in second.events() if e["event"] == "agent.mode")
    assert mode["mode"] == "first"
    calls = env.calls()
    assert calls[-1]["env"]["EVOLVE_MODE"] == "first"
    assert calls[-1]["env"]["EVOLVE_SESSION_ID"] != calls[1]["env"]["EVOLVE_SESSION_ID"]
    assert ledger[-1]["session_id"] != ledger[1]["session_id"]
    assert env.state()["parked_work"] == []


def test_handoff_is_written_after_the_limit_only(env: Env, fire_inproc) -> None:
    env.queue(entry("a", "b", "c", "d"))
    env.steps([heavy_step(), improved_step(), heavy_step(), improved_step()])
    out = fire_inproc(cycles=4)
    assert out.reason == "max_cycles"
    assert not env.paths.handoff.exists()
    assert results(env.ledger()) == ["scout", "improved", "scout", "improved"]
    assert env.state()["context_streak"] == 0


def test_heavy_then_unchanged_keeps_streak(env: Env, fire_inproc) -> None:
    env.queue(entry("a", "b", "c"))
    env.steps([heavy_step(), {"report": {"result": "unchanged", "summary": "nothing"}}, heavy_step()])
    out = fire_inproc(cycles=3)
    assert out.reason == "context-handoff"
    assert results(env.ledger()) == ["scout", "unchanged", "scout", "context-handoff"]


SIGNALS = {
    "scout-disposition": {"report": {"result": "scout", "disposition": "context-too-heavy"}},
    "harvest-defer": {"report": {"result": "harvested", "disposition": "context-budget-defer"}},
    "agent-flag": {"report": {"result": "unchanged", "context_heavy": True}},
    "overflow": {"report": {"result": "failed", "context_overflow": True, "error_class": "transient"}},
    "compaction": {"report": {"result": "unchanged", "compacted": True}},
    "occupancy": {"report": {"result": "unchanged", "context_window": 1000,
                             "usage": {"input_tokens": 300, "cache_read_input_tokens": 100}}},
}


@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_each_signal_counts_and_two_make_a_handoff(env: Env, fire_inproc, name: str) -> None:
    env.queue(entry("a", "b", "c"))
    env.steps([SIGNALS[name], SIGNALS[name], improved_step()])
    fire_inproc(cycles=1)
    first = env.ledger()[-1]
    assert first["context_heavy"] is True, first
    assert first["context_signal"]
    assert env.state()["context_streak"] == 1
    fire_inproc(cycles=3)
    assert env.ledger()[-1]["result"] == "context-handoff"
    assert env.paths.handoff.exists()


def test_below_threshold_occupancy_is_not_heavy(env: Env, fire_inproc) -> None:
    env.queue(entry("a"))
    env.steps([{"report": {"result": "unchanged", "context_window": 1000, "usage": {"input_tokens": 399}}}])
    fire_inproc(cycles=1)
    e = env.ledger()[-1]
    assert e["context_heavy"] is False and e["context_pct"] == 39.9
    assert env.state()["context_streak"] == 0


def test_improved_resets_the_streak(env: Env, fire_inproc) -> None:
    env.queue(entry("a", "b"))
    env.steps([heavy_step(), improved_step()])
    fire_inproc(cycles=1)
    assert env.state()["context_streak"] == 1
    fire_inproc(cycles=1)
    assert env.state()["context_streak"] == 0


def test_limit_from_env_wins_over_config(env: Env, fire_inproc) -> None:
    env.write_config(context={"streak_limit": 5})
    env.queue(entry("a", "b", "c", "d"))
    env.steps([heavy_step()] * 4)
    out = fire_inproc(cycles=4, extra_env={"EVOLVE_CONTEXT_STREAK_LIMIT": "3"})
    assert out.reason == "context-handoff"
    assert results(env.ledger()) == ["scout", "scout", "scout", "context-handoff"]
    assert "context_streak=3" in env.paths.handoff.read_text()


def test_limit_from_config(env: Env, fire_inproc) -> None:
    env.write_config(context={"streak_limit": 1})
    env.queue(entry("a", "b"))
    env.steps([heavy_step()])
    out = fire_inproc(cycles=3)
    assert out.reason == "context-handoff"
    assert results(env.ledger()) == ["scout", "context-handoff"]


def test_handoff_never_a_halt_even_with_no_other_markers(env: Env, cli) -> None:
    """A HANDOFF left by an older fire is cleared in step one; the fire then works normally."""
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.handoff.write_text("2026-01-01T00:00:00Z\ncontext_streak=2 (x)\nparked_work: []\nnext-action: x\n")
    env.queue(entry("a"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0
    assert "handoff.cleared" in r.names() and "halt" not in r.names()
    assert results(env.ledger()) == ["improved"]


def test_jq_one_liners_read_our_files(env: Env, cli) -> None:
    import shutil

    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed")
    env.queue(entry("a", "b"))
    env.steps([heavy_step(), heavy_step()])
    assert cli("fire").code == 0
    state = str(env.paths.state)
    ledger = str(env.paths.ledger)

    def run(*args: str) -> str:
        return subprocess.run([jq, *args], capture_output=True, text=True, check=True).stdout.strip()

    assert run("-r", ".context_streak // 0", state) == "0"
    assert run("-c", ".parked_work // []", state) == '["source_epic=e1:item=a"]'
    handoffs = run("-c", 'select(.result=="context-handoff")', ledger).splitlines()
    assert len(handoffs) == 1 and orjson.loads(handoffs[0])["cycle"] == 3
    assert run("-r", "select(.result != null) | .cycle", ledger).split() == ["1", "2", "3"]
