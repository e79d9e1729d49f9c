"""The post-cycle transition (docs/DESIGN.md §4.2-§4.4, §8) as tables: no repo, no process, no clock."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolve import exitcodes
from evolve.cycle.transition import (
    Breaker,
    ClaimAction,
    CycleFacts,
    Park,
    Policy,
    Stop,
    after_cycle,
    after_handoff,
    claim_action,
)
from evolve.results import SUCCESS, CycleResult
from evolve.store.records import AgentSession
from evolve.store.session_state import SessionState

R = CycleResult
POLICY = Policy(max_attempts=3, breaker_failures=3, breaker_cooldown_s=1800, streak_limit=2)
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def facts(result: CycleResult = R.IMPROVED, **kw: Any) -> CycleFacts:
    base: dict[str, Any] = {"cycle": 7, "result": result, "work_ref": "e1#0", "source": "harvested",
                            "mode": "harvested:bug", "now": NOW}
    base.update(kw)
    return CycleFacts(**base)


def state(**kw: Any) -> SessionState:
    s = SessionState(claimed_work={"ref": "e1#0", "cycle": 7}, last_logged_cycle=6)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


# -- the claim --------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("result", "heavy", "want"),
    [
        (R.IMPROVED, False, ClaimAction.FINALIZE),
        (R.HARVESTED, False, ClaimAction.FINALIZE),
        (R.UNCHANGED, False, ClaimAction.FINALIZE),
        (R.IMPROVED, True, ClaimAction.RELEASE),  # a heavy cycle parks its item for a fresh session
        (R.HARVESTED, True, ClaimAction.RELEASE),
        (R.REGRESSED, False, ClaimAction.RELEASE),
        (R.FAILED, False, ClaimAction.RELEASE),
        (R.SCOUT, False, ClaimAction.RELEASE),
        (R.INTERRUPTED, False, ClaimAction.RELEASE),
        (R.CRASHED, False, ClaimAction.RELEASE),
    ],
)
def test_claim_rule(result: CycleResult, heavy: bool, want: ClaimAction) -> None:
    assert claim_action(result, heavy=heavy) is want
    assert claim_action(str(result), heavy=heavy) is want  # as read back from the ledger
    assert after_cycle(state(), facts(result, heavy=heavy), POLICY).claim is want


def test_settled_claim_is_left_alone() -> None:
    t = after_cycle(state(attempts={"e1#0": 2}), facts(R.SCOUT, claim_settled=True), POLICY)
    assert t.claim is ClaimAction.NONE and t.park is None
    assert t.state.attempts == {"e1#0": 2} and t.state.claimed_work is None


def test_unknown_result_strings_release() -> None:
    assert claim_action("None", heavy=False) is ClaimAction.RELEASE
    assert claim_action("context-handoff", heavy=False) is ClaimAction.RELEASE


# -- the attempt budget and parking -------------------------------------------------------

@pytest.mark.parametrize(
    ("result", "error_class", "heavy", "before", "attempts_after", "parks"),
    [
        (R.FAILED, "transient", False, {}, {"e1#0": 1}, False),
        (R.REGRESSED, "", False, {"e1#0": 1}, {"e1#0": 2}, False),
        (R.FAILED, "timeout", False, {"e1#0": 2}, {}, True),  # third attempt: parked, count cleared
        (R.FAILED, "limit", False, {"e1#0": 2}, {"e1#0": 2}, False),  # a rate limit is not an attempt
        (R.FAILED, "interrupted", False, {"e1#0": 2}, {"e1#0": 2}, False),
        (R.FAILED, "fatal", False, {"e1#0": 2}, {"e1#0": 2}, False),  # infrastructure: not the item's fault
        (R.REGRESSED, "", True, {"e1#0": 2}, {"e1#0": 2}, False),  # heavy: hand-off, not the item's fault
        (R.SCOUT, "", False, {"e1#0": 2}, {"e1#0": 2}, False),
        (R.INTERRUPTED, "", False, {"e1#0": 2}, {"e1#0": 2}, False),
        (R.IMPROVED, "", False, {"e1#0": 2, "x": 1}, {"x": 1}, False),  # success clears its count
    ],
)
def test_attempt_budget(
    result: CycleResult, error_class: str, heavy: bool, before: dict[str, int], attempts_after: dict[str, int],
    parks: bool,
) -> None:
    t = after_cycle(state(attempts=before), facts(result, error_class=error_class, heavy=heavy), POLICY)
    assert t.state.attempts == attempts_after
    assert (t.park is not None) is parks
    if parks:
        assert t.park == Park(f"evolve: parked after 3 failed attempts (last: {result} {error_class})", 3)


def test_parked_items_are_remembered_until_the_item_lands() -> None:
    """Issue 16: `status` lists what the attempt budget parked; `evolve requeue` (or a landing) clears it."""
    t = after_cycle(state(attempts={"e1#0": 2}, parked_items=["old"]), facts(R.REGRESSED), POLICY)
    assert t.park is not None and t.state.parked_items == ["old", "e1#0"]
    t = after_cycle(state(parked_items=["e1#0", "old"]), facts(R.FAILED, error_class="transient"), POLICY)
    assert t.state.parked_items == ["old", "e1#0"]  # worked again and failed again: still parked
    t = after_cycle(state(parked_items=["e1#0", "old"]), facts(R.IMPROVED), POLICY)
    assert t.state.parked_items == ["old"]


def test_park_note_without_error_class_is_trimmed() -> None:
    t = after_cycle(state(attempts={"e1#0": 2}), facts(R.REGRESSED), POLICY)
    assert t.park is not None and t.park.note == "evolve: parked after 3 failed attempts (last: regressed )"


def test_success_unparks_and_heavy_parks() -> None:
    t = after_cycle(state(parked_work=["e1#0", "b"]), facts(R.IMPROVED), POLICY)
    assert t.state.parked_work == ["b"]
    t = after_cycle(state(parked_work=["b"]), facts(R.UNCHANGED, heavy=True), POLICY)
    assert t.state.parked_work == ["b", "e1#0"]
    t = after_cycle(state(parked_work=["e1#0"]), facts(R.FAILED, heavy=True), POLICY)
    assert t.state.parked_work == ["e1#0"]


# -- the breaker ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("result", "error_class", "failures", "until", "want_failures", "want_until", "change"),
    [
        (R.FAILED, "transient", 0, None, 1, None, None),
        (R.FAILED, "crashed", 1, None, 2, None, None),
        (R.FAILED, "timeout", 2, None, 3, "2026-01-01T00:30:00Z", Breaker.OPEN),
        (R.FAILED, "fatal", 5, "2025-12-31T23:00:00Z", 6, "2026-01-01T00:30:00Z", Breaker.OPEN),  # half-open probe
        # Issue 16: an infrastructure error (missing binary, HTTP 401) opens it at once, first failure or not.
        (R.FAILED, "fatal", 0, None, 1, "2026-01-01T00:30:00Z", Breaker.OPEN),
        (R.FAILED, "limit", 2, None, 2, None, None),  # rate limits never count
        (R.INTERRUPTED, "", 2, None, 2, None, None),  # neither counts nor resets
        (R.REGRESSED, "", 2, None, 0, None, Breaker.CLOSED),
        (R.IMPROVED, "", 0, "2025-12-31T23:00:00Z", 0, None, Breaker.CLOSED),
        (R.UNCHANGED, "", 0, None, 0, None, None),
        (R.SCOUT, "", 1, None, 0, None, Breaker.CLOSED),
    ],
)
def test_breaker(
    result: CycleResult, error_class: str, failures: int, until: str | None, want_failures: int,
    want_until: str | None, change: Breaker | None,
) -> None:
    t = after_cycle(
        state(consecutive_failures=failures, breaker_open_until=until), facts(result, error_class=error_class), POLICY
    )
    assert (t.state.consecutive_failures, t.state.breaker_open_until, t.breaker) == (want_failures, want_until, change)
    opened = [e for e in t.effects if e.event == "breaker.open"]
    assert bool(opened) is (change is Breaker.OPEN)
    if opened:
        cause = "infrastructure error (fatal)" if error_class == "fatal" else f"{want_failures} failed cycles in a row"
        assert opened[0].notify and dict(opened[0].fields) == {
            "failures": want_failures, "until": want_until, "cause": cause, "remedy": "evolve breaker reset, once fixed"
        }


# -- stops and exit codes -------------------------------------------------------------------

@pytest.mark.parametrize(
    ("result", "error_class", "streak", "heavy", "failures", "stop", "code", "handoff"),
    [
        (R.IMPROVED, "", 1, True, 0, None, exitcodes.OK, False),  # improved resets the streak
        (R.UNCHANGED, "", 1, True, 0, Stop.CONTEXT_HANDOFF, exitcodes.OK, True),
        (R.UNCHANGED, "", 0, True, 0, None, exitcodes.OK, False),
        (R.INTERRUPTED, "", 1, True, 0, Stop.INTERRUPTED, exitcodes.SIGTERM, False),
        (R.FAILED, "limit", 1, True, 0, Stop.RATE_LIMITED, exitcodes.TEMPFAIL, False),
        (R.FAILED, "fatal", 0, False, 0, Stop.AGENT_FATAL, exitcodes.ERROR, False),
        (R.FAILED, "fatal", 0, False, 2, Stop.AGENT_FATAL, exitcodes.ERROR, False),  # fatal outranks the breaker
        (R.FAILED, "transient", 0, False, 2, Stop.BREAKER_OPEN, exitcodes.OK, False),
        (R.FAILED, "commit_failed", 0, False, 0, Stop.COMMIT_FAILED, exitcodes.ERROR, False),
        (R.FAILED, "commit_failed", 0, False, 2, Stop.COMMIT_FAILED, exitcodes.ERROR, False),  # outranks the breaker
        (R.FAILED, "transient", 1, True, 2, Stop.CONTEXT_HANDOFF, exitcodes.OK, True),  # hand-off outranks it
        (R.SCOUT, "", 0, False, 0, None, exitcodes.OK, False),
    ],
)
def test_stop_and_exit_code(
    result: CycleResult, error_class: str, streak: int, heavy: bool, failures: int, stop: Stop | None, code: int,
    handoff: bool,
) -> None:
    t = after_cycle(
        state(context_streak=streak, consecutive_failures=failures),
        facts(result, error_class=error_class, heavy=heavy),
        POLICY,
    )
    assert (t.stop, t.exit_code, t.handoff) == (stop, code, handoff)


def test_streak_limit_comes_from_policy() -> None:
    t = after_cycle(state(context_streak=1), facts(R.UNCHANGED, heavy=True), replace(POLICY, streak_limit=3))
    assert t.state.context_streak == 2 and not t.handoff and t.stop is None
    changed = [e for e in t.effects if e.event == "context.streak"]
    assert len(changed) == 1 and changed[0].fields["limit"] == 3


# -- bookkeeping ----------------------------------------------------------------------------

def test_bookkeeping_fields() -> None:
    before = state(percepts=[f"p{i}" for i in range(19)], last_mode="harvested:bug", mode_repeat_streak=2)
    t = after_cycle(before, facts(R.IMPROVED, percepts=("new1", "new2")), POLICY)
    s = t.state
    assert s.percepts == [*(f"p{i}" for i in range(1, 19)), "new1", "new2"]
    assert (s.last_logged_cycle, s.last_result, s.last_mode, s.last_selected_source) == (
        7, "improved", "harvested:bug", "harvested")
    assert s.mode_repeat_streak == 3 and s.claimed_work is None


@pytest.mark.parametrize(
    ("result", "last_mode", "streak_before", "want"),
    [
        (R.IMPROVED, "harvested:bug", 2, 3),
        (R.REGRESSED, "harvested:bug", 2, 3),
        (R.HARVESTED, "beads:task", 4, 1),
        (R.UNCHANGED, "harvested:bug", 2, 2),  # not productive: unchanged count
        (R.FAILED, "harvested:bug", 2, 2),
        (R.SCOUT, None, 0, 0),
    ],
)
def test_metronome_streak(result: CycleResult, last_mode: str | None, streak_before: int, want: int) -> None:
    t = after_cycle(state(last_mode=last_mode, mode_repeat_streak=streak_before), facts(result), POLICY)
    assert t.state.mode_repeat_streak == want


@pytest.mark.parametrize(
    ("source", "result", "era", "landed"),
    [
        ("directive", R.IMPROVED, "era1", ["era1|e1#0"]),
        ("directive", R.UNCHANGED, "era1", []),
        ("directive", R.IMPROVED, None, []),
        ("goal", R.IMPROVED, "era1", []),
    ],
)
def test_landed_directives(source: str, result: CycleResult, era: str | None, landed: list[str]) -> None:
    t = after_cycle(state(), facts(result, source=source, directive_era=era), POLICY)
    assert t.state.landed_directives == landed


@pytest.mark.parametrize(
    ("result", "has_new_work", "want"),
    [(R.IMPROVED, True, True), (R.HARVESTED, True, True), (R.UNCHANGED, True, True), (R.REGRESSED, True, False),
     (R.FAILED, True, False), (R.SCOUT, True, False), (R.IMPROVED, False, False)],
)
def test_follow_ups_queued_only_when_the_work_stands(result: CycleResult, has_new_work: bool, want: bool) -> None:
    assert after_cycle(state(), facts(result, has_new_work=has_new_work), POLICY).queue_new_work is want


def test_after_handoff() -> None:
    s = after_handoff(state(context_streak=2, agent_session=AgentSession(id="s1", summary="x")), 8)
    assert (s.last_logged_cycle, s.last_result, s.context_streak) == (8, "context-handoff", 0)
    assert s.agent_session == AgentSession(id="s1", summary="x", ended_heavy=True)
    assert after_handoff(state(), 3).agent_session is None


# -- properties -----------------------------------------------------------------------------

results = st.sampled_from(list(CycleResult))
errors = st.sampled_from(["", "limit", "transient", "fatal", "timeout", "crashed", "interrupted"])


@given(
    result=results, error_class=errors, heavy=st.booleans(), streak=st.integers(0, 5),
    failures=st.integers(0, 5), attempts=st.integers(0, 5), settled=st.booleans(),
)
def test_transition_is_pure_and_consistent(
    result: CycleResult, error_class: str, heavy: bool, streak: int, failures: int, attempts: int, settled: bool
) -> None:
    tried = {"e1#0": attempts} if attempts else {}
    before = state(context_streak=streak, consecutive_failures=failures, attempts=tried)
    snapshot = copy.deepcopy(before.to_dict())
    f = facts(result, error_class=error_class, heavy=heavy, claim_settled=settled)
    t = after_cycle(before, f, POLICY)
    assert before.to_dict() == snapshot  # the input is never changed
    assert t == after_cycle(before, f, POLICY)  # same snapshot, same decision
    assert t.state.last_result == result and t.state.last_logged_cycle == 7
    if t.claim is ClaimAction.FINALIZE:
        assert result in SUCCESS and not heavy and "e1#0" not in t.state.attempts
    if t.park is not None:
        assert t.claim is ClaimAction.RELEASE and "e1#0" not in t.state.attempts
    assert t.handoff is (t.stop is Stop.CONTEXT_HANDOFF)
    if t.stop is None:
        assert t.exit_code == exitcodes.OK and t.state.context_streak < POLICY.streak_limit
