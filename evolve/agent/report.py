"""The one report every runner produces, and parsing of the command runner's JSON report file."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from evolve.results import CycleResult as R

# The results an agent may claim; the gate decides the rest (regressed, a downgrade to unchanged).
AGENT_RESULTS = tuple(str(r) for r in (R.IMPROVED, R.HARVESTED, R.SCOUT, R.UNCHANGED, R.FAILED))
ERROR_CLASSES = ("limit", "transient", "fatal", "timeout", "crashed", "interrupted")


def _finite_nonneg(v: Any) -> bool:
    """A usable count or amount: a real number (not a bool), not negative, not inf/nan."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return v >= 0 and (isinstance(v, int) or math.isfinite(v))


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        """What occupied the context window on the call (output excluded)."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def as_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
        }

    @classmethod
    def parse(cls, obj: Any) -> Usage:
        if not isinstance(obj, dict):
            return cls()

        def num(k: str) -> int:
            v = obj.get(k, 0)
            # Bounded so the ledger (64-bit JSON integers) can always record it: 1e20 tokens is garbage.
            return int(v) if _finite_nonneg(v) and v < 2**63 else 0

        return cls(
            num("input_tokens"),
            num("output_tokens"),
            num("cache_read_input_tokens"),
            num("cache_creation_input_tokens"),
        )


@dataclass(frozen=True)
class AgentReport:
    result: str  # improved | harvested | scout | unchanged | failed
    disposition: str = ""
    summary: str = ""
    new_work: list[dict[str, Any]] = field(default_factory=list)
    percepts: list[str] = field(default_factory=list)
    session_id: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    num_turns: int = 0
    duration_s: float = 0.0
    context_window: int = 0
    context_heavy: bool = False  # the agent's own "context too heavy" signal
    compacted: bool = False  # a compaction happened during the run
    context_overflow: bool = False  # the run aborted because the context overflowed
    error_class: str | None = None
    error: str = ""
    exit_code: int | None = None
    retryable: bool = False  # an infrastructure error worth another try (5xx, overloaded, network)


def _str(v: Any, limit: int = 4000) -> str:
    return v[:limit] if isinstance(v, str) else ""


def parse_report(obj: Any) -> AgentReport:
    """Build a report from the agent's JSON object; anything unusable is a ``failed`` report."""
    if not isinstance(obj, dict):
        return AgentReport("failed", error_class="crashed", error="report is not a JSON object")
    result = obj.get("result")
    if result not in AGENT_RESULTS:
        return AgentReport("failed", error_class="crashed", error=f"report result {result!r} is not valid")
    new_work = obj.get("new_work")
    percepts = obj.get("percepts")
    cost = obj.get("cost_usd", 0)
    window = obj.get("context_window", 0)
    turns = obj.get("num_turns", 0)
    err = obj.get("error_class")
    return AgentReport(
        result=result,
        disposition=_str(obj.get("disposition"), 500),
        summary=_str(obj.get("summary")),
        new_work=[w for w in new_work if isinstance(w, dict)] if isinstance(new_work, list) else [],
        percepts=[p[:500] for p in percepts if isinstance(p, str)][:20] if isinstance(percepts, list) else [],
        session_id=obj["session_id"] if isinstance(obj.get("session_id"), str) and obj["session_id"] else None,
        usage=Usage.parse(obj.get("usage")),
        cost_usd=float(cost) if _finite_nonneg(cost) else 0.0,
        num_turns=turns if isinstance(turns, int) and not isinstance(turns, bool) and turns >= 0 else 0,
        context_window=window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else 0,
        context_heavy=obj.get("context_heavy") is True,
        compacted=obj.get("compacted") is True,
        context_overflow=obj.get("context_overflow") is True,
        error_class=(err if err in ERROR_CLASSES else "transient") if result == "failed" else None,
        error=_str(obj.get("error"), 500),
    )
