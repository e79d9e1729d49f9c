"""Cycles whose green work waited in a chain, settled once the chain lands or cannot (docs/DESIGN.md §8.3).

Each gets the ledger entry that says so (``mode: "land"``, ``pending_cycle``): what the gate judged
(``improved`` as a rule) with the sha now on the branch, or ``failed``/``land_conflict`` when it never
could land; its item's claim is finalized or released; the chain's record and pending ref go; what
landed is pushed. Safe to repeat after a death: an entry already written is not written again, and the
record keeps the chain's fate until the entries are.
"""

from __future__ import annotations

from typing import Any

from evolve.cycle.context import FireContext
from evolve.results import LAND_FAILED, LAND_MODE, SUCCESS, CycleResult, is_landing
from evolve.timeutil import utc_iso
from evolve.work.item import SourceError, WorkItem

SEEN_TAIL = 2000  # ledger entries looked back through for a settling entry already written


def waiting(ctx: FireContext, ws: Any, publisher: Any) -> None:
    """Record and settle what ``ws.settled`` holds (the workspace's landings filled it), then forget it."""
    settled, ws.settled = list(ws.settled), []
    if not settled:
        ws.done()
        return
    seen = {e.get("pending_cycle") for e in ctx.ledger.tail(SEEN_TAIL).entries if is_landing(e)}
    stamp = utc_iso(ctx.clock())
    for s in settled:
        h = s.held
        item = WorkItem(source=h.source, ref=h.work_ref, title=h.title)
        if h.cycle not in seen:
            gated = CycleResult(h.result) if h.result in SUCCESS else CycleResult.IMPROVED
            entry = ctx.entry(ctx.ledger.last_cycle() + 1, gated if s.landed else CycleResult.FAILED, item,
                              h.source, LAND_MODE, stamp)
            entry.update(pending_cycle=h.cycle, landed=s.landed, cycle_start_sha=h.start or None)
            if s.landed:
                entry["sha"] = s.sha
            else:
                entry.update(error_class=LAND_FAILED, error=s.detail[:300], unlanded_ref=s.ref)
            ctx.ledger.append(entry)
            ctx.emit("cycle.end", entry=entry)
            ctx.log.info("land.settled", pending_cycle=h.cycle, landed=s.landed, sha=s.sha, ref=h.work_ref)
        src = ctx.source(h.source)
        try:
            if src is not None and s.landed:
                src.finalize(item, h.claimed_by, stamp)
            elif src is not None:
                src.release(item, h.claimed_by or None, stamp, CycleResult.PENDING)  # no failed_at: not its fault
        except SourceError as exc:
            ctx.log.warning("claim.error", ref=h.work_ref, error=str(exc)[:300])
    for branch in sorted({s.branch for s in settled if s.branch}):
        ws.forget(branch)
        last = next((s.sha for s in reversed(settled) if s.branch == branch and s.landed and s.sha), None)
        if last and publisher is not None:
            publisher.landed(branch, last)
    ctx.state.last_logged_cycle = ctx.ledger.last_cycle()
    ctx.save()
    ws.done()
