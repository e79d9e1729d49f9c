"""Which session a cycle runs in, which prompt blocks lead it, and the session after it — pure.

One module for the whole agent-side plan of a cycle (docs/DESIGN.md §5, §7), so the rules are not
split between the session decision, the hand-off handling and the shell:

- :func:`plan_cycle` takes a :class:`PlanInput` (the loop's session, the work item, the counted
  intervening events, a pending operator hand-off and its text, the remembered facts, a post-compact
  block) and returns an :class:`AgentPlan`: the mode decision, the fork parent and the orientation.
- :func:`session_after` takes the plan and what the run reported and returns the loop's session
  afterwards, the post-compact block for the next resumed run, and whether the hand-off was used.

Hand-off requests: a pending ``continue`` makes the cycle First, with the artifact as
``[Prior session summary]``. A pending ``fork`` runs the cycle as a fork of the current session —
for the claude runner ``--resume <parent> --fork-session --session-id <child>``, otherwise (or with
no resumable parent) a fresh session seeded with the artifact. The parent stays the loop's session;
the child's summary is handed back to the parent's next run. A ``compact_boundary`` in cycle N's
run (route (b) of the reference notes, which also works where hooks do not run): the state block the
compact hook re-injects leads cycle N+1's prompt when N+1 resumes that session.

The shell (:mod:`evolve.cycle.fire`) does the reading (git, the request file, learnings, the
cycle-state for the compaction block) and the writing (consuming the request, saving the state).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from evolve.agent import prompt
from evolve.agent.prompt import Orientation
from evolve.agent.report import AgentReport
from evolve.agent.session import FIRST, ModeDecision, after_run, choose_mode
from evolve.harness.handoff import CONTINUE, FORK, Request
from evolve.results import CycleResult
from evolve.store.records import AgentSession, PostCompact
from evolve.work.item import WorkItem, clean_text

FORK_MODE = "fork"  # the agent mode of a real fork run (--resume --fork-session)
FORK_HEADER = "[Fork hand-off] (requested by the operator; the Purpose is this run's focus)\n"


@dataclass(frozen=True)
class PlanInput:
    cycle: int
    work: WorkItem
    session: AgentSession | None  # the loop's agent session as the cycle starts
    runner: str
    foreign_commits: int  # commits on HEAD since the session's last run that the loop did not make
    fresh_start_turns: int
    now: float
    request: Request | None = None  # an operator's pending ``evolve handoff``
    request_text: str = ""  # its artifact, read by the shell
    restorative: bool = False
    facts: tuple[str, ...] = ()  # remembered facts: learnings, then percepts
    post_compact: PostCompact | None = None
    new_id: str | None = None  # the First session's id (tests and --dry-run pin it)
    last_attempt: str = ""  # why the previous attempt at this item was reverted (cycle.entry.last_attempt_note)


@dataclass(frozen=True)
class AgentPlan:
    cycle: int
    decision: ModeDecision
    orientation: Orientation
    parent: AgentSession | None  # the loop's session when the cycle was planned
    request: Request | None = None
    fork_from: str | None = None  # the session a real fork resumes


@dataclass(frozen=True)
class SessionAfter:
    session: AgentSession | None
    post_compact: PostCompact | None
    consume_request: bool  # the shell marks the operator's hand-off request used


def plan_cycle(inp: PlanInput) -> AgentPlan:
    """Resume or start fresh, and the orientation the run gets (shared by fires and --dry-run)."""
    session, request = inp.session, inp.request
    events = session.events_since if session is not None else 0
    fork_from = None
    if request is not None and request.mode == FORK:
        decision, fork_from = fork_decision(session, inp.runner, inp.new_id)
    else:
        decision = choose_mode(
            session,
            inp.work.ref,
            events_since=events + inp.foreign_commits,
            fresh_start_turns=inp.fresh_start_turns,
            handoff_requested=request is not None,
            new_id=inp.new_id,
        )
    digest = ""
    if session is not None and (events or inp.foreign_commits):
        digest = (
            f"{events} cycle(s) ran without this session; "
            f"{inp.foreign_commits} commit(s) landed from outside the loop"
        )
    orientation = prompt.build(
        cycle=inp.cycle,
        mode=decision.mode,
        work=inp.work,
        prior_summary=_prior_summary(inp, decision.mode),
        restorative=inp.restorative,
        facts=list(inp.facts),
        events=_with_handback(digest, session) if decision.mode != FIRST else "",
        now=inp.now,
        last_attempt=inp.last_attempt,
    )
    orientation = _lead(orientation, inp, decision)
    return AgentPlan(inp.cycle, decision, orientation, session, request, fork_from)


def fork_decision(
    session: AgentSession | None, runner: str, new_id: str | None
) -> tuple[ModeDecision, str | None]:
    """The mode of a fork cycle and the parent it forks from (None: a fresh seeded session)."""
    child = new_id or str(uuid.uuid4())
    parent = session.resumable_id if session is not None else None
    if runner == "claude" and parent:
        return ModeDecision(FORK_MODE, child, True, False, False, f"handoff fork of session {parent}"), parent
    why = "handoff fork: a fresh session seeded with the fork artifact"
    if not parent:
        why += " (no resumable parent session)"
    return ModeDecision(FIRST, child, False, False, False, why), None


def _prior_summary(inp: PlanInput, mode: str) -> str:
    if mode != FIRST:
        return ""
    if inp.request is not None and inp.request.mode == CONTINUE and inp.request_text:
        return inp.request_text
    return inp.session.summary if inp.session is not None else ""


def _with_handback(digest: str, session: AgentSession | None) -> str:
    hb = session.fork_handback if session is not None else None
    if not isinstance(hb, dict):
        return digest
    line = (
        f"a fork of this session (child {clean_text(hb.get('child', '?'), 80)}, cycle {hb.get('cycle')}, "
        f"purpose: {clean_text(hb.get('purpose', ''), 300)}) handed back: {clean_text(hb.get('summary', ''), 1000)}"
    )
    return f"{digest}\n{line}" if digest else line


def _lead(orientation: Orientation, inp: PlanInput, decision: ModeDecision) -> Orientation:
    """Blocks that lead the dynamic part (the top of a resumed run's prompt)."""
    blocks: list[str] = []
    pc = inp.post_compact
    if pc is not None and decision.resume and decision.mode != FORK_MODE and pc.session_id == decision.session_id:
        blocks.append(pc.text)
    if inp.request is not None and inp.request.mode == FORK:
        blocks.append(FORK_HEADER + inp.request_text)
    if not blocks:
        return orientation
    return replace(orientation, dynamic="\n".join(blocks) + "\n" + orientation.dynamic)


def entry_fields(plan: AgentPlan | None, report: AgentReport) -> dict[str, Any]:
    """Ledger fields of a hand-off cycle: the mode, the artifact, and parent and child session ids."""
    if plan is None or plan.request is None:
        return {}
    req, parent_rec = plan.request, plan.parent
    parent = (
        plan.fork_from
        or (parent_rec.resumable_id if parent_rec is not None else None)
        or (parent_rec.id if parent_rec is not None and parent_rec.id else None)
        or req.parent_session_id
    )
    out: dict[str, Any] = {
        "handoff_mode": req.mode,
        "handoff_artifact": req.artifact.name,
        "parent_session_id": parent,
        "child_session_id": report.session_id or plan.decision.session_id,
    }
    if req.mode == FORK:
        out["handoff_purpose"] = req.purpose
        out["fork_session"] = plan.decision.mode == FORK_MODE
    return out


def used(plan: AgentPlan | None, result: str, report: AgentReport) -> bool:
    """Whether the cycle consumed its hand-off (an interrupted or rate-limited run did not)."""
    return (
        plan is not None
        and plan.request is not None
        and result != CycleResult.INTERRUPTED
        and report.error_class != "limit"
    )


def session_after(
    plan: AgentPlan,
    report: AgentReport,
    *,
    result: str,
    runner: str,
    work_ref: str,
    head: str | None,
    compact_text: str | None,
) -> SessionAfter:
    """The loop's agent session after the cycle, the next post-compact block, and the request's fate.

    ``compact_text`` is the re-inject block the shell read when the run reported a compaction.
    """
    d = plan.decision
    updated: AgentSession | None = after_run(
        plan.parent, d, runner=runner, cycle=plan.cycle, work_ref=work_ref, reported_id=report.session_id,
        summary=report.summary, head=head,
    )
    post = None
    if report.compacted and compact_text is not None:
        post = PostCompact(session_id=report.session_id or d.session_id, cycle=plan.cycle, text=compact_text)
    request, parent = plan.request, plan.parent
    if request is None:
        if updated is not None and updated.fork_handback is not None and d.mode != FIRST:
            updated = replace(updated, fork_handback=None)  # delivered in this run
        return SessionAfter(updated, post, False)
    if not used(plan, result, report):
        return SessionAfter(parent if request.mode == FORK else updated, post, False)
    if request.mode == FORK and parent is not None and parent.id:
        handback = {
            "child": report.session_id or d.session_id,
            "cycle": plan.cycle,
            "purpose": request.purpose,
            "summary": report.summary[:1000],
        }
        return SessionAfter(replace(parent, events_since=parent.events_since + 1, fork_handback=handback), post, True)
    return SessionAfter(updated, post, True)
