"""Resume or start fresh (docs/DESIGN.md §5.1): a pure decision per cycle."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from evolve.store.records import AgentSession

FIRST = "first"
CONTINUATION = "continuation"
RETURNING = "returning"


@dataclass(frozen=True)
class ModeDecision:
    mode: str
    session_id: str  # the id the run uses (a new one on First)
    resume: bool  # whether the runner resumes ``session_id``
    need_stale: bool
    turn_gap: bool
    reason: str


def choose_mode(
    session: AgentSession | None,
    work_ref: str,
    *,
    events_since: int,
    fresh_start_turns: int,
    handoff_requested: bool = False,
    new_id: str | None = None,
) -> ModeDecision:
    """First / Continuation / Returning, with Returning downgraded to First when stale.

    ``events_since`` counts what happened since the session's last cycle that it did not see.
    ``fresh_start_turns == 0`` disables the turn-gap rule (an explicit state, not "default").
    """
    fresh = new_id or str(uuid.uuid4())
    if session is None or not session.id:
        return ModeDecision(FIRST, fresh, False, False, False, "no prior session")
    if session.ended_heavy:
        return ModeDecision(FIRST, fresh, False, False, False, "prior session ended in a context-handoff")
    if handoff_requested:
        return ModeDecision(FIRST, fresh, False, False, False, "handoff continue requested")
    need_stale = session.need_ref != work_ref
    turn_gap = fresh_start_turns > 0 and events_since >= fresh_start_turns
    sid = session.id
    if events_since == 0 and not need_stale:
        return ModeDecision(CONTINUATION, sid, True, False, False, "same session, same work, no events between")
    if need_stale or turn_gap:
        why = []
        if need_stale:
            why.append("need stale: work item changed")
        if turn_gap:
            why.append(f"turn gap: {events_since} events >= {fresh_start_turns}")
        return ModeDecision(FIRST, fresh, False, need_stale, turn_gap, "; ".join(why))
    return ModeDecision(RETURNING, sid, True, False, False, f"{events_since} intervening events")


def after_run(
    session: AgentSession | None,
    decision: ModeDecision,
    *,
    runner: str,
    cycle: int,
    work_ref: str,
    reported_id: str | None,
    summary: str,
    head: str | None = None,
) -> AgentSession:
    """The ``agent_session`` record after a cycle that ran the agent."""
    sid = reported_id or decision.session_id
    if decision.mode == FIRST or session is None:
        return AgentSession(
            id=sid,
            runner=runner,
            started_cycle=cycle,
            last_cycle=cycle,
            need_ref=work_ref,
            need_set_at=cycle,
            events_since=0,
            ended_heavy=False,
            summary=summary[:2000],
            last_head=head,
        )
    return replace(
        session, id=sid, last_cycle=cycle, events_since=0, summary=summary[:2000] or session.summary, last_head=head
    )


def note_event(session: AgentSession | None, n: int = 1) -> AgentSession | None:
    """An intervening event (a cycle that ran no agent on this session) widens the gap."""
    if session is None:
        return session
    return replace(session, events_since=session.events_since + n)
