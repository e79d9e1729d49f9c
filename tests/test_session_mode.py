"""Resume or start fresh (docs/DESIGN.md §5): choose_mode / after_run / note_event are pure decisions."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolve.agent.session import CONTINUATION, FIRST, RETURNING, ModeDecision, choose_mode
from evolve.agent.session import after_run as _after_run
from evolve.agent.session import note_event as _note_event
from evolve.store.records import AgentSession

SID = "11111111-2222-3333-4444-555555555555"


def session(**kw: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "id": SID,
        "runner": "command",
        "started_cycle": 1,
        "last_cycle": 3,
        "need_ref": "bd-1",
        "need_set_at": 1,
        "events_since": 0,
        "ended_heavy": False,
        "summary": "worked on bd-1",
    }
    s.update(kw)
    return s


def choose(sess: dict[str, Any] | None, ref: str = "bd-1", events: int = 0, turns: int = 8, **kw: Any) -> ModeDecision:
    rec = AgentSession.from_json(sess)
    return choose_mode(rec, ref, events_since=events, fresh_start_turns=turns, new_id="new-id", **kw)


# The record as session-state.json holds it: the functions take and give typed records.
def after_run(old: dict[str, Any] | None, d: ModeDecision, **kw: Any) -> dict[str, Any]:
    return _after_run(AgentSession.from_json(old), d, **kw).to_json()


def note_event(s: dict[str, Any] | None, n: int = 1) -> dict[str, Any] | None:
    out = _note_event(AgentSession.from_json(s), n)
    return None if out is None else out.to_json()


# -- First ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sess", [None, {}, {"id": ""}, {"id": None}, {"id": 7}, {"need_ref": "bd-1"}])
def test_first_without_a_session(sess: dict[str, Any] | None) -> None:
    d = choose(sess)
    assert d.mode == FIRST and d.session_id == "new-id" and not d.resume
    assert not d.need_stale and not d.turn_gap
    assert "no prior session" in d.reason


def test_first_after_heavy_end_even_for_same_work_and_no_events() -> None:
    d = choose(session(ended_heavy=True))
    assert d.mode == FIRST and d.session_id == "new-id" and not d.resume
    assert "context-handoff" in d.reason


def test_first_when_handoff_continue_requested() -> None:
    d = choose(session(), handoff_requested=True)
    assert d.mode == FIRST and d.session_id == "new-id" and not d.resume
    assert "handoff" in d.reason


def test_first_generates_a_fresh_uuid_without_new_id() -> None:
    d1 = choose_mode(None, "x", events_since=0, fresh_start_turns=8)
    d2 = choose_mode(None, "x", events_since=0, fresh_start_turns=8)
    assert d1.session_id != d2.session_id
    uuid.UUID(d1.session_id)
    assert d1.session_id != SID


# -- Continuation / Returning --------------------------------------------------------------------------


def test_continuation_same_ref_zero_events() -> None:
    d = choose(session(), "bd-1", events=0)
    assert d.mode == CONTINUATION
    assert d.session_id == SID and d.resume
    assert not d.need_stale and not d.turn_gap


@pytest.mark.parametrize("events", [1, 2, 7])
def test_returning_with_events_same_ref_below_gap(events: int) -> None:
    d = choose(session(), "bd-1", events=events, turns=8)
    assert d.mode == RETURNING
    assert d.session_id == SID and d.resume
    assert not d.need_stale and not d.turn_gap
    assert str(events) in d.reason


def test_need_stale_downgrades_to_first() -> None:
    for events in (0, 1, 3):
        d = choose(session(), "bd-2", events=events)
        assert d.mode == FIRST and d.session_id == "new-id" and not d.resume
        assert d.need_stale and not d.turn_gap
        assert "need stale" in d.reason and "turn gap" not in d.reason


@pytest.mark.parametrize(("events", "turns"), [(8, 8), (9, 8), (1, 1), (100, 8), (3, 3)])
def test_turn_gap_downgrades_to_first(events: int, turns: int) -> None:
    d = choose(session(), "bd-1", events=events, turns=turns)
    assert d.mode == FIRST and d.session_id == "new-id" and not d.resume
    assert d.turn_gap and not d.need_stale
    assert "turn gap" in d.reason and "need stale" not in d.reason
    assert str(events) in d.reason and str(turns) in d.reason


def test_turn_gap_just_below_threshold_is_returning() -> None:
    assert choose(session(), events=7, turns=8).mode == RETURNING
    assert choose(session(), events=8, turns=8).mode == FIRST


@pytest.mark.parametrize("events", [1, 8, 9, 10_000])
def test_threshold_zero_disables_turn_gap(events: int) -> None:
    d = choose(session(), "bd-1", events=events, turns=0)
    assert d.mode == RETURNING and d.resume and d.session_id == SID
    assert not d.turn_gap


def test_threshold_zero_does_not_disable_need_stale() -> None:
    d = choose(session(), "bd-9", events=50, turns=0)
    assert d.mode == FIRST and d.need_stale and not d.turn_gap


def test_reason_names_both_causes() -> None:
    d = choose(session(), "bd-2", events=9, turns=8)
    assert d.mode == FIRST
    assert d.need_stale and d.turn_gap
    assert "need stale" in d.reason and "turn gap" in d.reason


def test_session_without_need_ref_is_stale() -> None:
    d = choose(session(need_ref=None), "bd-1", events=0)
    assert d.mode == FIRST and d.need_stale


@given(
    has_session=st.booleans(),
    ended_heavy=st.booleans(),
    handoff=st.booleans(),
    same_ref=st.booleans(),
    events=st.integers(0, 30),
    turns=st.integers(0, 30),
)
def test_mode_table(has_session: bool, ended_heavy: bool, handoff: bool, same_ref: bool, events: int,
                    turns: int) -> None:
    sess = session(ended_heavy=ended_heavy) if has_session else None
    d = choose(sess, "bd-1" if same_ref else "bd-2", events=events, turns=turns, handoff_requested=handoff)
    if not has_session or ended_heavy or handoff:
        want = FIRST
    elif same_ref and events == 0:
        want = CONTINUATION
    elif not same_ref or (turns > 0 and events >= turns):
        want = FIRST
    else:
        want = RETURNING
    assert d.mode == want
    assert d.resume == (want != FIRST)
    assert d.session_id == (SID if d.resume else "new-id")


# -- after_run -------------------------------------------------------------------------------------------


def test_after_run_first_builds_fresh_record() -> None:
    old = session(ended_heavy=True, started_cycle=1, events_since=4, custom="kept?")
    d = choose(old, "bd-7")
    rec = after_run(old, d, runner="claude", cycle=12, work_ref="bd-7", reported_id=None, summary="s" * 5000,
                    head="abc123")
    assert rec == {
        "id": "new-id",
        "runner": "claude",
        "started_cycle": 12,
        "last_cycle": 12,
        "need_ref": "bd-7",
        "need_set_at": 12,
        "events_since": 0,
        "ended_heavy": False,
        "summary": "s" * 2000,
        "last_head": "abc123",
    }


def test_after_run_first_prefers_reported_session_id() -> None:
    d = choose(None, "bd-1")
    rec = after_run(None, d, runner="claude", cycle=1, work_ref="bd-1", reported_id="from-agent", summary="")
    assert rec["id"] == "from-agent"
    assert rec["ended_heavy"] is False


@pytest.mark.parametrize("events", [0, 3])
def test_after_run_resumed_updates_in_place(events: int) -> None:
    old = session(events_since=events, extra_field={"a": 1})
    d = choose(old, "bd-1", events=events)
    assert d.mode in (CONTINUATION, RETURNING)
    rec = after_run(old, d, runner="claude", cycle=9, work_ref="bd-1", reported_id=None, summary="more")
    assert rec["id"] == SID
    assert rec["last_cycle"] == 9
    assert rec["events_since"] == 0
    assert rec["started_cycle"] == old["started_cycle"]
    assert rec["need_set_at"] == old["need_set_at"]
    assert rec["need_ref"] == "bd-1"
    assert rec["summary"] == "more"
    assert rec["extra_field"] == {"a": 1}
    assert old["last_cycle"] == 3 and old["events_since"] == events, "input not mutated"


def test_after_run_resumed_keeps_summary_when_new_one_empty() -> None:
    old = session()
    d = choose(old)
    rec = after_run(old, d, runner="claude", cycle=4, work_ref="bd-1", reported_id=SID, summary="")
    assert rec["summary"] == "worked on bd-1"


# -- note_event ------------------------------------------------------------------------------------------


def test_note_event_increments() -> None:
    s = session(events_since=2)
    out = note_event(s)
    assert out is not None and out["events_since"] == 3
    assert s["events_since"] == 2, "input not mutated"
    out2 = note_event(out, 5)
    assert out2 is not None and out2["events_since"] == 8


def test_note_event_without_session_or_counter() -> None:
    assert note_event(None) is None
    s = session()
    del s["events_since"]
    out = note_event(s)
    assert out is not None and out["events_since"] == 1
    bad = note_event(session(events_since="x"))
    assert bad is not None and bad["events_since"] == 1


def test_events_accumulate_into_a_turn_gap() -> None:
    s: dict[str, Any] | None = session()
    for _ in range(7):
        s = note_event(s)
    assert s is not None
    assert choose(s, events=s["events_since"]).mode == RETURNING
    s = note_event(s)
    assert s is not None
    assert choose(s, events=s["events_since"]).mode == FIRST
