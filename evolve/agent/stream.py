"""Claude Code ``--output-format stream-json`` parsed as it arrives (pure: bytes in, state out).

Only structured messages count: ``system/init`` (session id, model), ``system/compact_boundary``
(a compaction happened), ``system/api_retry`` (rate limits, overload), ``assistant`` messages
(per-turn usage — the last one measures occupancy; the final ``result.usage`` sums every turn and
overstates it) and the final ``result``. The transcript is never grepped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from evolve.agent.report import (
    INT_MAX,
    AgentReport,
    Usage,
    _finite_nonneg,
    loads_report,
    parse_report,
    session_id_or_none,
)

_REPORT_BLOCK = re.compile(r"```evolve-report[ \t]*\n(.*?)```", re.S)
_OVERFLOW = ("prompt is too long", "prompt too long", "context window", "context length")
_AUTH = (
    "authentication", "invalid x-api-key", "invalid api key", "oauth", "credit balance", "permission_error",
    "not logged in", "please run /login",
)
_NESTED = ("cannot be launched inside another claude code session", "nested session")
_INVALID_SESSION = "no conversation found with session id"


@dataclass
class JsonLines:
    """A CLI's JSON-lines event stream fed in chunks as it arrives; each object goes to :meth:`event`.
    The Claude, Codex and Gemini parsers are subclasses (one framing, one parser per CLI)."""

    malformed: int = 0  # lines that were not JSON: a torn last line when the process was killed
    _buf: bytes = b""

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self.line(line)

    def finish(self) -> None:
        if self._buf.strip():
            self.line(self._buf)
        self._buf = b""

    def line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.malformed += 1
            return
        if isinstance(msg, dict):
            self.event(msg)

    def event(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError


@dataclass
class StreamState(JsonLines):
    session_id: str | None = None
    model: str | None = None
    turns: int = 0
    compactions: int = 0
    last_usage: Usage = field(default_factory=Usage)
    retries: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None

    def event(self, msg: dict[str, Any]) -> None:
        kind, sub = msg.get("type"), msg.get("subtype")
        sid = session_id_or_none(msg.get("session_id"))
        if sid and not self.session_id:
            self.session_id = sid
        if kind == "system" and sub == "init":
            self.session_id = sid or self.session_id
            self.model = msg.get("model") if isinstance(msg.get("model"), str) else None
        elif kind == "system" and sub == "compact_boundary":
            self.compactions += 1
        elif kind == "system" and sub == "api_retry":
            self.retries.append(msg)
        elif kind == "assistant":
            message = msg.get("message") if isinstance(msg.get("message"), dict) else {}
            if message.get("model") != "<synthetic>":
                self.turns += 1
                self.last_usage = Usage.parse(message.get("usage"))
        elif kind == "result":
            self.result = msg

    def progress(self) -> dict[str, Any]:
        """What the heartbeat shows while the agent runs."""
        return {"turns": self.turns, "context_tokens": self.last_usage.context_tokens, "compactions": self.compactions}


def report_block(text: str) -> dict[str, Any] | None:
    """The last fenced ``evolve-report`` block of the final answer, when it is a JSON object."""
    blocks = _REPORT_BLOCK.findall(text or "")
    if not blocks:
        return None
    try:
        obj = loads_report(blocks[-1])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def context_window(result: dict[str, Any]) -> int:
    usage = result.get("modelUsage")
    if not isinstance(usage, dict):
        return 0
    windows = [m.get("contextWindow") for m in usage.values() if isinstance(m, dict)]
    return max((w for w in windows if isinstance(w, int) and not isinstance(w, bool) and w > 0), default=0)


def retry_after_s(state: StreamState) -> float | None:
    delays = [r.get("retry_delay_ms") for r in state.retries if r.get("error_status") == 429]
    delays = [d for d in delays if isinstance(d, int | float) and d >= 0]
    return delays[-1] / 1000 if delays else None


def _errors(result: dict[str, Any]) -> str:
    """The result's ``errors`` as text (a list is expected; anything else is taken as one value)."""
    errors = result.get("errors") or []
    return " ".join(map(str, errors)) if isinstance(errors, list) else str(errors)


