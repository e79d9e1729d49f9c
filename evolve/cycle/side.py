"""Cycles that run no agent (docs/DESIGN.md §6.3, §6.5, §6.6): quarantine, metronome block, idle.

Each appends its ledger entry and updates the state; an idle pass also walks the dormancy rule
(:func:`evolve.work.dormancy.empty_pass`) and may write DORMANT (burst) or ``blocked.jsonl`` (loop).
"""

from __future__ import annotations

from typing import Any

import orjson

from evolve import redact
from evolve.agent.session import note_event
from evolve.cycle import pending
from evolve.cycle.context import FireContext
from evolve.cycle.entry import base_entry
from evolve.results import CycleResult
from evolve.store.atomic import atomic_write_bytes
from evolve.store.jsonl import append_bytes
from evolve.timeutil import utc_iso
from evolve.work import dormancy, ladder
from evolve.work.item import WorkItem

METRONOME_SOURCE = "metronome-gate-blocked"
RESCOPE_REMEDY = "write .agents/evolve/RESCOPE with the new direction"


def quarantined(ctx: FireContext, item: WorkItem, flips: int, entries: list[dict[str, Any]]) -> None:
    """An oscillating goal is skipped, and that is logged once per era."""
    cycle = ctx.ledger.last_cycle() + 1
    entry = ctx.entry(cycle, CycleResult.QUARANTINED, item, item.source, ladder.work_mode(item))
    entry["oscillations"] = flips
    ctx.ledger.append(entry)
    entries.append(entry)
    ctx.state.last_logged_cycle = cycle
    ctx.save()
    ctx.log.warning("goal.quarantined", cycle=cycle, ref=item.ref, flips=flips)


def metronome_blocked(ctx: FireContext, cycle: int, sel: ladder.Selection, entries: list[dict[str, Any]]) -> None:
    """The same shape five times in a row: an ``unchanged`` block until an operator writes RESCOPE."""
    top = next((c for c in sel.considered if "hard block" in c.verdict), None)
    item = WorkItem(source=METRONOME_SOURCE, ref=top.ref if top else "", title=top.title if top else "")
    entry = ctx.entry(cycle, CycleResult.UNCHANGED, item, METRONOME_SOURCE, sel.blocked_mode or "")
    entry["reason"] = sel.reason
    entry["remedy"] = RESCOPE_REMEDY
    ctx.ledger.append(entry)
    entries.append(entry)
    st = ctx.state
    # Notified when the stall starts, not on every blocked fire after it (the ledger shows each one).
    starts = st.last_selected_source != METRONOME_SOURCE
    st.last_logged_cycle = cycle
    st.last_result, st.last_selected_source = str(CycleResult.UNCHANGED), METRONOME_SOURCE
    ctx.save()
    fields = {"cycle": cycle, "mode": sel.blocked_mode, "reason": sel.reason, "remedy": RESCOPE_REMEDY}
    ctx.log.warning("metronome.blocked", **fields)
    if starts:
        ctx.emit("metronome.blocked", **fields)


def idle(ctx: FireContext, cycle: int, errors: tuple[str, ...], mode: str, entries: list[dict[str, Any]]) -> None:
    """Nothing to do (or a source could not say): an idle entry, then the dormancy rule."""
    now = ctx.clock()
    entry = base_entry(
        cycle=cycle,
        result=CycleResult.UNCHANGED,
        timestamp=utc_iso(now),
        title="idle",
        source="idle",
        work_ref=None,
        mode="idle",
        session_id=ctx.session_id(),
        fire_id=ctx.fire_id,
    )
    if errors:
        entry["probe_error"] = True
    ctx.ledger.append(entry)
    entries.append(entry)
    ctx.log.info("cycle.idle", cycle=cycle, probe_error=bool(errors))
    st = ctx.state
    st.last_logged_cycle = cycle
    st.last_result, st.last_mode, st.last_selected_source = str(CycleResult.UNCHANGED), "idle", "idle"
    st.agent_session = note_event(st.agent_session)
    if errors:
        # A probe error is never "empty": it must not walk the loop towards DORMANT.
        blocked(ctx, cycle, now, "source probe error: " + "; ".join(errors)[:500])
        ctx.save()
        return
    step = dormancy.empty_pass(st.idle_streak, st.generator_empty_streak, mode)
    st.idle_streak, st.generator_empty_streak = step.idle_streak, step.generator_empty_streak
    if step.action == "dormant" and pending.held_refs(ctx.paths.pending):
        # Green commits still wait to land: that is work, so no DORMANT (the next fire tries to land them).
        ctx.log.info("dormant.not_written", cycle=cycle, reason="green commits wait to land")
    elif step.action == "dormant":
        text = f"cycle {cycle}\n{utc_iso(now)}\n{dormancy.REASON}\n"
        atomic_write_bytes(ctx.paths.dormant, text.encode())
        ctx.log.info("dormant.written", cycle=cycle)
    elif step.action == "blocked":
        blocked(ctx, cycle, now, dormancy.REASON, needed="queue empty; operator adds work or a marker")
    ctx.save()


def blocked(ctx: FireContext, cycle: int, now: float, reason: str, needed: str | None = None) -> None:
    """A ``blocked.jsonl`` row: why the loop could not go on, and what it needs."""
    row: dict[str, Any] = {"cycle": cycle, "timestamp": utc_iso(now), "reason": reason}
    if needed:
        row["needed_context"] = needed
    try:
        append_bytes(ctx.paths.blocked, orjson.dumps(redact.current().json(row), option=orjson.OPT_APPEND_NEWLINE))
    except OSError as exc:  # e.g. a symlink planted in its place: refused, and the fire goes on
        ctx.log.error("blocked.error", cycle=cycle, path=str(ctx.paths.blocked), error=str(exc)[:300])
        return
    ctx.log.info("blocked.logged", cycle=cycle, reason=reason)
