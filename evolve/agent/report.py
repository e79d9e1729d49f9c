"""The one report every runner produces, and parsing of the command runner's JSON report file."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from evolve import redact
from evolve.results import CycleResult as R

# The results an agent may claim; the gate decides the rest (regressed, a downgrade to unchanged).
AGENT_RESULTS = tuple(str(r) for r in (R.IMPROVED, R.HARVESTED, R.SCOUT, R.UNCHANGED, R.FAILED))
# ``commit_failed`` (results.COMMIT_FAILED) is evolve's own: an agent claiming it gets ``transient``,
# so it cannot buy its item out of the attempt budget.
ERROR_CLASSES = ("limit", "transient", "fatal", "timeout", "crashed", "interrupted")


# An agent's report is untrusted input (docs/DESIGN.md §5.3): every text is capped, every number checked,
# and the follow-up work it proposes is bounded and stripped of queue lifecycle fields. What was
# changed is listed in ``AgentReport.warnings`` (field names and counts only, never the agent's text).
SUMMARY_CAP = 4000
DISPOSITION_CAP = 500
ERROR_CAP = 500
PERCEPT_CAP = 500
PERCEPTS_MAX = 20
SESSION_ID_CAP = 256  # longer is not an id: dropped (a truncated id would name another session)
TITLE_CAP = 500
DESCRIPTION_CAP = 4000
ITEM_BYTES_MAX = 16 * 1024  # one proposed item as JSON, after the caps above: bigger ones are dropped
NEW_WORK_PARSED_MAX = 1000  # what a report may carry at all; work.max_new_work bounds what is queued
INT_MAX = 2**63 - 1  # the ledger's JSON integers are 64-bit

# Fields evolve writes as an item moves through the queue (docs/DESIGN.md §6.1). An agent proposing
# them could queue work already claimed, consumed, blocked or deferred: they are dropped, so every
# proposed item enters the queue available.
LIFECYCLE_FIELDS = frozenset(
    {
        "claim_status",
        "claimed_by",
        "claimed_at",
        "consumed",
        "consumed_by",
        "consumed_at",
        "status",
        "failed_at",
        "blocked_note",
        "disposition",
        "split_into",
        "scouted_at",
    }
)


def _finite_nonneg(v: Any) -> bool:
    """A usable count or amount: a real number (not a bool), not negative, not inf/nan."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return v >= 0 and (isinstance(v, int) or math.isfinite(v))


def loads_report(raw: bytes | str) -> Any:
    """A report's JSON. Strict first; failing that, once more with ``NaN``/``Infinity`` accepted (as NaN),
    which Python's ``json.dumps`` writes for a non-finite float: such a report is not thrown away whole,
    its numbers are zeroed with a warning by :func:`parse_report`. Raises ``ValueError`` when not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        strict_error = exc
    try:
        obj = json.loads(raw, parse_constant=lambda _: math.nan)
        orjson.dumps(obj)  # what the strict parser would also refuse (lone surrogates, huge ints, nesting)
    except (ValueError, TypeError, RecursionError, orjson.JSONEncodeError):
        raise strict_error from None
    return obj


def strip_lifecycle(item: dict[str, Any]) -> dict[str, Any]:
    """A proposed work item without the queue's lifecycle fields (see :data:`LIFECYCLE_FIELDS`)."""
    return {k: v for k, v in item.items() if k not in LIFECYCLE_FIELDS}


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
        return cls.parse_checked(obj)[0]

    @classmethod
    def parse_checked(cls, obj: Any) -> tuple[Usage, list[str]]:
        """The usage, and a warning for each count that was present but unusable (recorded as 0)."""
        if not isinstance(obj, dict):
            return cls(), ([] if obj is None else ["usage: not an object (recorded as zeros)"])
        warnings: list[str] = []

        def num(k: str) -> int:
            v = obj.get(k, 0)
            # Bounded so the ledger (64-bit JSON integers) can always record it: 1e20 tokens is garbage.
            if _finite_nonneg(v) and v <= INT_MAX:
                return int(v)
            warnings.append(f"usage.{k}: not a finite non-negative number (recorded as 0)")
            return 0

        usage = cls(
            num("input_tokens"),
            num("output_tokens"),
            num("cache_read_input_tokens"),
            num("cache_creation_input_tokens"),
        )
        return usage, warnings


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
    warnings: list[str] = field(default_factory=list)  # what was capped, dropped or zeroed while parsing