def classify(result: dict[str, Any], output_tail: str) -> tuple[str | None, bool]:
    """``(error_class, context_overflow)`` for an error result (docs/DESIGN.md §5 taxonomy)."""
    text = f"{result.get('result') or ''} {_errors(result)}".lower()
    status = result.get("api_error_status")
    reason = str(result.get("terminal_reason") or "")
    if reason == "prompt_too_long" or any(t in text for t in _OVERFLOW):
        return "transient", True
    if status == 429 or "rate limit" in text or "usage limit" in text:
        return "limit", False
    if status in (401, 403) or any(t in text for t in _AUTH) or any(t in output_tail.lower() for t in _NESTED):
        return "fatal", False
    return "transient", False


def invalid_session(output_tail: str, result: dict[str, Any] | None) -> bool:
    res = result or {}
    text = f"{output_tail} {res.get('result') or ''} {_errors(res)}".lower()
    return _INVALID_SESSION in text


def to_report(state: StreamState, *, output_tail: str, window_override: int = 0) -> AgentReport:
    """The run's AgentReport: the agent's own block for its claim, the stream for everything else."""
    res = state.result
    if res is None:
        cls = "fatal" if any(t in output_tail.lower() for t in _NESTED + _AUTH) else "crashed"
        return AgentReport(
            "failed",
            session_id=state.session_id,
            error_class=cls,
            error=f"no result message: {output_tail.strip()[-300:]}",
            compacted=state.compactions > 0,
            usage=state.last_usage,
            num_turns=state.turns,
        )
    common = _result_fields(state, res)
    common["context_window"] = window_override or context_window(res)
    subtype = res.get("subtype")
    if res.get("is_error") or (isinstance(subtype, str) and subtype.startswith("error")):
        cls, overflow = classify(res, output_tail)
        if subtype == "error_max_turns":
            cls = "transient"
        detail = str(res.get("result") or subtype or "error")[:300]
        status = res.get("api_error_status")
        retryable = (
            cls == "transient"
            and not overflow
            and ((isinstance(status, int) and (status >= 500 or status == 408)) or "overloaded" in detail.lower())
        )
        return AgentReport(
            "failed", error_class=cls, error=detail, context_overflow=overflow, retryable=retryable, **common
        )
    block = report_block(str(res.get("result") or ""))
    if block is None:
        # No report block: the claim defaults to improved and the gate decides (docs/DESIGN.md §5: the agent's
        # word never decides "improved" anyway).
        return AgentReport(
            "improved", disposition="no report block", summary=str(res.get("result") or "")[:500], **common
        )
    return block_report(block, common)


def block_report(block: dict[str, Any], common: dict[str, Any]) -> AgentReport:
    """The agent's own report block, with what the stream (not the agent) says laid over it."""
    parsed = parse_report(block)
    return AgentReport(
        **{
            **parsed.__dict__,
            **common,
            "context_heavy": parsed.context_heavy,
            "compacted": parsed.compacted or common.get("compacted", False),
            "warnings": [*parsed.warnings, *common.get("warnings", [])],
        }
    )


def _result_fields(state: StreamState, res: dict[str, Any]) -> dict[str, Any]:
    """What the stream itself says about the run; numbers the CLI (or whatever answers as it) got
    wrong are recorded as 0 (or the stream's own count) with a warning, never as NaN or a negative."""
    warnings: list[str] = []
    sid, turns, cost = res.get("session_id"), res.get("num_turns"), res.get("total_cost_usd")
    if not _finite_nonneg(cost) and cost is not None:
        warnings.append("total_cost_usd: not a finite non-negative number (recorded as 0)")
    counted = isinstance(turns, int) and not isinstance(turns, bool) and 0 <= turns <= INT_MAX
    if not counted and turns is not None:
        warnings.append("num_turns: not a non-negative 64-bit integer (the stream's own count recorded)")
    if session_id_or_none(sid) is None and sid not in (None, ""):
        warnings.append("session_id: not a printable string of at most 256 chars (the stream's own id kept)")
    return {
        "session_id": session_id_or_none(sid) or state.session_id,
        "usage": state.last_usage,
        "cost_usd": float(cost) if _finite_nonneg(cost) else 0.0,
        "num_turns": turns if counted else state.turns,
        "compacted": state.compactions > 0,
        "warnings": warnings,
    }
