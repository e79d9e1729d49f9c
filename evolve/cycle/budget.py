"""The context budget (docs/DESIGN.md §4.3, the seed's rule): heavy-cycle signals and ``context_streak``."""

from __future__ import annotations

from dataclasses import dataclass

from evolve.agent.report import AgentReport

_OVERFLOW_TEXT = (
    "prompt is too long",
    "prompt too long",
    "context length",
    "context_length_exceeded",
    "maximum context",
    "context window",
)


@dataclass(frozen=True)
class ContextReading:
    pct: float | None  # occupancy of the context window, 0-100, when measurable
    heavy: bool
    signal: str  # why it is heavy ("" when it is not)


def _heavy_disposition(disposition: str) -> bool:
    d = disposition.lower().replace("_", "-").replace(" ", "-")
    return "context" in d and any(w in d for w in ("heavy", "budget", "overflow", "too-large", "exhaust"))


def read_context(report: AgentReport, *, heavy_pct: float, window_override: int = 0) -> ContextReading:
    """Every signal the report carries; the cycle is heavy when any of them holds."""
    signals: list[str] = []
    if report.result == "scout" and (_heavy_disposition(report.disposition) or report.context_heavy):
        signals.append("scout:context-too-heavy")
    elif report.result == "harvested" and (_heavy_disposition(report.disposition) or report.context_heavy):
        signals.append("harvest:context-budget-defer")
    elif report.context_heavy:
        signals.append("agent:context-heavy")
    err = report.error.lower()
    if report.context_overflow or (report.result == "failed" and any(t in err for t in _OVERFLOW_TEXT)):
        signals.append("overflow")
    if report.compacted:
        signals.append("compaction")
    window = window_override or report.context_window
    pct = None
    if window > 0 and report.usage.context_tokens > 0:
        raw = 100.0 * report.usage.context_tokens / window
        pct = round(raw, 2)
        if raw >= heavy_pct:  # compare the exact ratio: 39.999% is below 40 even though it rounds to 40.0
            signals.append(f"occupancy:{pct:g}%")
    return ContextReading(pct, bool(signals), ",".join(signals))


def next_streak(streak: int, *, heavy: bool, result: str) -> int:
    """+1 on a heavy cycle; 0 when an ``improved`` cycle lands (or waits to: ``pending``); otherwise unchanged."""
    if result in ("improved", "pending"):
        return 0
    return streak + 1 if heavy else streak


def handoff_due(streak: int, limit: int) -> bool:
    return streak >= limit
