"""Failing goals and GOALS.md directives turned into work items for the ladder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evolve.work.goals.model import Directive, Goal, GoalsFile
from evolve.work.goals.output import cap_output, strip_control
from evolve.work.item import WorkItem, clean_text


def _results(snap: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    goals = snap.get("goals") if isinstance(snap, Mapping) else None
    if not isinstance(goals, list):
        return {}
    return {str(e["goal_id"]): e for e in goals if isinstance(e, dict) and "goal_id" in e}


def failing_goals(snap: dict[str, Any], gf: GoalsFile) -> list[Goal]:
    """Goals of the current file whose latest result is ``fail``, heaviest first, then by id."""
    latest = _results(snap)
    failing = [g for g in gf.goals if latest.get(g.id, {}).get("result") == "fail"]
    return sorted(failing, key=lambda g: (-g.weight, g.id))


def severity_for(weight: int) -> str:
    return "high" if weight >= 7 else "medium" if weight >= 4 else "low"


def goal_item(goal: Goal, snap_entry: dict[str, Any] | None) -> WorkItem:
    """A failing goal as work: the agent gets the check to make pass and what it printed last time."""
    output = snap_entry.get("output") if isinstance(snap_entry, dict) else None
    parts = [f"Make the goal check pass (exit 0): {goal.check}"]
    if isinstance(output, str) and output.strip():
        parts.append(f"Last output:\n{cap_output(output)}")
    return WorkItem(
        source="goal",
        ref=f"goal:{goal.id}",
        title=clean_text(f"Fix failing goal {goal.id}: {goal.description}"),
        description="\n\n".join(parts),
        type="goal",
        severity=severity_for(goal.weight),
        data={"goal_id": goal.id, "weight": goal.weight, "check": goal.check},
    )


def directive_item(d: Directive, era: str) -> WorkItem:
    """A GOALS.md directive as work; ``era`` ties it to the file content it was read from."""
    parts = [strip_control(d.description).strip()]
    if d.steer:
        parts.append(f"Steer: {d.steer}")
    if d.scenarios:
        parts.append(f"Scenarios: {d.scenarios}")
    return WorkItem(
        source="directive",
        ref=f"directive:{d.directive_id or d.number}",
        title=clean_text(f"Directive {d.number}: {d.title}"),
        description="\n\n".join(p for p in parts if p),
        type="directive",
        data={
            "number": d.number,
            "era": era,
            "directive_id": d.directive_id,
            "steer": d.steer,
            "scenarios": d.scenarios,
        },
    )
