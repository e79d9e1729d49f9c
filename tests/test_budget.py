"""The context budget (docs/DESIGN.md §4.3) and the HANDOFF / milestone texts (§2, §4.3). Pure functions only."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.agent.report import AgentReport, Usage
from evolve.cycle import budget
from evolve.cycle.budget import handoff_due, next_streak, read_context
from evolve.cycle.handoff import NEXT_ACTION, handoff_text, milestone
from evolve.timeutil import utc_iso

HEAVY_PCT = 40
LEDGER_RESULTS = ("improved", "regressed", "harvested", "unchanged", "scout", "quarantined", "failed", "interrupted")
NOT_IMPROVED = tuple(r for r in LEDGER_RESULTS if r != "improved")


def rep(result: str = "unchanged", **kw: Any) -> AgentReport:
    return AgentReport(result, **kw)


def heavy(r: AgentReport, *, heavy_pct: float = HEAVY_PCT, window: int = 0) -> bool:
    return read_context(r, heavy_pct=heavy_pct, window_override=window).heavy


def cycle(streak: int, r: AgentReport, result: str | None = None, **kw: Any) -> int:
    """One end-of-cycle budget check, as the fire does it."""
    return next_streak(streak, heavy=heavy(r, **kw), result=result or r.result)


# -- each signal on its own ----------------------------------------------------------------------------

SIGNALS: dict[str, tuple[AgentReport, str]] = {
    "scout context-too-heavy": (rep("scout", disposition="context-too-heavy"), "scout"),
    "scout context too heavy (prose)": (rep("scout", disposition="context too heavy"), "scout"),
    "harvested context-budget defer": (rep("harvested", disposition="context-budget-defer"), "harvest"),
    "agent context_heavy flag": (rep("unchanged", context_heavy=True), "agent:context-heavy"),
    "scout with context_heavy flag": (rep("scout", disposition="split", context_heavy=True), "scout"),
    "context_overflow": (rep("failed", error_class="fatal", context_overflow=True), "overflow"),
    "prompt is too long": (rep("failed", error_class="fatal", error="Prompt is too long: 212000 > 200000"), "overflow"),
    "compacted": (rep("unchanged", compacted=True), "compaction"),
    "occupancy": (rep("unchanged", usage=Usage(20_000, 99_999, 15_000, 5_000), context_window=100_000), "occupancy"),
}


@pytest.mark.parametrize("name", list(SIGNALS))
def test_each_signal_alone_is_heavy_and_adds_exactly_one(name: str) -> None:
    r, signal = SIGNALS[name]
    reading = read_context(r, heavy_pct=HEAVY_PCT)
    assert reading.heavy
    assert signal in reading.signal
    for start in (0, 1, 5):
        assert cycle(start, r) == start + 1
        # the cycle's own (gate-decided) result may differ from the agent's; any non-improved one still counts
        for result in NOT_IMPROVED:
            assert cycle(start, r, result) == start + 1


def test_all_signals_in_one_cycle_still_add_one() -> None:
    r = rep(
        "scout",
        disposition="context-too-heavy",
        context_heavy=True,
        context_overflow=True,
        compacted=True,
        error="prompt is too long",
        usage=Usage(90_000),
        context_window=100_000,
    )
    reading = read_context(r, heavy_pct=HEAVY_PCT)
    assert reading.heavy
    assert {"scout", "overflow", "compaction", "occupancy"} <= {s.split(":")[0] for s in reading.signal.split(",")}
    assert cycle(3, r) == 4
    f = rep("failed", context_overflow=True, compacted=True, error="prompt is too long", context_heavy=True)
    assert cycle(0, f) == 1


@pytest.mark.parametrize(
    "r",
    [
        rep("scout", disposition="split: two children"),
        rep("scout", disposition="defer:needs-design"),
        rep("scout", disposition="park"),
        rep("harvested", disposition="feature-suggestion"),
        rep("harvested"),
        rep("unchanged"),
        rep("failed", error_class="transient", error="503 overloaded"),
        rep("failed", error_class="crashed", error=""),
        rep("improved", usage=Usage(10_000, 500_000), context_window=100_000),  # output tokens do not occupy
        rep("unchanged", usage=Usage(90_000)),  # no window known: not measurable
    ],
)
def test_not_heavy(r: AgentReport) -> None:
    reading = read_context(r, heavy_pct=HEAVY_PCT)
    assert not reading.heavy and reading.signal == ""
    assert cycle(2, r, "unchanged") == 2


# -- occupancy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "window", "is_heavy"),
    [
        (Usage(40_000), 100_000, True),  # exactly at the threshold
        (Usage(39_999), 100_000, False),  # just below (39.999 % must not round up into heavy)
        (Usage(40_001), 100_000, True),
        (Usage(10_000, 0, 20_000, 10_000), 100_000, True),  # input + cache_read + cache_creation
        (Usage(10_000, 0, 20_000, 9_999), 100_000, False),
        (Usage(0, 0, 80_000, 0), 200_000, True),
        (Usage(0, 0, 0, 79_999), 200_000, False),
        (Usage(0, 1_000_000, 0, 0), 100_000, False),
        (Usage(), 100_000, False),
    ],
)
def test_occupancy_threshold(usage: Usage, window: int, is_heavy: bool) -> None:
    reading = read_context(rep(usage=usage, context_window=window), heavy_pct=HEAVY_PCT)
    assert reading.heavy is is_heavy
    if usage.context_tokens:
        assert reading.pct == pytest.approx(100 * usage.context_tokens / window, abs=0.01)
    assert cycle(0, rep(usage=usage, context_window=window)) == int(is_heavy)


def test_occupancy_uses_heavy_pct() -> None:
    r = rep(usage=Usage(50_000), context_window=100_000)
    assert heavy(r, heavy_pct=50)
    assert not heavy(r, heavy_pct=51)
    assert heavy(r, heavy_pct=1)
    assert not heavy(rep(usage=Usage(99_999), context_window=100_000), heavy_pct=100)
    assert heavy(rep(usage=Usage(100_000), context_window=100_000), heavy_pct=100)


def test_window_override_beats_report() -> None:
    # the report says a 1M window (4 %), config says 100k (40 %): config wins -> heavy
    r = rep(usage=Usage(40_000), context_window=1_000_000)
    assert not heavy(r)
    assert heavy(r, window=100_000)
    assert read_context(r, heavy_pct=HEAVY_PCT, window_override=100_000).pct == 40.0
    # and the other way round
    r2 = rep(usage=Usage(40_000), context_window=100_000)
    assert heavy(r2)
    assert not heavy(r2, window=1_000_000)
    # override alone (no window in the report)
    assert heavy(rep(usage=Usage(40_000)), window=100_000)
    assert read_context(rep(usage=Usage(40_000)), heavy_pct=HEAVY_PCT).pct is None


# -- next_streak / handoff_due -----------------------------------------------------------------------


def test_improved_resets_even_when_heavy() -> None:
    for s in (0, 1, 2, 7):
        assert next_streak(s, heavy=True, result="improved") == 0
        assert next_streak(s, heavy=False, result="improved") == 0
    assert cycle(4, rep("improved", compacted=True, context_heavy=True)) == 0


@pytest.mark.parametrize("result", NOT_IMPROVED)
def test_other_results_leave_streak_unchanged_unless_heavy(result: str) -> None:
    for s in (0, 1, 3):
        assert next_streak(s, heavy=False, result=result) == s
        assert next_streak(s, heavy=True, result=result) == s + 1


def test_handoff_due_at_or_above_limit() -> None:
    assert not handoff_due(0, 2)
    assert not handoff_due(1, 2)
    assert handoff_due(2, 2)
    assert handoff_due(3, 2)
    assert handoff_due(1, 1)
    assert not handoff_due(4, 5)


def test_two_heavy_cycles_reach_the_default_limit() -> None:
    s = cycle(0, SIGNALS["scout context-too-heavy"][0])
    assert not handoff_due(s, 2)
    s = cycle(s, SIGNALS["harvested context-budget defer"][0])
    assert handoff_due(s, 2)


# -- property: the streak is a fold over the cycles --------------------------------------------------

HEAVY_DISPOSITIONS = ("context-too-heavy", "context-budget-defer", "context budget defer")
DISPOSITIONS = ("", "split", "defer:needs-design", "park", "feature-suggestion", *HEAVY_DISPOSITIONS)
ERRORS = ("", "prompt is too long", "Prompt is too long: 201000 tokens", "503 overloaded", "auth failed")


@st.composite
def reports(draw: st.DrawFn) -> AgentReport:
    result = draw(st.sampled_from(("improved", "harvested", "scout", "unchanged", "failed")))
    tokens = st.integers(0, 150_000)
    return AgentReport(
        result,
        disposition=draw(st.sampled_from(DISPOSITIONS)),
        usage=Usage(draw(tokens), draw(tokens), draw(tokens), draw(tokens)),
        context_window=draw(st.sampled_from((0, 100_000, 200_000, 1_000_000))),
        context_heavy=draw(st.booleans()),
        compacted=draw(st.booleans()),
        context_overflow=draw(st.booleans()),
        error=draw(st.sampled_from(ERRORS)),
    )


def reference_heavy(r: AgentReport, heavy_pct: int, override: int) -> bool:
    """docs/DESIGN.md §4.3, independently: any one signal makes the cycle heavy."""
    if r.result in ("scout", "harvested") and r.disposition in HEAVY_DISPOSITIONS:
        return True
    if r.context_heavy or r.context_overflow or r.compacted:
        return True
    if r.result == "failed" and "prompt is too long" in r.error.lower():
        return True
    window = override or r.context_window
    used = r.usage.input_tokens + r.usage.cache_read_input_tokens + r.usage.cache_creation_input_tokens
    return window > 0 and used > 0 and Fraction(100 * used, window) >= heavy_pct


@settings(max_examples=300, deadline=None)
@given(
    cycles=st.lists(st.tuples(reports(), st.sampled_from((None, *LEDGER_RESULTS)), st.booleans()), max_size=30),
    heavy_pct=st.sampled_from((1, 25, 40, 83, 100)),
    override=st.sampled_from((0, 100_000, 400_000)),
    limit=st.integers(1, 5),
    start=st.integers(0, 4),
)
def test_streak_equals_reference_fold(
    cycles: list[tuple[AgentReport, str | None, bool]], heavy_pct: int, override: int, limit: int, start: int
) -> None:
    got = want = start
    for r, gate_result, _ in cycles:
        result = gate_result or r.result
        got = next_streak(got, heavy=heavy(r, heavy_pct=heavy_pct, window=override), result=result)
        if result == "improved":
            want = 0
        elif reference_heavy(r, heavy_pct, override):
            want += 1
        assert got == want
        assert handoff_due(got, limit) == (want >= limit)
        if handoff_due(got, limit):  # the fire resets right after a HANDOFF is written
            got = want = 0


# -- HANDOFF text (docs/DESIGN.md §2) ------------------------------------------------------------------------------

ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
NASTY_REFS = [
    'say "hi"',
    "it's",
    "line1\nline2",
    "cr\rlf\r\n",
    "$(rm -rf /); `id` | tee >x && echo $HOME",
    "tab\there",
    "back\\slash",
    "\x00nul\x1bescape",
    "ünïcødé ✓",
    "",
]


def check_handoff(text: str, ts: str, streak: int, parked: list[Any]) -> None:
    assert text.endswith("\n")
    lines = text.split("\n")[:-1]
    assert len(lines) == 4, text
    assert lines[0] == ts
    assert lines[1] == f"context_streak={streak} (this session's context grew too heavy)"
    assert lines[2].startswith("parked_work: ")
    payload = lines[2][len("parked_work: "):]
    assert json.loads(payload) == parked
    assert orjson.loads(payload) == parked
    assert lines[3] == "next-action: cron-fire will resume on compacted/fresh context"
    assert lines[3] == NEXT_ACTION


def test_handoff_text_exact() -> None:
    text = handoff_text("2026-05-21T03:04:05Z", 2, ["bd-12", "harvested:e1#0"])
    assert text == (
        "2026-05-21T03:04:05Z\n"
        "context_streak=2 (this session's context grew too heavy)\n"
        'parked_work: ["bd-12","harvested:e1#0"]\n'
        "next-action: cron-fire will resume on compacted/fresh context\n"
    )


def test_handoff_text_with_real_timestamp_and_empty_parked() -> None:
    ts = utc_iso()
    assert ISO_Z.match(ts)
    text = handoff_text(ts, 3, [])
    check_handoff(text, ts, 3, [])
    assert text.splitlines()[2] == "parked_work: []"


def test_handoff_parked_work_round_trips_nasty_refs() -> None:
    text = handoff_text("2026-05-21T03:04:05Z", 2, NASTY_REFS)
    check_handoff(text, "2026-05-21T03:04:05Z", 2, NASTY_REFS)
    assert len(text.splitlines()) == 4


@settings(max_examples=200, deadline=None)
@given(refs=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",))), max_size=6),
       streak=st.integers(0, 1000))
def test_handoff_round_trip_property(refs: list[str], streak: int) -> None:
    check_handoff(handoff_text("2026-05-21T03:04:05Z", streak, refs), "2026-05-21T03:04:05Z", streak, refs)


def test_handoff_text_accepts_any_sequence() -> None:
    check_handoff(handoff_text("t", 2, ("a", "b")), "t", 2, ["a", "b"])


# -- milestone (docs/DESIGN.md §4.3) -------------------------------------------------------------------------------


def test_milestone_text_exact() -> None:
    assert milestone(2, ["bd-12"]) == (
        "Context-handoff after 2 heavy cycles. Parked: bd-12. Next cron-fire (compacted/fresh) resumes."
    )
    assert milestone(3, ["a", "b"]) == (
        "Context-handoff after 3 heavy cycles. Parked: a, b. Next cron-fire (compacted/fresh) resumes."
    )
    m = milestone(2, [])
    assert m.startswith("Context-handoff after 2 heavy cycles. Parked: ")
    assert m.endswith(". Next cron-fire (compacted/fresh) resumes.")


def test_overflow_texts_are_lowercase() -> None:
    # read_context lower-cases the error before matching; every needle must be lower-case too
    assert all(t == t.lower() for t in budget._OVERFLOW_TEXT)