class _Checked:
    """Reads one untrusted report object, noting every value it caps, drops or zeroes."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.warnings: list[str] = []

    def text(self, key: str, cap: int) -> str:
        v = self.obj.get(key)
        if v is None:
            return ""
        if not isinstance(v, str):
            self.warnings.append(f"{key}: not a string (dropped)")
            return ""
        if len(v) > cap:
            self.warnings.append(f"{key}: {len(v)} chars capped to {cap}")
        return v[:cap]

    def amount(self, key: str) -> float:
        v = self.obj.get(key, 0)
        if _finite_nonneg(v):
            return float(v)
        self.warnings.append(f"{key}: not a finite non-negative number (recorded as 0)")
        return 0.0

    def count(self, key: str) -> int:
        v = self.obj.get(key, 0)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT_MAX:
            return v
        self.warnings.append(f"{key}: not a non-negative 64-bit integer (recorded as 0)")
        return 0

    def usage(self) -> Usage:
        usage, warnings = Usage.parse_checked(self.obj.get("usage"))
        self.warnings += warnings
        return usage

    def session_id(self) -> str | None:
        sid = session_id_or_none(self.obj.get("session_id"))
        if sid is None and self.obj.get("session_id") not in (None, ""):
            self.warnings.append(f"session_id: not a printable string of at most {SESSION_ID_CAP} chars (dropped)")
        return sid

    def percepts(self) -> list[str]:
        raw = self.obj.get("percepts")
        if not isinstance(raw, list):
            return []
        texts = [p for p in raw if isinstance(p, str)]
        if len(texts) > PERCEPTS_MAX:
            self.warnings.append(f"percepts: {len(texts)}, kept {PERCEPTS_MAX}")
        if any(len(p) > PERCEPT_CAP for p in texts[:PERCEPTS_MAX]):
            self.warnings.append(f"percepts: capped to {PERCEPT_CAP} chars each")
        return [p[:PERCEPT_CAP] for p in texts[:PERCEPTS_MAX]]

    def new_work(self) -> list[dict[str, Any]]:
        raw = self.obj.get("new_work")
        if not isinstance(raw, list):
            return []
        items = [w for w in raw if isinstance(w, dict)]
        if len(items) > NEW_WORK_PARSED_MAX:
            self.warnings.append(f"new_work: {len(items)} items, kept {NEW_WORK_PARSED_MAX}")
        out, stripped, oversized = [], 0, 0
        for item in items[:NEW_WORK_PARSED_MAX]:
            clean = proposed_item(item)
            stripped += len(item) - len(strip_lifecycle(item))
            if clean is None:
                oversized += 1
            else:
                out.append(clean)
        if stripped:
            self.warnings.append(f"new_work: {stripped} lifecycle fields stripped")
        if oversized:
            self.warnings.append(f"new_work: {oversized} items over {ITEM_BYTES_MAX} bytes dropped")
        return out


def session_id_or_none(v: Any) -> str | None:
    """A session id an agent reported, when it can be one: a short printable string (it names a file
    and goes on a command line)."""
    if isinstance(v, str) and v and len(v) <= SESSION_ID_CAP and v.isprintable():
        return v
    return None


def proposed_item(item: dict[str, Any]) -> dict[str, Any] | None:
    """One follow-up an agent proposed, fit for the queue: lifecycle fields stripped, title and
    description capped; None when it is still bigger than :data:`ITEM_BYTES_MAX` as JSON."""
    clean = strip_lifecycle(item)
    for key, cap in (("title", TITLE_CAP), ("description", DESCRIPTION_CAP)):
        if isinstance(clean.get(key), str):
            clean[key] = clean[key][:cap]
    try:
        size = len(orjson.dumps(clean))
    except (TypeError, orjson.JSONEncodeError):  # not JSON-shaped (a runner handing over Python objects)
        return None
    return clean if size <= ITEM_BYTES_MAX else None


# A fenced ``evolve-report`` block on lines of its own (the prompt's report protocol).
REPORT_BLOCK = re.compile(r"^[ \t]*```evolve-report[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


def last_report_block(text: str) -> str | None:
    """The body of the LAST fenced ``evolve-report`` block in ``text`` (an agent's stdout), or None.

    The last one wins: an agent that quotes the protocol, or reports twice, means its final word.
    """
    blocks = REPORT_BLOCK.findall(text or "")
    return blocks[-1] if blocks else None


def parse_report(obj: Any) -> AgentReport:
    """Build a report from the agent's JSON object; anything unusable is a ``failed`` report.

    Untrusted input: texts are capped, numbers checked, proposed work bounded and stripped; each such
    change is listed in ``warnings`` (the fire logs them as ``agent.report_sanitized``).
    """
    if not isinstance(obj, dict):
        return AgentReport("failed", error_class="crashed", error="report is not a JSON object")
    result = obj.get("result")
    if result not in AGENT_RESULTS:
        return AgentReport("failed", error_class="crashed", error=f"report result {result!r:.100} is not valid")
    c = _Checked(obj)
    err = obj.get("error_class")
    return AgentReport(
        result=result,
        disposition=c.text("disposition", DISPOSITION_CAP),
        summary=c.text("summary", SUMMARY_CAP),
        new_work=c.new_work(),
        percepts=c.percepts(),
        session_id=c.session_id(),
        usage=c.usage(),
        cost_usd=c.amount("cost_usd"),
        num_turns=c.count("num_turns"),
        context_window=c.count("context_window"),
        context_heavy=obj.get("context_heavy") is True,
        compacted=obj.get("compacted") is True,
        context_overflow=obj.get("context_overflow") is True,
        error_class=(err if err in ERROR_CLASSES else "transient") if result == "failed" else None,
        error=c.text("error", ERROR_CAP),
        warnings=c.warnings,
    )


def redacted(report: AgentReport) -> AgentReport:
    """The agent's own texts lose any secret as they arrive, before anything truncates them (a cut
    secret's prefix would no longer match) or they reach the next prompt; every sink redacts again."""
    r = redact.current()
    return replace(
        report,
        summary=r.text(report.summary),
        disposition=r.text(report.disposition),
        error=r.text(report.error),
        percepts=[r.text(p) for p in report.percepts],
        new_work=r.json(report.new_work),
    )
