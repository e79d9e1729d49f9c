"""Ledger entries (docs/DESIGN.md §3) built from a cycle's facts: pure, so every field is testable."""

from __future__ import annotations

from typing import Any

from evolve.agent.report import AgentReport
from evolve.cycle.budget import ContextReading


def base_entry(
    *,
    cycle: int,
    result: str,
    timestamp: str,
    title: str,
    source: str,
    work_ref: str | None,
    mode: str,
    session_id: str | None,
    fire_id: str,
) -> dict[str, Any]:
    """The fields every entry has. ``target`` is the work ref (SPEC §3: upstream's one-liners select
    on it), ``idle`` when there is none; the item's title has its own field, ``title``."""
    out: dict[str, Any] = {
        "cycle": cycle,
        "result": result,
        "timestamp": timestamp,
        "target": work_ref or "idle",
        "selected_source": source,
        "work_ref": work_ref,
        "mode": mode,
        "session_id": session_id,
        "fire_id": fire_id,
    }
    if title and title != "idle":
        out["title"] = title
    return out


def agent_fields(report: AgentReport, reading: ContextReading | None) -> dict[str, Any]:
    """Texts come scrubbed (``agent.report.redacted``, before these caps) and the ledger redacts at its sink."""
    out: dict[str, Any] = {
        "duration_s": report.duration_s,
        "num_turns": report.num_turns,
        "cost_usd": report.cost_usd,
        "usage": report.usage.as_json(),
        "agent_result": report.result,
    }
    if report.disposition:
        out["disposition"] = report.disposition
    if report.summary:
        out["summary"] = report.summary[:500]
    if reading is not None:
        out["context_pct"] = reading.pct
        out["context_heavy"] = reading.heavy
        out["context_signal"] = reading.signal
    if report.warnings:
        out["report_warnings"] = report.warnings  # field names and counts only: nothing to redact
    if report.error_class:
        out["error_class"] = report.error_class
        out["error"] = report.error[:300]
    return out


REVERTED = frozenset({"regressed", "failed", "crashed"})


def last_attempt_note(entries: list[dict[str, Any]], ref: str) -> str:
    """Why the newest attempt at ``ref`` did not stand, for the agent's next try at it (pure).

    Only when that newest attempt was reverted (regressed, failed or crashed): once the item has
    landed or been worked on successfully, an old red is no longer news. Untrusted ledger text: the
    prompt builder redacts and cleans it; here it is bounded.
    """
    for e in reversed(entries):
        if e.get("work_ref") != ref or e.get("selected_source") in ("idle", "metronome-gate-blocked"):
            continue
        if e.get("result") not in REVERTED:
            return ""
        why = e.get("gate_detail") or e.get("error") or e.get("error_class") or str(e.get("result"))
        note = f"cycle {e.get('cycle')} ({e.get('result')}): {str(why)[:300]}"
        output = e.get("gate_output")
        if isinstance(output, str) and output.strip():
            note += f"\noutput tail:\n{output[:600]}"
        return note
    return ""
