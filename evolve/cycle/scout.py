"""What the agent's answers do to the queue (docs/DESIGN.md §6.5): scout dispositions, follow-ups.

A scout's ``split`` queues the children (``discovered_from`` the parent) and annotates the parent,
``defer`` sets a disposition the ladder skips, ``park`` blocks the item for an operator: each through
the item's own :class:`~evolve.work.item.WorkSource`. Follow-up work an agent reports after work that
stands is appended to the harvested queue, deduplicated against open and consumed items.
"""

from __future__ import annotations

from typing import Any

from evolve.agent.report import AgentReport
from evolve.cycle.context import FireContext
from evolve.timeutil import utc_iso
from evolve.work import generators
from evolve.work.item import SourceError, WorkItem, keys_of

PARK_NOTE = "scope too big; needs operator triage"


def apply(ctx: FireContext, cycle: int, item: WorkItem, report: AgentReport, claimer: str) -> None:
    """Release the scouted item, then split, defer or park it as the agent's disposition says."""
    now = utc_iso(ctx.clock())
    disp = report.disposition.strip()
    kind = disp.split(":", 1)[0].strip().lower()
    reason = disp.split(":", 1)[1].strip() if ":" in disp else disp
    src = ctx.source(item.source)
    try:
        if src is not None:
            src.release(item, claimer, now, "scout")
        if kind == "split" and report.new_work:
            children = [{**c, "discovered_from": item.ref} for c in report.new_work]
            queue_new_work(ctx, cycle, children, epic=f"scout-split:{item.ref}")
            if src is not None:
                src.split(item, now, children)
        elif kind == "defer" and src is not None:
            src.defer(item, now, reason)
        elif kind == "park" and src is not None:
            src.park(item, now, reason or PARK_NOTE)
    except (SourceError, OSError) as exc:
        ctx.log.error("scout.error", error=str(exc)[:300])
    ctx.log.info("cycle.scout", cycle=cycle, ref=item.ref, disposition=disp)


def queue_new_work(ctx: FireContext, cycle: int, items: list[dict[str, Any]], *, epic: str) -> int:
    """Follow-up work the agent reported, appended to the harvested queue (deduplicated)."""
    defaults = {"description": "", "type": "task", "severity": "medium", "source": "evolve-cycle"}
    clean = [{**defaults, **it} for it in items if isinstance(it.get("title"), str) and it["title"].strip()]
    harvested = ctx.selector.harvested
    fresh = generators.dedup(clean, harvested.known_keys(keys_of(clean)))
    if fresh:
        entry = generators.generator_entry(fresh, utc_iso(ctx.clock()))
        entry["source_epic"] = epic
        harvested.append_entry(entry)
        ctx.log.info("queue.appended", cycle=cycle, count=len(fresh), epic=epic)
    return len(fresh)
