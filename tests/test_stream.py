"""Claude stream-json parsing and the retry policy: pure, from recorded message shapes."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolve.agent import retry, stream
from evolve.agent.report import AgentReport


def line(obj: dict) -> bytes:
    return orjson.dumps(obj) + b"\n"


INIT = {"type": "system", "subtype": "init", "session_id": "s-1", "model": "claude-x"}


def assistant(inp: int, cache_read: int = 0, model: str = "claude-x") -> dict:
    return {"type": "assistant", "session_id": "s-1", "message": {"model": model, "content": [], "usage": {
        "input_tokens": inp, "output_tokens": 10, "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": 0}}}


def result(text: str, **kw) -> dict:
    base = {"type": "result", "subtype": "success", "is_error": False, "session_id": "s-1", "num_turns": 3,
            "total_cost_usd": 0.25, "result": text, "usage": {"input_tokens": 999_999},
            "modelUsage": {"claude-x": {"contextWindow": 200_000}, "haiku": {"contextWindow": 100_000}}}
    return {**base, **kw}


REPORT = '```evolve-report\n{"result": "harvested", "disposition": "context-budget-defer", "summary": "s"}\n```'


def parse(*msgs: dict, chunk: int = 7) -> stream.StreamState:
    data = b"".join(line(m) for m in msgs)
    state = stream.StreamState()
    for i in range(0, len(data), chunk):  # arrives in arbitrary pieces
        state.feed(data[i:i + chunk])
    state.finish()
    return state


def test_occupancy_comes_from_the_last_assistant_turn_not_the_summed_result() -> None:
    s = parse(INIT, assistant(50_000), assistant(80_000, cache_read=10_000), result("ok\n" + REPORT))
    rep = stream.to_report(s, output_tail="")
    assert rep.usage.context_tokens == 90_000  # not the result's 999,999 sum over turns
    assert rep.context_window == 200_000 and rep.session_id == "s-1" and rep.num_turns == 3
    assert (rep.result, rep.disposition, rep.cost_usd) == ("harvested", "context-budget-defer", 0.25)
    assert stream.to_report(s, output_tail="", window_override=1000).context_window == 1000


def test_compaction_and_retries_are_seen() -> None:
    s = parse(INIT, {"type": "system", "subtype": "compact_boundary", "compact_metadata": {"trigger": "auto"}},
              {"type": "system", "subtype": "api_retry", "error_status": 429, "retry_delay_ms": 2500},
              assistant(10), result(REPORT))
    assert s.compactions == 1 and stream.retry_after_s(s) == 2.5
    assert stream.to_report(s, output_tail="").compacted is True


def test_synthetic_error_turns_do_not_count_as_usage() -> None:
    s = parse(INIT, assistant(70_000), assistant(0, model="<synthetic>"))
    assert s.turns == 1 and s.last_usage.input_tokens == 70_000


def test_killed_run_without_result_keeps_the_session_id_and_tolerates_a_torn_line() -> None:
    s = stream.StreamState()
    s.feed(line(INIT) + line(assistant(5)) + b'{"type": "assistant", "mess')
    s.finish()
    rep = stream.to_report(s, output_tail="killed")
    assert (rep.result, rep.error_class, rep.session_id) == ("failed", "crashed", "s-1")
    assert s.malformed == 1


@pytest.mark.parametrize(("res", "cls", "overflow", "retryable"), [
    ({"subtype": "error_max_turns", "is_error": True}, "transient", False, False),
    ({"subtype": "error_during_execution", "is_error": True, "errors": ["boom"]}, "transient", False, False),
    ({"is_error": True, "api_error_status": 429, "result": "API Error: Request rejected (429)"}, "limit", False, False),
    ({"is_error": True, "api_error_status": 529, "result": "Overloaded"}, "transient", False, True),
    ({"is_error": True, "api_error_status": 500, "result": "Internal"}, "transient", False, True),
    ({"is_error": True, "api_error_status": 401, "result": "invalid x-api-key"}, "fatal", False, False),
    ({"is_error": True, "api_error_status": 400, "terminal_reason": "prompt_too_long",
      "result": "Prompt is too long"}, "transient", True, False),
])
def test_error_results_are_classified(res: dict, cls: str, overflow: bool, retryable: bool) -> None:
    s = parse(INIT, result("", **res))
    rep = stream.to_report(s, output_tail="")
    assert (rep.result, rep.error_class, rep.context_overflow, rep.retryable) == ("failed", cls, overflow, retryable)


def test_not_logged_in_is_fatal_with_or_without_a_result() -> None:
    """Issue 16: Claude Code's "Not logged in" is an infrastructure error (the breaker, not the item)."""
    rep = stream.to_report(stream.StreamState(), output_tail="Not logged in · Please run /login")
    assert rep.error_class == "fatal"
    s = parse(INIT, result("", is_error=True, result="Not logged in · Please run /login"))
    assert stream.to_report(s, output_tail="").error_class == "fatal"


