"""What a pending hand-off and a compaction do to the next cycle: the fire's side of SPEC §7.

- A pending ``continue`` makes the cycle First, with the artifact as ``[Prior session summary]``.
- A pending ``fork`` runs the cycle as a fork of the current session: for the claude runner
  ``--resume <parent> --fork-session --session-id <child>``; otherwise (or with no resumable
  parent) a fresh session seeded with the artifact. The parent stays the loop's session; the
  child's summary is handed back to the parent's next run. Parent and child go in the ledger.
- A ``compact_boundary`` in cycle N's run (route (b) of the reference notes, which also works
  where hooks do not run, e.g. ``--bare``): the same state block the compact hook re-injects is put
  at the top of cycle N+1's prompt when N+1 resumes that session.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from evolve.agent.prompt import Orientation
from evolve.agent.report import AgentReport
from evolve.agent.session import FIRST, ModeDecision
from evolve.harness import handoff, hooks
from evolve.paths import Paths
from evolve.work.item import clean_text

FORK = "fork"  # the agent mode of a real fork run (--resume --fork-session)


@dataclass(frozen=True)
class CyclePlan:
    cycle: int
    request: handoff.Request | None
    parent: dict[str, Any] | None  # the loop's agent session when the cycle was planned
    fork_from: str | None = None


def _resumable_id(session: dict[str, Any] | None) -> str | None:
    if not session or session.get("ended_heavy"):
        return None
    sid = session.get("id")
    return sid if isinstance(sid, str) and sid else None


def fork_decision(session: dict[str, Any] | None, runner: str, new_id: str | None) -> tuple[ModeDecision, str | None]:
    """The mode of a fork cycle and the parent it forks from (None: a fresh seeded session)."""
    child = new_id or str(uuid.uuid4())
    parent = _resumable_id(session)
    if runner == "claude" and parent:
        return ModeDecision(FORK, child, True, False, False, f"handoff fork of session {parent}"), parent
    why = "handoff fork: a fresh session seeded with the fork artifact"
    if not parent:
        why += " (no resumable parent session)"
    return ModeDecision(FIRST, child, False, False, False, why), None


def prior_summary(request: handoff.Request | None, session: dict[str, Any] | None, mode: str) -> str:
    if mode != FIRST:
        return ""
    if request is not None and request.mode == handoff.CONTINUE:
        text = request.text()
        if text:
            return text
    return str((session or {}).get("summary", ""))


def with_handback(digest: str, session: dict[str, Any] | None) -> str:
    hb = (session or {}).get("fork_handback")
    if not isinstance(hb, dict):
        return digest
    line = (
        f"a fork of this session (child {clean_text(hb.get('child', '?'), 80)}, cycle {hb.get('cycle')}, "
        f"purpose: {clean_text(hb.get('purpose', ''), 300)}) handed back: {clean_text(hb.get('summary', ''), 1000)}"
    )
    return f"{digest}\n{line}" if digest else line


def shape(
    orientation: Orientation,
    *,
    request: handoff.Request | None,
    decision: ModeDecision,
    post_compact: dict[str, Any] | None,
) -> Orientation:
    """Blocks that lead the dynamic part (the top of a resumed run's prompt)."""
    blocks: list[str] = []
    if (
        isinstance(post_compact, dict)
        and decision.resume
        and decision.mode != FORK
        and post_compact.get("session_id") == decision.session_id
        and isinstance(post_compact.get("text"), str)
    ):
        blocks.append(post_compact["text"])
    if request is not None and request.mode == handoff.FORK:
        blocks.append("[Fork hand-off] (requested by the operator; the Purpose is this run's focus)\n" + request.text())
    if not blocks:
        return orientation
    return replace(orientation, dynamic="\n".join(blocks) + "\n" + orientation.dynamic)


def entry_fields(plan: CyclePlan | None, decision: ModeDecision, report: AgentReport) -> dict[str, Any]:
    """Ledger fields of a hand-off cycle: the mode, the artifact, and parent and child session ids."""
    if plan is None or plan.request is None:
        return {}
    req = plan.request
    parent = plan.fork_from or _resumable_id(plan.parent) or (plan.parent or {}).get("id") or req.parent_session_id
    out: dict[str, Any] = {
        "handoff_mode": req.mode,
        "handoff_artifact": req.artifact.name,
        "parent_session_id": parent,
        "child_session_id": report.session_id or decision.session_id,
    }
    if req.mode == handoff.FORK:
        out["handoff_purpose"] = req.purpose
        out["fork_session"] = decision.mode == FORK
    return out


def used(plan: CyclePlan | None, result: str, report: AgentReport) -> bool:
    """Whether the cycle consumed its hand-off (an interrupted or rate-limited run did not)."""
    return plan is not None and plan.request is not None and result != "interrupted" and report.error_class != "limit"


def after_cycle(
    paths: Paths,
    plan: CyclePlan | None,
    *,
    updated: dict[str, Any] | None,
    decision: ModeDecision,
    report: AgentReport,
    result: str,
    cycle: int,
    now: float,
) -> dict[str, Any] | None:
    """The loop's agent session after the cycle; consumes the request when the cycle used it."""
    request = plan.request if plan is not None else None
    if request is None:
        if updated and "fork_handback" in updated and decision.mode != FIRST:
            updated = {k: v for k, v in updated.items() if k != "fork_handback"}  # delivered in this run
        return updated
    parent = plan.parent if plan is not None else None
    if not used(plan, result, report):
        return parent if request.mode == handoff.FORK else updated
    handoff.consume(paths, request, now)
    if request.mode == handoff.FORK and parent and parent.get("id"):
        out = dict(parent)
        events = out.get("events_since")
        out["events_since"] = (events if isinstance(events, int) else 0) + 1
        out["fork_handback"] = {
            "child": report.session_id or decision.session_id,
            "cycle": cycle,
            "purpose": request.purpose,
            "summary": report.summary[:1000],
        }
        return out
    return updated


def post_compact(
    paths: Paths, report: AgentReport, decision: ModeDecision, cycle: int, now: float
) -> dict[str, Any] | None:
    """The state block to lead the next run of this session, when this run was compacted."""
    if not report.compacted:
        return None
    got = hooks.reinject_text(paths.repo, paths.cycle_state, now, at_phase="agent")  # compactions happen there
    if got is None:
        return None
    return {"session_id": report.session_id or decision.session_id, "cycle": cycle, "text": got[0]}
