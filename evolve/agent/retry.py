"""Whether to run the agent again after a failed run (docs/DESIGN.md §5 error taxonomy), as a pure decision.

``limit``: wait for the reset (Retry-After) when it fits the fire's remaining budget, else give up
so the fire can end with 75 and keep the item. ``transient`` infrastructure errors: bounded
exponential backoff. Everything else is not retried.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evolve.agent.report import AgentReport

LIMIT_DEFAULT_WAIT_S = 60.0
MAX_LIMIT_WAITS = 3
_RETRY_AFTER = re.compile(r"retry_after=([0-9.]+)s")


@dataclass(frozen=True)
class Retry:
    retry: bool
    wait_s: float = 0.0
    reason: str = ""


def retry_after(report: AgentReport) -> float | None:
    m = _RETRY_AFTER.search(report.error)
    return float(m.group(1)) if m else None


def decide(report: AgentReport, attempt: int, *, remaining_s: float, transient_retries: int, backoff_s: float) -> Retry:
    if report.result != "failed":
        return Retry(False)
    if report.error_class == "limit":
        wait = retry_after(report)
        wait = LIMIT_DEFAULT_WAIT_S if wait is None else wait
        if attempt < MAX_LIMIT_WAITS and wait < remaining_s:
            return Retry(True, wait, f"rate limited; waiting {wait:g}s for the reset")
        return Retry(False, wait, "rate limited beyond the fire's budget")
    retryable = report.error_class == "transient" and report.retryable and not report.context_overflow
    wait = backoff_s * (2**attempt)
    if retryable and attempt < transient_retries and wait < remaining_s:
        return Retry(True, wait, f"transient error; retry {attempt + 1} of {transient_retries}")
    return Retry(False)