def test_nested_session_refusal_is_fatal() -> None:
    rep = stream.to_report(stream.StreamState(), output_tail="Error: Claude Code cannot be launched inside another "
                                                               "Claude Code session.")
    assert rep.error_class == "fatal"


def test_report_block_is_the_last_valid_one_and_missing_means_the_gate_decides() -> None:
    text = '```evolve-report\n{"result": "scout"}\n```\nlater\n```evolve-report\n{"result": "unchanged"}\n```'
    assert stream.report_block(text) == {"result": "unchanged"}
    assert stream.report_block("```evolve-report\nnot json\n```") is None
    rep = stream.to_report(parse(INIT, result("no block here")), output_tail="")
    assert (rep.result, rep.disposition) == ("improved", "no report block")


def test_invalid_session_detection() -> None:
    assert stream.invalid_session("", {"errors": ["No conversation found with session ID: x"]})
    assert not stream.invalid_session("all fine", {"result": "ok"})


@given(st.binary(max_size=400))
def test_parser_never_raises_on_garbage(data: bytes) -> None:
    s = stream.StreamState()
    s.feed(data)
    s.finish()
    stream.to_report(s, output_tail=data.decode(errors="replace"))


def _failed(cls: str, **kw) -> AgentReport:
    return AgentReport("failed", error_class=cls, **kw)


def test_retry_policy() -> None:
    limit = _failed("limit", error="rate limited (retry_after=30s)")
    assert retry.decide(limit, 0, remaining_s=100, transient_retries=2, backoff_s=1) == retry.Retry(
        True, 30.0, "rate limited; waiting 30s for the reset")
    assert not retry.decide(limit, 0, remaining_s=20, transient_retries=2, backoff_s=1).retry
    assert not retry.decide(limit, retry.MAX_LIMIT_WAITS, remaining_s=1e9, transient_retries=2, backoff_s=1).retry
    unknown = _failed("limit", error="rate limited")
    assert retry.decide(unknown, 0, remaining_s=1e9, transient_retries=2, backoff_s=1).wait_s == 60
    flaky = _failed("transient", retryable=True)
    waits = [retry.decide(flaky, a, remaining_s=1e9, transient_retries=3, backoff_s=2) for a in range(4)]
    assert [w.wait_s for w in waits[:3]] == [2, 4, 8] and not waits[3].retry
    assert not retry.decide(_failed("transient"), 0, remaining_s=1e9, transient_retries=2, backoff_s=1).retry
    assert not retry.decide(_failed("transient", retryable=True, context_overflow=True), 0, remaining_s=1e9,
                            transient_retries=2, backoff_s=1).retry
    assert not retry.decide(_failed("fatal"), 0, remaining_s=1e9, transient_retries=2, backoff_s=1).retry
    assert not retry.decide(AgentReport("improved"), 0, remaining_s=1e9, transient_retries=2, backoff_s=1).retry
