"""Step 1, the halt gate (docs/DESIGN.md §4.1), checked against an independent reference over the full product.

Everything here is pure: markers are constructed directly, and the lazy ``need`` protocol is driven the
way the fire's shell drives it (fill ``dormant_probe`` / ``governor_exit`` and ask again).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from evolve.cycle import halt
from evolve.cycle.halt import HaltSnapshot, Step1, evaluate, goal_drop, is_red
from evolve.store.markers import Marker, marker_text, read_marker
from evolve.timeutil import utc_iso

NOW = 1_800_000_000.0
TTL = 7 * 86400.0
EVOLVE = Path("/repo/.agents/evolve")
GLOBAL_KILL = Path("/home/op/.config/evolve/KILL")
PATHS = {
    "global_kill": GLOBAL_KILL,
    "local_kill": EVOLVE / "KILL",
    "stop": EVOLVE / "STOP",
    "dormant": EVOLVE / "DORMANT",
    "handoff": EVOLVE / "HANDOFF",
    "ack_regression": EVOLVE / "ACK-REGRESSION",
}

AGE = {"fresh": TTL - 1, "stale": TTL + 1}


def marker(name: str, state: str = "absent", content: str = "") -> Marker:
    path = PATHS[name]
    if state == "absent":
        return Marker(path, False)
    return Marker(path, True, AGE.get(state, 5.0), content or f"{name} says so\n")


def snapshot(**kw: Any) -> HaltSnapshot:
    base: dict[str, Any] = {
        "now": NOW,
        "kill_ttl_s": TTL,
        "global_kill": marker("global_kill"),
        "local_kill": marker("local_kill"),
        "stop": marker("stop"),
        "dormant": marker("dormant"),
        "handoff": marker("handoff"),
        "ack_regression": marker("ack_regression"),
    }
    base.update(kw)
    return HaltSnapshot(**base)


def drive(snap: HaltSnapshot, probe: str | None = None, governor: int | None = None) -> tuple[Step1, list[str]]:
    """Evaluate like the shell: answer each ``need`` once, then evaluate again."""
    asked: list[str] = []
    for _ in range(4):
        d = evaluate(snap)
        if d.need is None:
            return d, asked
        assert d.halt is None, "a decision that still needs a probe must not halt"
        assert d.need not in asked, f"{d.need} requested twice"
        asked.append(d.need)
        if d.need == halt.NEED_DORMANT_PROBE:
            assert snap.dormant.present and snap.dormant_probe is None
            assert probe is not None
            snap = replace(snap, dormant_probe=probe)
        elif d.need == halt.NEED_GOVERNOR:
            assert snap.governor_configured and snap.governor_exit is None
            assert governor is not None
            snap = replace(snap, governor_exit=governor)
        else:  # pragma: no cover
            pytest.fail(f"unknown need {d.need!r}")
    pytest.fail("need protocol did not settle")  # pragma: no cover


# -- the ledger tails of the product ---------------------------------------------------------------

GOALS = {
    "none": ((5, 10, "a"), (5, 10, "a")),
    "drop-same-total": ((5, 10, "a"), (4, 10, "a")),
    "drop-different-total": ((5, 10, "a"), (4, 9, "a")),
    "drop-different-era": ((5, 10, "a"), (4, 10, "b")),
}
DROP_CYCLE = 2
LAST = {
    "green": {"result": "improved", "gate": "PASS"},
    "regressed": {"result": "regressed"},
    "gate-fail": {"result": "unchanged", "gate": "Pass 2: FAILED"},
    "gate-blocked": {"result": "harvested", "gate": "BLOCKED"},
}


def tail(goals: str, last: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, (passing, total, era) in enumerate(GOALS[goals], start=1):
        out.append({"cycle": i, "result": "improved", "goals_passing": passing, "goals_total": total,
                    "goals_era": era})
    out.append({"cycle": 3, "target": "x", **LAST[last]})
    return out


@dataclass(frozen=True)
class Case:
    gk: str
    lk: str
    stop: str
    dormant: str  # absent | work | empty | error
    handoff: bool
    governor: int | None  # None = not configured
    breaker: str  # none | open | past
    goals: str
    ack: bool
    ack_covering: bool
    last: str

    def snap(self) -> HaltSnapshot:
        until = {"none": None, "open": NOW + 600, "past": NOW - 600}[self.breaker]
        return snapshot(
            global_kill=marker("global_kill", self.gk),
            local_kill=marker("local_kill", self.lk),
            stop=marker("stop", self.stop),
            dormant=marker("dormant", "absent" if self.dormant == "absent" else "present"),
            handoff=marker("handoff", "present" if self.handoff else "absent"),
            ack_regression=marker("ack_regression", "present" if self.ack else "absent"),
            governor_configured=self.governor is not None,
            breaker_open_until=until,
            ledger_tail=tail(self.goals, self.last),
            ack_regression_cycle=DROP_CYCLE if self.ack_covering else DROP_CYCLE - 1,
        )


@dataclass(frozen=True)
class Expected:
    halt: str | None
    probe_asked: bool = False
    governor_asked: bool = False
    clear_dormant: bool = False
    clear_handoff: bool = False
    breaker_probe: bool = False
    consume_ack: bool = False
    acked_cycle: int = 0
    restorative: bool = False


def reference(c: Case) -> Expected:
    """docs/DESIGN.md §4.1 read literally: eight rules, first match wins."""
    # 1. fresh KILL (global or repo) -> kill; 2. fresh STOP -> user_halt. Stale ones are ignored.
    if c.gk == "fresh" or c.lk == "fresh":
        return Expected("kill")
    if c.stop == "fresh":
        return Expected("user_halt")
    # 3. DORMANT: work -> delete and go on; probe error -> go on; nothing selectable -> dormant.
    probe = c.dormant != "absent"
    if c.dormant == "empty":
        return Expected("dormant", probe_asked=True)
    got_past = {"probe_asked": probe, "clear_dormant": c.dormant == "work", "clear_handoff": c.handoff}
    # 4. HANDOFF is deleted (never a halt) on every run that got this far.
    # 5. governor: exit 3 halts; any other non-zero warns and goes on.
    gov = c.governor is not None
    if c.governor == 3:
        return Expected("governor_budget_burned", governor_asked=True, **got_past)
    # 6. breaker open (in the future) halts; once past, a half-open probe cycle.
    if c.breaker == "open":
        return Expected("breaker_open", governor_asked=gov, **got_past)
    # 7. goal regression: a drop between the last two goal entries of the same total and era, not yet
    #    acknowledged (ack_regression_cycle >= the drop cycle); ACK present acknowledges (consumes) it.
    #    ACK is consumed by any fire that gets this far, drop or not (docs/DESIGN.md §2: "consumed by the next fire").
    comparable_drop = c.goals == "drop-same-total"
    acked = 0
    if comparable_drop and not c.ack_covering:
        if not c.ack:
            return Expected("goal_regression", governor_asked=gov, **got_past)
        acked = DROP_CYCLE
    # 8. a red last entry -> restorative mode, not a halt.
    return Expected(
        None,
        governor_asked=gov,
        breaker_probe=c.breaker == "past",
        consume_ack=c.ack,
        acked_cycle=acked,
        restorative=c.last != "green",
        **got_past,
    )


MARKER_STATES = ("absent", "fresh", "stale")
REST = list(
    itertools.product(
        ("absent", "work", "empty", "error"),
        (False, True),
        (None, 0, 3, 1, -1),
        ("none", "open", "past"),
        tuple(GOALS),
        (False, True),
        (False, True),
        tuple(LAST),
    )
)


@pytest.mark.parametrize(("gk", "lk", "stop"), list(itertools.product(MARKER_STATES, repeat=3)))
def test_evaluate_matches_reference_over_full_product(gk: str, lk: str, stop: str) -> None:
    for dormant, handoff, governor, breaker, goals, ack, covering, last in REST:
        c = Case(gk, lk, stop, dormant, handoff, governor, breaker, goals, ack, covering, last)
        exp = reference(c)
        snap = c.snap()
        probe = None if dormant == "absent" else dormant
        d, asked = drive(snap, probe, governor)
        ctx = repr(c)
        assert d.halt == exp.halt, ctx
        assert (halt.NEED_DORMANT_PROBE in asked) == exp.probe_asked, ctx
        assert (halt.NEED_GOVERNOR in asked) == exp.governor_asked, ctx
        # DORMANT (rule 3) is always decided before the governor (rule 5) is run.
        assert asked in ([], [halt.NEED_DORMANT_PROBE], [halt.NEED_GOVERNOR],
                         [halt.NEED_DORMANT_PROBE, halt.NEED_GOVERNOR]), ctx
        if d.halt in ("kill", "user_halt", "dormant"):
            assert halt.NEED_GOVERNOR not in asked, ctx
            assert not d.clear_handoff and not d.clear_dormant, ctx
        assert d.clear_dormant == exp.clear_dormant, ctx
        assert d.clear_handoff == exp.clear_handoff, ctx
        assert d.consume_ack == exp.consume_ack, ctx
        assert d.acked_cycle == exp.acked_cycle, ctx
        assert d.restorative == exp.restorative, ctx
        if d.halt is None:
            assert d.breaker_probe == exp.breaker_probe, ctx
        elif d.halt == "breaker_open":
            assert not d.breaker_probe, ctx

        # Stale markers: a warning naming the path; fresh/absent ones never warned about.
        for name, state in (("global_kill", gk), ("local_kill", lk), ("stop", stop)):
            named = [w for w in d.warnings if str(PATHS[name]) in w]
            if state == "stale":
                assert len(named) == 1 and "stale" in named[0], ctx
            else:
                assert not named, ctx
        gov_warned = any("governor" in w for w in d.warnings)
        assert gov_warned == (exp.governor_asked and governor not in (0, 3)), ctx
        probe_warned = any("probe" in w for w in d.warnings)
        assert probe_warned == (exp.probe_asked and dormant == "error"), ctx


def test_halt_reason_names() -> None:
    assert (halt.KILL, halt.USER_HALT, halt.DORMANT, halt.GOVERNOR, halt.BREAKER, halt.GOAL_REGRESSION) == (
        "kill",
        "user_halt",
        "dormant",
        "governor_budget_burned",
        "breaker_open",
        "goal_regression",
    )


def test_nothing_present_goes_on_quietly() -> None:
    d = evaluate(snapshot())
    assert d == Step1()


# -- KILL / STOP TTL, in seconds ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["global_kill", "local_kill", "stop"])
@pytest.mark.parametrize("ttl_days", [7, 1, 0.5, 30])
def test_ttl_compared_in_seconds(name: str, ttl_days: float) -> None:
    ttl = ttl_days * 86400
    want = "user_halt" if name == "stop" else "kill"
    for age, halts in ((ttl - 1, True), (ttl, True), (ttl + 1, False), (0.0, True), (ttl * 10, False)):
        m = Marker(PATHS[name], True, age, "operator\n")
        d = evaluate(snapshot(kill_ttl_s=ttl, **{name: m}))
        if halts:
            assert d.halt == want, (age, ttl)
            assert not d.warnings
        else:
            assert d.halt is None, (age, ttl)
            assert any(str(PATHS[name]) in w for w in d.warnings)


def test_stale_kill_does_not_mask_fresh_stop() -> None:
    d = evaluate(snapshot(local_kill=marker("local_kill", "stale"), stop=marker("stop", "fresh")))
    assert d.halt == "user_halt"
    assert any(str(PATHS["local_kill"]) in w for w in d.warnings)


def test_ttl_with_real_file_mtimes(tmp_path: Path) -> None:
    ttl = 86400.0
    kill = tmp_path / "KILL"
    kill.write_text("stop everything\n", encoding="utf-8")
    os.utime(kill, (NOW - ttl - 1, NOW - ttl - 1))
    stale = read_marker(kill, NOW)
    d = evaluate(snapshot(kill_ttl_s=ttl, local_kill=stale))
    assert d.halt is None and any(str(kill) in w for w in d.warnings)
    assert kill.exists(), "a stale KILL is ignored, never deleted"
    os.utime(kill, (NOW - ttl + 1, NOW - ttl + 1))
    d = evaluate(snapshot(kill_ttl_s=ttl, local_kill=read_marker(kill, NOW)))
    assert d.halt == "kill" and "stop everything" in d.detail


# -- DORMANT and HANDOFF -----------------------------------------------------------------------------


def test_dormant_needs_a_probe_first() -> None:
    s = snapshot(dormant=marker("dormant", "present"), handoff=marker("handoff", "present"))
    d = evaluate(s)
    assert d.need == halt.NEED_DORMANT_PROBE and d.halt is None
    assert not d.clear_handoff, "HANDOFF is cleared only once DORMANT has been decided"


@pytest.mark.parametrize(("probe", "want_halt", "cleared"), [("work", None, True), ("error", None, False),
                                                              ("empty", "dormant", False)])
def test_dormant_probe_outcomes(probe: str, want_halt: str | None, cleared: bool) -> None:
    s = snapshot(dormant=marker("dormant", "present", "cycle 9\n"), handoff=marker("handoff", "present"),
                 dormant_probe=probe)
    d = evaluate(s)
    assert d.halt == want_halt
    assert d.clear_dormant == cleared
    assert d.clear_handoff == (want_halt is None)


def test_handoff_is_never_a_halt() -> None:
    d = evaluate(snapshot(handoff=marker("handoff", "present", "2026-01-01T00:00:00Z\ncontext_streak=2\n")))
    assert d.halt is None and d.need is None
    assert d.clear_handoff


@pytest.mark.parametrize("which", ["global_kill", "local_kill", "stop"])
def test_handoff_kept_when_kill_or_stop_halts(which: str) -> None:
    d = evaluate(snapshot(handoff=marker("handoff", "present"), **{which: marker(which, "fresh")}))
    assert d.halt in ("kill", "user_halt")
    assert not d.clear_handoff


# -- governor ----------------------------------------------------------------------------------------


def test_governor_requested_lazily_and_only_when_configured() -> None:
    assert evaluate(snapshot()).need is None
    d = evaluate(snapshot(governor_configured=True))
    assert d.need == halt.NEED_GOVERNOR and d.halt is None
    for stopper in ("global_kill", "local_kill", "stop"):
        d = evaluate(snapshot(governor_configured=True, **{stopper: marker(stopper, "fresh")}))
        assert d.need is None and d.halt is not None


@pytest.mark.parametrize(("code", "want"), [(0, None), (3, "governor_budget_burned"), (1, None), (2, None),
                                            (-1, None), (4, None)])
def test_governor_exit_codes(code: int, want: str | None) -> None:
    d = evaluate(snapshot(governor_configured=True, governor_exit=code, handoff=marker("handoff", "present")))
    assert d.halt == want
    assert d.clear_handoff, "HANDOFF (rule 4) comes before the governor (rule 5)"
    said = "could not run" if code == -1 else str(code)
    assert any(said in w for w in d.warnings) == (code not in (0, 3))


# -- breaker -----------------------------------------------------------------------------------------


def test_breaker_open_until_future_halts_and_past_probes() -> None:
    assert evaluate(snapshot(breaker_open_until=NOW + 1)).halt == "breaker_open"
    d = evaluate(snapshot(breaker_open_until=NOW - 1))
    assert d.halt is None and d.breaker_probe
    d = evaluate(snapshot(breaker_open_until=NOW))
    assert d.halt is None and d.breaker_probe, "'in the future' is strictly later than now"
    assert not evaluate(snapshot()).breaker_probe


# -- goal regression ---------------------------------------------------------------------------------


def g(cycle: int, passing: int, total: int, era: str | None = None, **kw: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"cycle": cycle, "result": "improved", "goals_passing": passing, "goals_total": total}
    if era is not None:
        e["goals_era"] = era
    e.update(kw)
    return e


def test_goal_drop_compares_only_the_last_two_goal_entries() -> None:
    assert goal_drop([]) is None
    assert goal_drop([g(1, 5, 10)]) is None
    assert goal_drop([g(1, 5, 10), g(2, 4, 10)]) == (2, "goals passing fell 5 -> 4 of 10")
    assert goal_drop([g(1, 5, 10), g(2, 5, 10)]) is None
    assert goal_drop([g(1, 5, 10), g(2, 6, 10)]) is None
    # entries without goals between them do not matter
    noise = {"cycle": 3, "result": "unchanged", "target": "idle"}
    assert goal_drop([g(1, 5, 10), noise, g(4, 4, 10), {**noise, "cycle": 5}]) == (4, "goals passing fell 5 -> 4 of 10")
    # an older drop followed by a steady pair is not a regression any more
    assert goal_drop([g(1, 6, 10), g(2, 4, 10), g(3, 4, 10)]) is None
    # a drop further back than the last two is not looked at
    assert goal_drop([g(1, 9, 10), g(2, 4, 10), g(3, 5, 10)]) is None


def test_goal_drop_needs_same_total_and_same_era() -> None:
    assert goal_drop([g(1, 5, 10), g(2, 4, 9)]) is None
    assert goal_drop([g(1, 5, 10, "a"), g(2, 4, 10, "b")]) is None
    assert goal_drop([g(1, 5, 10, "a"), g(2, 4, 10, "a")]) is not None


def test_goal_regression_halt_then_ack_then_no_rehalt() -> None:
    ledger = [g(1, 5, 10, "a"), g(2, 4, 10, "a")]
    # fire 1: a drop, no ACK -> halt
    d1 = evaluate(snapshot(ledger_tail=ledger))
    assert d1.halt == "goal_regression" and "5 -> 4" in d1.detail
    assert not d1.consume_ack
    # fire 2: operator wrote ACK-REGRESSION -> consumed, records the acknowledged cycle, goes on
    d2 = evaluate(snapshot(ledger_tail=ledger, ack_regression=marker("ack_regression", "present")))
    assert d2.halt is None and d2.consume_ack and d2.acked_cycle == 2
    # fire 3: ACK gone, the acknowledged drop is still the last pair -> no halt again
    d3 = evaluate(snapshot(ledger_tail=ledger, ack_regression_cycle=d2.acked_cycle))
    assert d3.halt is None and not d3.consume_ack
    d3b = evaluate(snapshot(ledger_tail=ledger, ack_regression_cycle=d2.acked_cycle + 5))
    assert d3b.halt is None
    # fire 4: a new drop after the acknowledged one halts again
    ledger2 = [*ledger, g(3, 4, 10, "a"), g(4, 3, 10, "a")]
    d4 = evaluate(snapshot(ledger_tail=ledger2, ack_regression_cycle=d2.acked_cycle))
    assert d4.halt == "goal_regression"


def test_ack_without_a_drop_is_consumed_and_acknowledges_nothing() -> None:
    d = evaluate(snapshot(ledger_tail=[g(1, 5, 10), g(2, 6, 10)], ack_regression=marker("ack_regression", "present")))
    assert d.halt is None and d.consume_ack and d.acked_cycle == 0


def test_goal_regression_comes_after_breaker_and_before_restorative() -> None:
    ledger = [g(1, 5, 10), g(2, 4, 10, gate="FAIL")]
    assert evaluate(snapshot(ledger_tail=ledger, breaker_open_until=NOW + 60)).halt == "breaker_open"
    d = evaluate(snapshot(ledger_tail=ledger))
    assert d.halt == "goal_regression" and not d.restorative


# -- restorative -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "red"),
    [
        ({"result": "regressed"}, True),
        ({"result": "regressed", "gate": "FAIL"}, True),
        ({"result": "unchanged", "gate": "FAIL"}, True),
        ({"result": "improved", "gate": "Pass 3: BLOCKED"}, True),
        ({"result": "improved", "gate": "PASS"}, False),
        ({"result": "improved"}, False),
        ({"result": "failed", "error_class": "crashed"}, False),
        ({"result": "improved", "gate": ["FAIL"]}, False),
        ({}, False),
    ],
)
def test_restorative_when_last_entry_red(entry: dict[str, Any], red: bool) -> None:
    assert is_red(entry) == red
    d = evaluate(snapshot(ledger_tail=[{"cycle": 1, "result": "improved"}, {"cycle": 2, **entry}]))
    assert d.halt is None
    assert d.restorative == red


def test_restorative_looks_only_at_the_last_entry() -> None:
    d = evaluate(snapshot(ledger_tail=[{"cycle": 1, "result": "regressed"}, {"cycle": 2, "result": "improved"}]))
    assert not d.restorative
    assert is_red(None) is False
    assert not evaluate(snapshot(ledger_tail=[])).restorative


# -- who wrote a KILL/STOP, its expiry, and clock steps (docs/DESIGN.md §2.2) -----------------


def test_marker_text_keeps_the_upstream_lines_and_parses_back(tmp_path: Path) -> None:
    p = tmp_path / "KILL"
    p.write_text(marker_text(NOW - 60, "deploy\nfreeze", "evolve kill", expires=NOW + 3600))
    lines = p.read_text().splitlines()
    assert lines[0] == "2027-01-15T07:59:00Z" and lines[1] == "deploy freeze", "line 1 time, line 2 reason"
    m = read_marker(p, NOW)
    assert m.author == "evolve kill" and m.expires_in_s == 3600 and m.written_age_s == 60


def test_a_marker_evolve_wrote_never_goes_stale() -> None:
    """`evolve stop`/`kill` means stop: however old its mtime and time line, it halts until resumed."""
    old = Marker(PATHS["local_kill"], True, 400 * 86400.0, "x\nfreeze\nwritten-by: evolve kill\n",
                 written_age_s=400 * 86400.0, author="evolve kill")
    d = evaluate(snapshot(local_kill=old))
    assert d.halt == "kill" and not d.warnings
    stop = replace(old, path=PATHS["stop"], author="evolve stop")
    assert evaluate(snapshot(stop=stop)).halt == "user_halt"


def test_expiry_recorded_by_the_operator_is_the_only_end() -> None:
    m = Marker(PATHS["stop"], True, 10.0, "x\nlunch\nwritten-by: evolve stop\nexpires: y\n",
               written_age_s=10.0, author="evolve stop", expires_in_s=5.0)
    assert evaluate(snapshot(stop=m)).halt == "user_halt"
    gone = replace(m, expires_in_s=-1.0)
    d = evaluate(snapshot(stop=gone))
    assert d.halt is None and any("expired STOP" in w for w in d.warnings)
    assert halt.sticky_state(gone, TTL) == "expired"
    # An expiry that does not parse is no expiry: a halt fails closed.
    assert evaluate(snapshot(stop=replace(m, expires_in_s=None, bad_expiry=True))).halt == "user_halt"


@pytest.mark.parametrize(
    ("mtime_age", "written_age", "state"),
    [
        (TTL + 1, None, "stale"),  # no time line: the mtime alone, as before
        (TTL + 1, TTL + 1, "stale"),  # both old
        (TTL + 1, 60.0, "live"),  # restored or copied with an old mtime: its own time says fresh
        (60.0, TTL + 1, "live"),  # rewritten just now with an old first line
        (TTL - 1, None, "live"),
    ],
)
def test_ttl_needs_both_the_mtime_and_the_time_line_to_be_old(
    mtime_age: float, written_age: float | None, state: str
) -> None:
    m = Marker(PATHS["local_kill"], True, mtime_age, "by hand\n", written_age_s=written_age)
    assert halt.sticky_state(m, TTL) == state
    assert (evaluate(snapshot(local_kill=m)).halt == "kill") is (state == "live")


def test_a_forward_clock_step_does_not_void_a_kill_evolve_wrote(tmp_path: Path) -> None:
    """Read with explicit ``now`` values: written at NOW, read after the clock jumped 30 days ahead."""
    p = tmp_path / "KILL"
    p.write_text(marker_text(NOW, "operator kill", "evolve kill"))
    os.utime(p, (NOW, NOW))
    stepped = NOW + 30 * 86400
    d = evaluate(snapshot(local_kill=read_marker(p, stepped)))
    assert d.halt == "kill" and not d.warnings
    # The same file without evolve's record is one an operator or a tool wrote: the TTL applies.
    p.write_text(f"{utc_iso(NOW)}\noperator kill\n")
    os.utime(p, (NOW, NOW))
    assert evaluate(snapshot(local_kill=read_marker(p, stepped))).halt is None
    assert evaluate(snapshot(local_kill=read_marker(p, NOW + 60))).halt == "kill"
