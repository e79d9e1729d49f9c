"""The command runner's JSON report (docs/DESIGN.md §10): every key optional except ``result``; junk never crashes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolve.agent.report import AGENT_RESULTS, AgentReport, Usage, parse_report

FULL = {
    "result": "harvested",
    "disposition": "context-budget-defer",
    "summary": "parked two items",
    "context_heavy": True,
    "compacted": True,
    "context_overflow": False,
    "session_id": "abc-123",
    "cost_usd": 0.42,
    "num_turns": 7,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30,
              "cache_creation_input_tokens": 40},
    "context_window": 200_000,
    "new_work": [{"title": "follow-up", "type": "bug"}],
    "percepts": ["tests are slow"],
}


def test_full_report() -> None:
    r = parse_report(FULL)
    assert r.result == "harvested"
    assert r.disposition == "context-budget-defer"
    assert r.summary == "parked two items"
    assert r.context_heavy and r.compacted and not r.context_overflow
    assert r.session_id == "abc-123"
    assert r.cost_usd == 0.42
    assert r.num_turns == 7
    assert r.usage == Usage(10, 20, 30, 40)
    assert r.usage.context_tokens == 80
    assert r.context_window == 200_000
    assert r.new_work == [{"title": "follow-up", "type": "bug"}]
    assert r.percepts == ["tests are slow"]
    assert r.error_class is None


@pytest.mark.parametrize("result", AGENT_RESULTS)
def test_only_result_is_required(result: str) -> None:
    r = parse_report({"result": result})
    assert r.result == result
    assert r.disposition == "" and r.summary == ""
    assert r.new_work == [] and r.percepts == []
    assert r.session_id is None
    assert r.usage == Usage()
    assert r.cost_usd == 0.0 and r.num_turns == 0 and r.context_window == 0
    assert not r.context_heavy and not r.compacted and not r.context_overflow
    if result == "failed":
        assert r.error_class == "transient"
    else:
        assert r.error_class is None


@pytest.mark.parametrize(
    "obj",
    [None, [], ["improved"], "improved", 3, 1.5, True],
)
def test_non_object_is_failed_crashed(obj: Any) -> None:
    r = parse_report(obj)
    assert r.result == "failed"
    assert r.error_class == "crashed"
    assert "not a JSON object" in r.error


@pytest.mark.parametrize(
    "obj",
    [{}, {"result": None}, {"result": "Improved"}, {"result": "regressed"}, {"result": "context-handoff"},
     {"result": 1}, {"result": ["improved"]}, {"summary": "no result"}, {"result": ""}],
)
def test_missing_or_invalid_result_is_failed_crashed(obj: dict[str, Any]) -> None:
    r = parse_report(obj)
    assert r.result == "failed"
    assert r.error_class == "crashed"
    assert "not valid" in r.error


@pytest.mark.parametrize("err", ["limit", "transient", "fatal", "timeout", "crashed"])
def test_failed_error_class_kept(err: str) -> None:
    r = parse_report({"result": "failed", "error_class": err, "error": "boom"})
    assert r.error_class == err and r.error == "boom"


@pytest.mark.parametrize("err", [None, "", "weird", 3, True, ["limit"]])
def test_failed_error_class_defaults(err: Any) -> None:
    obj = {"result": "failed"} if err is None else {"result": "failed", "error_class": err}
    assert parse_report(obj).error_class == "transient"


@pytest.mark.parametrize("result", [r for r in AGENT_RESULTS if r != "failed"])
def test_error_class_only_on_failed(result: str) -> None:
    assert parse_report({"result": result, "error_class": "fatal"}).error_class is None


WRONG_TYPES: list[tuple[str, Any, str, Any]] = [
    ("cost_usd", -1.0, "cost_usd", 0.0),
    ("cost_usd", "0.5", "cost_usd", 0.0),
    ("cost_usd", True, "cost_usd", 0.0),
    ("cost_usd", None, "cost_usd", 0.0),
    ("cost_usd", 2, "cost_usd", 2.0),
    ("cost_usd", float("inf"), "cost_usd", 0.0),
    ("cost_usd", float("nan"), "cost_usd", 0.0),
    ("num_turns", True, "num_turns", 0),
    ("num_turns", -3, "num_turns", 0),
    ("num_turns", "7", "num_turns", 0),
    ("num_turns", 7.5, "num_turns", 0),
    ("context_window", True, "context_window", 0),
    ("context_window", -100, "context_window", 0),
    ("context_window", "200000", "context_window", 0),
    ("context_window", 0, "context_window", 0),
    ("new_work", "do more", "new_work", []),
    ("new_work", {"title": "x"}, "new_work", []),
    ("new_work", [{"title": "x"}, "y", 3, None], "new_work", [{"title": "x"}]),
    ("percepts", "one fact", "percepts", []),
    ("percepts", ["a", 1, None, {"b": 2}], "percepts", ["a"]),
    ("session_id", "", "session_id", None),
    ("session_id", 42, "session_id", None),
    ("disposition", ["context-too-heavy"], "disposition", ""),
    ("summary", {"text": "x"}, "summary", ""),
    ("context_heavy", "true", "context_heavy", False),
    ("context_heavy", 1, "context_heavy", False),
    ("compacted", "yes", "compacted", False),
    ("context_overflow", 1, "context_overflow", False),
    ("usage", "lots", "usage", Usage()),
    ("usage", [1, 2], "usage", Usage()),
    ("error", 5, "error", ""),
]


@pytest.mark.parametrize(("key", "value", "attr", "want"), WRONG_TYPES)
def test_wrong_types_are_ignored(key: str, value: Any, attr: str, want: Any) -> None:
    r = parse_report({"result": "scout", key: value})
    assert r.result == "scout", "a bad optional key never turns the report into a failure"
    assert getattr(r, attr) == want


def test_long_strings_capped() -> None:
    r = parse_report({"result": "scout", "summary": "s" * 10_000, "disposition": "d" * 1000,
                      "percepts": ["p" * 1000] * 50})
    assert len(r.summary) == 4000
    assert len(r.disposition) == 500
    assert len(r.percepts) == 20 and all(len(p) == 500 for p in r.percepts)


# -- Usage.parse ----------------------------------------------------------------------------------------


def test_usage_parse() -> None:
    assert Usage.parse({"input_tokens": 1, "output_tokens": 2, "cache_read_input_tokens": 3,
                        "cache_creation_input_tokens": 4}) == Usage(1, 2, 3, 4)
    assert Usage.parse({"input_tokens": 5}) == Usage(5, 0, 0, 0)
    assert Usage.parse({"input_tokens": 5.9}) == Usage(5)
    assert Usage.parse({}) == Usage()
    for bad in (None, "x", 3, [1, 2, 3, 4], True):
        assert Usage.parse(bad) == Usage()


@pytest.mark.parametrize("bad", [-1, True, False, "10", None, [1], {"n": 1}, -0.5, float("inf"), float("nan")])
def test_usage_parse_ignores_bad_values(bad: Any) -> None:
    u = Usage.parse({"input_tokens": bad, "output_tokens": 2, "cache_read_input_tokens": bad,
                     "cache_creation_input_tokens": 4})
    assert u == Usage(0, 2, 0, 4)


def test_usage_json_round_trip() -> None:
    u = Usage(1, 2, 3, 4)
    assert Usage.parse(u.as_json()) == u
    assert set(u.as_json()) == {"input_tokens", "output_tokens", "cache_read_input_tokens",
                                "cache_creation_input_tokens"}
    assert u.context_tokens == 1 + 3 + 4


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(sorted({*FULL, "error", "error_class", "zzz"}))
USAGE_KEYS = st.sampled_from(["input_tokens", "output_tokens", "cache_read_input_tokens",
                              "cache_creation_input_tokens", "other"])


@given(obj=st.dictionaries(KEYS, JSONISH, max_size=12), result=st.one_of(st.none(), st.sampled_from(AGENT_RESULTS)),
       usage=st.one_of(st.none(), st.dictionaries(USAGE_KEYS, JSONISH, max_size=5)))
def test_parse_never_crashes(obj: dict[str, Any], result: str | None, usage: dict[str, Any] | None) -> None:
    if result is not None:
        obj["result"] = result
    if usage is not None:
        obj["usage"] = usage
    r = parse_report(obj)
    assert isinstance(r, AgentReport)
    assert r.result in AGENT_RESULTS
    if result is None and obj.get("result") not in AGENT_RESULTS:
        assert r.result == "failed" and r.error_class == "crashed"
    assert 0 <= r.cost_usd < float("inf") and r.num_turns >= 0 and r.context_window >= 0
    assert all(isinstance(w, dict) for w in r.new_work)
    assert all(isinstance(p, str) for p in r.percepts)
    assert min(r.usage.as_json().values()) >= 0
    assert isinstance(r.context_heavy, bool) and isinstance(r.compacted, bool)
