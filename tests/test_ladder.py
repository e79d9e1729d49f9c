"""The work-selection ladder (docs/DESIGN.md §6) as a pure function: no I/O, probes built by hand.

``drive`` answers the ladder's ``need`` requests the way :mod:`evolve.cycle.select` does (fill that
field, ask again) and records which probes were asked for, so every test can assert laziness too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.work import harvested as hq
from evolve.work.item import WorkItem
from evolve.work.ladder import (
    HARD_REPEAT,
    LOOKAHEAD,
    QUARANTINE_FLIPS,
    RUNNER_UP,
    RUNNERS_UP,
    SOFT_REPEAT,
    LadderInput,
    Probe,
    Selection,
    entry_key,
    era_entries,
    flips_by_ref,
    metronome_key,
    productive_modes,
    rescope_item,
    select,
    trailing_streak,
    work_mode,
)

FIELDS = ("harvested", "beads", "goals", "generated")
RESTORATIVE_VERDICT = "restorative mode: does not reduce red"

# -- fixtures -----------------------------------------------------------------------------------


def h(name: str, type: str = "task", severity: str = "medium") -> WorkItem:
    return WorkItem(source="harvested", ref=f"source_epic=ep:item={name}", title=name, type=type, severity=severity,
                    data={"title": name, "type": type, "severity": severity})


def gen(name: str, type: str = "task", severity: str = "medium") -> WorkItem:
    """A generated item, as the shell returns it: re-read from the queue, so a harvested item."""
    return WorkItem(source="harvested", ref=f"dedup=gen-{name}", title=name, type=type, severity=severity,
                    data={"title": name, "source": "evolve-generator", "dedup_key": f"gen-{name}"})


def bead(bid: str, type: str = "task", severity: str = "high") -> WorkItem:
    return WorkItem(source="beads", ref=f"bead:{bid}", title=f"{bid}: bead", type=type, severity=severity)


def directive(n: int | str) -> WorkItem:
    return WorkItem(source="directive", ref=f"directive:{n}", title=f"Directive {n}", type="directive")


def goal(gid: str, severity: str = "high") -> WorkItem:
    return WorkItem(source="goal", ref=f"goal:{gid}", title=f"Fix failing goal {gid}", type="goal",
                    severity=severity)


def probe(*items: WorkItem) -> Probe:
    return Probe(tuple(items))


def drive(sources: Mapping[str, Probe] | None = None, **kw: Any) -> tuple[Selection, list[str]]:
    """Run the need protocol to completion; unlisted sources answer with an empty probe."""
    sources = dict(sources or {})
    inp = LadderInput(**kw)
    asked: list[str] = []
    for _ in range(len(FIELDS) + 1):
        sel = select(inp)
        if sel.need is None:
            return sel, asked
        assert sel.need in FIELDS
        assert sel.need not in asked, f"{sel.need} asked twice"
        asked.append(sel.need)
        inp = replace(inp, **{sel.need: sources.get(sel.need, Probe())})
    raise AssertionError(f"ladder never decided; asked {asked}")


def verdicts(sel: Selection) -> dict[str, str]:
    return {c.ref: c.verdict for c in sel.considered}


ALL = {
    "harvested": probe(h("harvested-top", "bug", "high"), h("harvested-2", "docs", "low")),
    "beads": probe(bead("bd-1"), bead("bd-2")),
    "goals": probe(directive(1), goal("lint"), goal("types")),
    "generated": probe(gen("gen-1")),
}

# -- ranking (docs/DESIGN.md §6 order) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("present", "want_ref", "want_rung", "want_asked"),
    [
        (("harvested", "beads", "goals", "generated"), "source_epic=ep:item=harvested-top", "harvested",
         ["harvested"]),
        (("beads", "goals", "generated"), "bead:bd-1", "beads", ["harvested", "beads"]),
        (("goals", "generated"), "directive:1", "goals", ["harvested", "beads", "goals"]),
        (("generated",), "dedup=gen-gen-1", "generators", ["harvested", "beads", "goals", "generated"]),
        ((), None, None, ["harvested", "beads", "goals", "generated"]),
    ],
)
def test_standard_order_and_laziness(present, want_ref, want_rung, want_asked):
    sources = {k: v for k, v in ALL.items() if k in present}
    sel, asked = drive(sources, generators_configured=True)
    assert asked == want_asked  # never a lower rung while a higher one has work
    assert (sel.item.ref if sel.item else None) == want_ref
    assert sel.rung == want_rung
    assert sel.empty is (want_ref is None)
    if want_ref is not None:
        assert verdicts(sel)[want_ref] == "selected"


def test_first_need_is_harvested_and_probes_are_never_read_before_asked():
    sel = select(LadderInput())
    assert sel.need == "harvested" and sel.item is None
    # A filled lower rung is ignored while a higher rung has work.
    sel = select(LadderInput(harvested=probe(h("a")), beads=probe(bead("b")), goals=probe(goal("g"))))
    assert sel.item is not None and sel.item.ref == "source_epic=ep:item=a"


def test_goals_directives_first_then_failing_goals_in_given_order():
    sel, _ = drive({"goals": probe(directive(2), directive(5), goal("heavy"), goal("light"))})
    assert sel.item == directive(2)
    sel, _ = drive({"goals": probe(goal("heavy"), goal("light"))})
    assert sel.item == goal("heavy")
    sel, _ = drive({"goals": probe(goal("light"), goal("heavy"))})
    assert sel.item == goal("light")  # the source's order (weight desc, id) is kept as given


def test_generators_only_consulted_when_configured():
    sel, asked = drive({"generated": probe(gen("x"))})
    assert asked == ["harvested", "beads", "goals"]
    assert sel.item is None and sel.empty
    sel, asked = drive({"generated": probe(gen("x"))}, generators_configured=True)
    assert asked[-1] == "generated" and sel.item == gen("x") and sel.rung == "generators"


def test_beads_disabled_never_asks_the_tracker():
    sel, asked = drive(ALL | {"harvested": Probe()}, beads_enabled=False, generators_configured=True)
    assert asked == ["harvested", "goals"]
    assert sel.item == directive(1)
    sel, asked = drive({"beads": probe(bead("b"))}, beads_enabled=False)
    assert asked == ["harvested", "goals"] and sel.item is None


def test_goals_disabled_is_beads_only():
    sel, asked = drive({"goals": probe(goal("g")), "generated": probe(gen("x"))}, goals_enabled=False,
                       generators_configured=True)
    assert asked == ["harvested", "beads", "generated"]
    assert sel.item == gen("x")
    sel, asked = drive(ALL | {"harvested": Probe()}, goals_enabled=False)
    assert asked == ["harvested", "beads"] and sel.item == bead("bd-1")


def test_nothing_enabled_but_harvested():
    sel, asked = drive(ALL | {"harvested": Probe()}, beads_enabled=False, goals_enabled=False)
    assert asked == ["harvested"] and sel.empty


# -- quality mode -----------------------------------------------------------------------------------


def quality_order(*items: WorkItem) -> Probe:
    """The harvested probe in the order the queue gives it under ``--quality`` (rank_key, quality=True)."""
    keyed = [(hq.rank_key(dict(it.data), i, 2, True), it) for i, it in enumerate(items)]
    return Probe(tuple(it for _, it in sorted(keyed, key=lambda p: p[0])))


Q_LOW = h("low-bug", "bug", "low")
Q_NONE = h("no-severity", "task", "")
Q_MED = h("medium-docs", "docs", "medium")
Q_HIGH = h("high-chore", "chore", "high")


def test_quality_queue_order_puts_high_then_medium_first():
    assert quality_order(Q_LOW, Q_NONE, Q_MED, Q_HIGH).items == (Q_HIGH, Q_MED, Q_LOW, Q_NONE)


@pytest.mark.parametrize(
    ("harvested", "others", "want", "want_rung", "want_asked"),
    [
        ((Q_LOW, Q_NONE, Q_MED, Q_HIGH), ("beads", "goals", "generated"), Q_HIGH, "findings", ["harvested"]),
        ((Q_LOW, Q_NONE, Q_MED), ("beads", "goals", "generated"), Q_MED, "findings", ["harvested"]),
        ((Q_LOW, Q_NONE), ("beads", "goals", "generated"), bead("bd-1"), "beads", ["harvested", "beads"]),
        ((Q_LOW, Q_NONE), ("goals", "generated"), directive(1), "goals", ["harvested", "beads", "goals"]),
        ((Q_LOW, Q_NONE), ("generated",), Q_LOW, "harvested", ["harvested", "beads", "goals"]),
        ((), ("generated",), gen("gen-1"), "generators", ["harvested", "beads", "goals", "generated"]),
    ],
)
def test_quality_order(harvested, others, want, want_rung, want_asked):
    sources = {k: v for k, v in ALL.items() if k in others} | {"harvested": quality_order(*harvested)}
    sel, asked = drive(sources, quality=True, generators_configured=True)
    assert asked == want_asked
    assert sel.item == want and sel.rung == want_rung


def test_quality_severity_is_case_insensitive():
    sel, _ = drive({"harvested": probe(h("x", "task", "HIGH")), "beads": probe(bead("b"))}, quality=True)
    assert sel.rung == "findings"


def test_quality_without_beads_and_goals():
    sel, asked = drive({"harvested": quality_order(Q_LOW, Q_NONE), "beads": probe(bead("b"))}, quality=True,
                       beads_enabled=False, goals_enabled=False)
    assert asked == ["harvested"] and sel.item == Q_LOW and sel.rung == "harvested"


# -- determinism ----------------------------------------------------------------------------------


def test_same_inputs_same_selection():
    a, asked_a = drive(ALL, generators_configured=True, restorative=True, trailing_modes=("harvested:bug",) * 3)
    b, asked_b = drive(ALL, generators_configured=True, restorative=True, trailing_modes=("harvested:bug",) * 3)
    assert a == b and asked_a == asked_b


def test_ties_keep_the_sources_order():
    x, y = h("x", "bug", "high"), h("y", "bug", "high")
    assert drive({"harvested": probe(x, y)})[0].item == x
    assert drive({"harvested": probe(y, x)})[0].item == y
    b1, b2 = bead("1"), bead("2")
    assert drive({"beads": probe(b2, b1)})[0].item == b2
    assert drive({"harvested": probe(x, y)}, quality=True)[0].item == x
    assert drive({"harvested": probe(y, x)}, quality=True)[0].item == y


# -- restorative mode -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bug", "gate-fix", "fix", "regression", "BUG", "Gate-Fix"])
def test_restorative_accepts_red_reducing_types(kind):
    red = h("red", kind)
    sel, _ = drive({"harvested": probe(h("feat", "feature"), red)}, restorative=True)
    assert sel.item == red
    assert verdicts(sel)[h("feat").ref] == RESTORATIVE_VERDICT


def test_restorative_lists_the_others_and_walks_down_the_ladder():
    sources = {
        "harvested": probe(h("feat", "feature", "high"), h("docs", "docs")),
        "beads": probe(bead("t1", "task"), bead("g1", "gate-fix")),
        "goals": probe(directive(1), goal("lint")),
    }
    sel, asked = drive(sources, restorative=True)
    assert sel.item == bead("g1", "gate-fix") and asked == ["harvested", "beads"]
    v = verdicts(sel)
    for ref in (h("feat").ref, h("docs").ref, "bead:t1"):
        assert v[ref] == RESTORATIVE_VERDICT
    # Without a red bead a failing goal is red-reducing; a directive is not.
    sel, asked = drive(sources | {"beads": probe(bead("t1", "task"))}, restorative=True)
    assert sel.item == goal("lint") and verdicts(sel)["directive:1"] == RESTORATIVE_VERDICT


def test_restorative_with_no_red_reducing_work_selects_nothing():
    sources = {
        "harvested": probe(h("feat", "feature"), h("chore", "chore", "high")),
        "beads": probe(bead("t1", "task")),
        "goals": probe(directive(1)),
        "generated": probe(gen("g", "improvement")),
    }
    sel, asked = drive(sources, restorative=True, generators_configured=True)
    assert sel.item is None and sel.blocked_mode is None
    assert asked == list(FIELDS)
    assert {c.verdict for c in sel.considered} == {RESTORATIVE_VERDICT}
    assert len(sel.considered) == 5


# -- metronome ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "mode"),
    [
        (h("a", "bug"), "harvested:bug"),
        (h("a", ""), "harvested:work"),
        (h("a", "template-applied-3rd"), "harvested:template-applied"),
        (h("a", "template-applied-2nd"), "harvested:template-applied"),
        (h("a", "template-applied-1st"), "harvested:template-applied"),
        (h("a", "template-applied-4th"), "harvested:template-applied"),
        (h("a", "template-applied-12"), "harvested:template-applied"),
        (h("a", "step-2-fix"), "harvested:step-2-fix"),
        (bead("x", "task"), "beads:task"),
        (goal("lint-clean"), "goal:lint-clean"),
        (directive(3), "directive:3"),
        (directive("dir-7th"), "directive:dir"),
    ],
)
def test_work_mode(item, mode):
    assert work_mode(item) == mode


def test_trailing_streak():
    assert trailing_streak([], "m") == 0
    assert trailing_streak(["m", "m", "x", "m", "m"], "m") == 2
    assert trailing_streak(["m", "m", "m"], "m") == 3
    assert trailing_streak(["m", "m", "x"], "m") == 0


META = {"harvested": probe(h("repeat", "bug", "high")), "beads": probe(bead("b1")), "goals": probe(goal("g"))}
REPEAT = "harvested:bug~repeat"  # the metronome key of META's harvested top (issue 16: type and title stem)


@pytest.mark.parametrize("streak", [0, 1, 2])
def test_metronome_quiet_below_three(streak):
    sel, asked = drive(META, trailing_modes=(REPEAT,) * streak)
    assert sel.item == h("repeat", "bug", "high") and asked == ["harvested"]


@pytest.mark.parametrize("streak", [SOFT_REPEAT, HARD_REPEAT - 1])
def test_metronome_soft_skips_the_rung(streak):
    sel, asked = drive(META, trailing_modes=("goal:x", *((REPEAT,) * streak)))
    assert sel.item == bead("b1") and sel.rung == "beads"
    assert asked == ["harvested", "beads"]
    assert verdicts(sel)[h("repeat").ref] == f"metronome: rung skipped ({REPEAT} x{streak})"
    assert sel.blocked_mode is None


def test_metronome_soft_skip_falls_back_when_every_later_rung_is_empty():
    sel, asked = drive({"harvested": META["harvested"]}, trailing_modes=(REPEAT,) * 3,
                       generators_configured=True)
    assert asked == list(FIELDS)
    assert sel.item == h("repeat", "bug", "high") and sel.rung == "harvested"
    assert "metronome" in sel.reason and not sel.empty


def test_metronome_soft_skip_falls_back_past_errors_and_restorative_rejections():
    sources = {"harvested": probe(h("repeat", "bug")), "beads": Probe(error="bd exited 1"),
               "goals": probe(directive(1))}
    sel, _ = drive(sources, trailing_modes=(REPEAT,) * 4, restorative=True)
    assert sel.item == h("repeat", "bug")
    assert sel.probe_errors == ("beads: bd exited 1",)


def test_metronome_soft_skip_only_for_the_repeated_mode():
    sources = {"harvested": probe(h("other", "feature")), "beads": probe(bead("b1"))}
    sel, _ = drive(sources, trailing_modes=(REPEAT,) * 4)
    assert sel.item == h("other", "feature")
    # The gate looks at the rung's top only: a lower harvested item of another mode does not win.
    sources = {"harvested": probe(h("repeat", "bug"), h("other", "feature")), "beads": probe(bead("b1"))}
    sel, _ = drive(sources, trailing_modes=(REPEAT,) * 3)
    assert sel.item == bead("b1")


def test_metronome_soft_skip_applies_to_every_rung_with_that_mode():
    """Quality mode splits the harvested source in two rungs; both tops repeat the same work (``repeat``)."""
    high, low = h("repeat 2", "bug", "high"), h("repeat #3", "bug", "low")
    sel, asked = drive({"harvested": probe(high, low)}, quality=True, trailing_modes=(REPEAT,) * 3)
    assert asked == ["harvested", "beads", "goals"]
    assert sel.item == high and sel.rung == "findings"  # the first skipped candidate is the fallback
    sel, _ = drive({"harvested": probe(high, low), "goals": probe(goal("g"))}, quality=True,
                   trailing_modes=(REPEAT,) * 3)
    assert sel.item == goal("g")
    # Generated items come back as harvested items: one of the same shape is skipped as well.
    sel, _ = drive({"harvested": probe(h("t", "task")), "generated": probe(gen("t 2", "task"))},
                   generators_configured=True, trailing_modes=("harvested:task~t",) * 3)
    assert sel.item == h("t", "task") and sel.rung == "harvested"


@pytest.mark.parametrize("streak", [HARD_REPEAT, HARD_REPEAT + 1, 9])
def test_metronome_hard_block(streak):
    sel, asked = drive(META, trailing_modes=(REPEAT,) * streak, generators_configured=True)
    assert sel.item is None and sel.blocked_mode == REPEAT
    assert asked == ["harvested"]  # no lower rung is consulted
    assert not sel.empty and not sel.use_rescope
    assert "RESCOPE" in sel.reason
    assert verdicts(sel)[h("repeat").ref].startswith("metronome hard block")


def test_metronome_hard_block_on_a_lower_rung():
    key = metronome_key(bead("b1"))
    assert key == "beads:task~b1: bead"
    sel, asked = drive({"beads": probe(bead("b1"))}, trailing_modes=(key,) * 5)
    assert asked == ["harvested", "beads"] and sel.blocked_mode == key


def test_rescope_overrides_a_hard_block():
    text = "\n  \nFocus on the docs\tnow\nsecond line"
    sel, asked = drive(META, trailing_modes=(REPEAT,) * 5, rescope=text)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    assert sel.use_rescope and sel.rung == "rescope" and sel.blocked_mode is None
    assert sel.item is not None
    assert sel.item.source == "directive" and sel.item.ref == f"rescope:{digest}"
    assert sel.item.title == "Focus on the docs now" and sel.item.description == text
    assert sel.item == rescope_item(text)
    assert asked == ["harvested"]


def test_rescope_is_ignored_without_a_block():
    sel, _ = drive(META, trailing_modes=(REPEAT,) * 4, rescope="do something else")
    assert not sel.use_rescope and sel.item == bead("b1")


@pytest.mark.parametrize(
    ("item", "key"),
    [
        (h("fix the parser", "bug"), "harvested:bug~fix the parser"),
        (h("Fix  the Parser 2", "bug"), "harvested:bug~fix the parser"),  # case, spacing, a trailing number
        (h("retry lint #3", "task"), "harvested:task~retry lint"),
        (h("flaky test (2nd)", "task"), "harvested:task~flaky test"),
        (h("step-2-fix", "task"), "harvested:task~step-2-fix"),  # a number inside is part of the title
        (h("", "bug"), "harvested:bug"),
        (gen("bump deps 4"), "harvested:task~bump deps"),
        (bead("x", "task"), "beads:task~x: bead"),
        (goal("lint-clean"), "goal:lint-clean"),  # a goal is one piece of work already
        (directive("dir-7th"), "directive:dir"),
    ],
)
def test_metronome_key(item, key):
    assert metronome_key(item) == key


def test_five_different_items_of_one_type_are_normal_work_not_a_thrash():
    """Issue 16: five different bugs in a row do not block; the same bug coming back five times does."""
    done = tuple(metronome_key(h(f"bug in module {m}", "bug")) for m in "abcde")
    sel, _ = drive({"harvested": probe(h("bug in module f", "bug"))}, trailing_modes=done)
    assert sel.item == h("bug in module f", "bug") and sel.blocked_mode is None
    again = (metronome_key(h("bug in module a 1", "bug")),) * 5
    sel, _ = drive({"harvested": probe(h("bug in module a 6", "bug"))}, trailing_modes=again)
    assert sel.item is None and sel.blocked_mode == "harvested:bug~bug in module a"
    # A goal worked five productive cycles in a row is still a thrash.
    sel, _ = drive({"goals": probe(goal("g"))}, trailing_modes=("goal:g",) * 5)
    assert sel.blocked_mode == "goal:g"


def test_entry_key_reads_mode_and_target():
    assert entry_key({"mode": "harvested:bug", "target": "Fix the parser 2"}) == "harvested:bug~fix the parser"
    assert entry_key({"mode": "goal:g", "target": "Fix failing goal g"}) == "goal:g"
    assert entry_key({"mode": "beads:task"}) == "beads:task"


def entry(result: str, mode: str | None = None, ref: str | None = None, target: str | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"result": result}
    if target is not None:
        e["target"] = target
    if mode is not None:
        e["mode"] = mode
    if ref is not None:
        e["work_ref"] = ref
    return e


def test_productive_modes_drop_non_productive_entries():
    tail = [
        entry("improved", "beads:task"),
        entry("improved", "harvested:bug", target="repeat"),
        entry("unchanged", "idle"),
        entry("regressed", "harvested:bug", target="Repeat 2"),
        entry("scout", "harvested:bug"),
        entry("idle", "idle"),
        entry("context-handoff", "harvested:task"),
        entry("harvested", "harvested:bug", target="repeat"),
        entry("unchanged", "beads:task"),  # an unchanged cycle does not break the streak either
        entry("quarantined", "goal:g"),
        entry("failed", "beads:task"),
        entry("improved"),  # no mode
    ]
    modes = productive_modes(tail)
    assert modes == ("beads:task", REPEAT, REPEAT, REPEAT)
    sel, _ = drive(META, trailing_modes=modes)
    assert sel.item == bead("b1")  # streak 3: soft skip


def test_only_trailing_productive_modes_count():
    tail = [entry("improved", "harvested:bug", target="repeat")] * 2 + [entry("improved", "beads:task")] + \
        [entry("improved", "harvested:bug", target="repeat")] * 2
    sel, asked = drive(META, trailing_modes=productive_modes(tail))
    assert sel.item == h("repeat", "bug", "high") and asked == ["harvested"]


def test_suffix_canonicalisation_in_the_metronome():
    items = [h(f"again {i}", f"template-applied-{n}") for i, n in enumerate(["1st", "2nd", "3rd"])]
    assert {work_mode(it) for it in items} == {"harvested:template-applied"}
    modes = tuple(metronome_key(it) for it in items)
    assert set(modes) == {"harvested:template-applied~again"}
    sources = {"harvested": probe(h("again", "template-applied")), "beads": probe(bead("b1"))}
    assert drive(sources, trailing_modes=modes)[0].item == bead("b1")
    sources = {"harvested": probe(h("again 4", "template-applied-4th")), "beads": probe(bead("b1"))}
    assert drive(sources, trailing_modes=("harvested:template-applied~again",) * 5)[0].blocked_mode == \
        "harvested:template-applied~again"


def test_goal_and_directive_modes_use_their_id():
    sources = {"goals": probe(goal("lint"), goal("types"))}
    sel, _ = drive(sources, trailing_modes=("goal:lint",) * 3)
    assert sel.item == goal("lint")  # the goals rung is skipped, nothing below: fall back
    sel, _ = drive(sources | {"generated": probe(gen("x"))}, trailing_modes=("goal:lint",) * 3,
                   generators_configured=True)
    assert sel.item == gen("x")
    sel, _ = drive(sources, trailing_modes=("goal:types",) * 5)
    assert sel.item == goal("lint")  # another goal's streak does not block this one


# -- oscillation quarantine -----------------------------------------------------------------------


def test_flips_by_ref_counts_improved_to_regressed_only():
    a, b = "goal:a", "goal:b"
    tail = [
        entry("improved", ref=a), entry("regressed", ref=a),  # flip 1
        entry("regressed", ref=b), entry("improved", ref=b),  # regressed→improved: no flip
        entry("improved", ref=a), entry("regressed", ref=a),  # flip 2
        entry("improved", ref=b),
        entry("improved", ref=a), entry("improved", ref=a), entry("regressed", ref=a),  # flip 3
        entry("regressed", ref=a),  # regressed→regressed: no flip
        entry("regressed", ref=b),  # interleaved refs are tracked separately: b flips once
    ]
    assert flips_by_ref(tail) == {a: 3, b: 1}


def test_flips_by_ref_ignores_other_transitions_and_bad_rows():
    assert flips_by_ref([entry("improved", ref="goal:a"), entry("unchanged", ref="goal:a")]) == {}
    assert flips_by_ref([entry("regressed", ref="goal:a"), entry("improved", ref="goal:a")]) == {}
    assert flips_by_ref([entry("improved"), entry("regressed")]) == {}  # no work_ref
    assert flips_by_ref([{"result": "improved", "work_ref": 7}, {"result": "regressed", "work_ref": 7}]) == {}
    assert flips_by_ref([]) == {}


def test_era_entries_start_after_the_last_context_handoff():
    a, b, c, d = entry("improved", ref="x"), entry("regressed", ref="x"), entry("improved", ref="y"), entry("idle")
    handoff = entry("context-handoff")
    assert era_entries([a, b]) == [a, b]
    assert era_entries([a, handoff, b, c]) == [b, c]
    assert era_entries([a, handoff, b, handoff, c, d]) == [c, d]
    assert era_entries([a, b, handoff]) == []
    assert era_entries([]) == []


def test_flips_before_a_handoff_do_not_count():
    flip = [entry("improved", ref="goal:a"), entry("regressed", ref="goal:a")]
    tail = flip * 3 + [entry("context-handoff")] + flip
    assert flips_by_ref(tail) == {"goal:a": 4}
    assert flips_by_ref(era_entries(tail)) == {"goal:a": 1}


def test_quarantined_goal_is_skipped_and_reported_once():
    ga, gb = goal("a"), goal("b")
    sel, asked = drive({"goals": probe(ga, gb)}, goal_flips={"goal:a": QUARANTINE_FLIPS})
    assert sel.item == gb and asked == ["harvested", "beads", "goals"]
    assert sel.quarantine == ((ga, QUARANTINE_FLIPS),)
    assert verdicts(sel)["goal:a"] == f"quarantined ({QUARANTINE_FLIPS} improved->regressed flips)"
    # Already logged in this era: still skipped, not reported again.
    sel, _ = drive({"goals": probe(ga, gb)}, goal_flips={"goal:a": 4}, quarantined_logged=frozenset({"goal:a"}))
    assert sel.item == gb and sel.quarantine == ()
    assert verdicts(sel)["goal:a"].startswith("quarantined")


def test_quarantine_threshold_and_scope():
    ga, gb = goal("a"), goal("b")
    sel, _ = drive({"goals": probe(ga, gb)}, goal_flips={"goal:a": QUARANTINE_FLIPS - 1})
    assert sel.item == ga and sel.quarantine == ()
    # Only goals are quarantined: flips on a directive's or a bead's ref do not skip it.
    sel, _ = drive({"goals": probe(directive(1), ga)}, goal_flips={"directive:1": 5})
    assert sel.item == directive(1)
    sel, _ = drive({"beads": probe(bead("x"))}, goal_flips={"bead:x": 5})
    assert sel.item == bead("x")


def test_quarantine_is_lazy_and_can_empty_the_ladder():
    ga = goal("a")
    # A higher rung has work: goals are not consulted, nothing is reported.
    sel, asked = drive({"harvested": probe(h("x")), "goals": probe(ga)}, goal_flips={"goal:a": 3})
    assert asked == ["harvested"] and sel.quarantine == ()
    # Every failing goal quarantined and nothing else: idle, with the quarantine reported.
    sel, asked = drive({"goals": probe(ga, goal("b"))}, goal_flips={"goal:a": 3, "goal:b": 7},
                       generators_configured=True)
    assert asked == list(FIELDS)
    assert sel.item is None and sel.empty
    assert [(q.ref, n) for q, n in sel.quarantine] == [("goal:a", 3), ("goal:b", 7)]


def test_quarantine_from_a_ledger_tail():
    flip = [entry("improved", "goal:a", "goal:a"), entry("regressed", "goal:a", "goal:a")]
    tail = [entry("context-handoff"), *flip, entry("improved", "beads:task", "bead:1"), *flip, *flip]
    era = era_entries(tail)
    sel, _ = drive({"goals": probe(goal("a"), goal("b"))}, goal_flips=flips_by_ref(era),
                   trailing_modes=productive_modes(tail))
    assert sel.item == goal("b") and [q.ref for q, _ in sel.quarantine] == ["goal:a"]


# -- excluded, landed, probe errors -----------------------------------------------------------------


def test_excluded_refs_are_skipped_with_a_verdict():
    x, y = h("x", "bug", "high"), h("y")
    sel, _ = drive({"harvested": probe(x, y)}, excluded=frozenset({x.ref}))
    assert sel.item == y and verdicts(sel)[x.ref] == "scouted earlier in this cycle"
    sel, asked = drive({"harvested": probe(x), "beads": probe(bead("1"), bead("2"))},
                       excluded=frozenset({x.ref, "bead:1"}))
    assert sel.item == bead("2") and asked == ["harvested", "beads"]


def test_landed_directives_are_skipped():
    sel, _ = drive({"goals": probe(directive(1), directive(2), goal("g"))},
                   landed=frozenset({"directive:1", "directive:2"}))
    assert sel.item == goal("g")
    assert verdicts(sel)["directive:1"] == "directive already landed in this GOALS era"
    # "landed" concerns directives only.
    sel, _ = drive({"goals": probe(goal("g"))}, landed=frozenset({"goal:g"}))
    assert sel.item == goal("g")


def test_probe_errors_are_collected_and_the_ladder_moves_on():
    sources = {"harvested": Probe(error="cannot read next-work.jsonl"), "beads": Probe(error="bd exited 2"),
               "goals": probe(goal("g"))}
    sel, asked = drive(sources)
    assert sel.item == goal("g") and asked == ["harvested", "beads", "goals"]
    assert sel.probe_errors == ("harvested: cannot read next-work.jsonl", "beads: bd exited 2")
    assert not sel.empty


def test_probe_error_is_never_empty():
    sel, _ = drive({"generated": Probe(error="gen failed")}, generators_configured=True)
    assert sel.item is None and sel.probe_errors == ("generators: gen failed",)
    assert not sel.empty
    sel, _ = drive({"harvested": Probe(error="x")}, quality=True, beads_enabled=False, goals_enabled=False)
    assert sel.probe_errors[0] == "findings: x" and not sel.empty  # asked once


def test_empty_only_when_nothing_and_no_errors():
    assert drive()[0].empty
    assert Selection().empty
    assert not Selection(item=h("x")).empty
    assert not Selection(blocked_mode="harvested:bug").empty
    assert not Selection(probe_errors=("beads: x",)).empty


# -- property: first eligible item in rung order ----------------------------------------------------

TYPES = ["bug", "task", "feature", "docs", "chore", "fix", "regression", "gate-fix", "", "template-applied-2nd"]
SEVERITIES = ["high", "medium", "low", "", "HIGH"]
RED = {"bug", "gate-fix", "fix", "regression"}

item_spec = st.tuples(st.sampled_from(TYPES), st.sampled_from(SEVERITIES))
probe_spec = st.one_of(st.none(), st.lists(item_spec, max_size=4))  # None: the probe errors


@st.composite
def scenarios(draw):
    specs = {f: draw(probe_spec) for f in FIELDS}
    sources: dict[str, Probe] = {}
    all_items: list[WorkItem] = []
    for f, spec in specs.items():
        if spec is None:
            sources[f] = Probe(error=f"{f} failed")
            continue
        items = []
        for i, (kind, sev) in enumerate(spec):
            if f == "harvested":
                it = h(f"h{i}", kind, sev)
            elif f == "generated":
                it = gen(f"g{i}", kind, sev)
            elif f == "beads":
                it = bead(str(i), kind, sev)
            else:
                it = directive(i) if draw(st.booleans()) else goal(f"g{i}", sev)
            items.append(it)
        sources[f] = Probe(tuple(items))
        all_items.extend(items)
    refs = sorted({it.ref for it in all_items})
    subset = st.frozensets(st.sampled_from(refs)) if refs else st.just(frozenset())
    flags = {
        "quality": draw(st.booleans()),
        "beads_enabled": draw(st.booleans()),
        "goals_enabled": draw(st.booleans()),
        "generators_configured": draw(st.booleans()),
        "restorative": draw(st.booleans()),
        "excluded": draw(subset),
        "landed": draw(subset),
    }
    return sources, flags


def reference(
    sources: Mapping[str, Probe], flags: Mapping[str, Any]
) -> tuple[WorkItem | None, list[str], list[str]]:
    """An independent, deliberately naive statement of docs/DESIGN.md §6 (no metronome, no quarantine)."""

    def finding(it: WorkItem) -> bool:
        return it.severity.lower() in ("high", "medium")

    def eligible(it: WorkItem) -> bool:
        if it.ref in flags["excluded"]:
            return False
        if it.source == "directive" and it.ref in flags["landed"]:
            return False
        red = it.source == "goal" or it.type.lower() in RED
        return red or not flags["restorative"]

    rungs: list[tuple[str, Any]] = []
    if flags["quality"]:
        rungs.append(("harvested", finding))
    else:
        rungs.append(("harvested", lambda it: True))
    if flags["beads_enabled"]:
        rungs.append(("beads", lambda it: True))
    if flags["goals_enabled"]:
        rungs.append(("goals", lambda it: True))
    if flags["quality"]:
        rungs.append(("harvested", lambda it: not finding(it)))
    if flags["generators_configured"]:
        rungs.append(("generated", lambda it: True))
    asked: list[str] = []
    errors: list[str] = []  # one per consulted rung whose probe failed
    for fld, member in rungs:
        if fld not in asked:
            asked.append(fld)
        if sources[fld].error:
            errors.append(fld)
            continue
        for it in sources[fld].items:
            if member(it) and eligible(it):
                return it, asked, errors
    return None, asked, errors


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_property_first_eligible_item_in_rung_order(scenario):
    sources, flags = scenario
    sel, asked = drive(sources, **flags)
    want, want_asked, want_errors = reference(sources, flags)
    assert sel.item == want
    assert asked == want_asked
    assert sel.blocked_mode is None and not sel.use_rescope and sel.quarantine == ()
    assert len(sel.probe_errors) == len(want_errors)
    assert sel.empty == (want is None and not sel.probe_errors)
    assert drive(sources, **flags) == (sel, asked)  # deterministic


# -- the scan stops soon after a rung's top -------------------------------------------------------


class Counted:
    """A probe's items that count how many the ladder looked at."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.items = items
        self.seen = 0

    def __iter__(self):
        for it in self.items:
            self.seen += 1
            yield it


def test_a_long_rung_is_not_walked_to_its_end():
    items = Counted([h(f"i{n}") for n in range(100_000)])
    sel, _ = drive({"harvested": Probe(items)})  # type: ignore[arg-type]
    assert sel.item == h("i0")
    assert items.seen <= 1 + LOOKAHEAD + 1
    assert [(c.ref, c.verdict) for c in sel.considered] == [(h("i0").ref, "selected")] + [
        (h(f"i{n}").ref, RUNNER_UP) for n in range(1, RUNNERS_UP + 1)
    ]


def test_skipped_items_before_the_top_keep_their_verdicts():
    skipped = [h(f"s{n}") for n in range(200)]
    items = [*skipped, h("top"), h("x", "feature"), h("next")]
    sel, _ = drive({"harvested": probe(*items)}, excluded=frozenset(s.ref for s in skipped) | {h("x").ref})
    assert sel.item == h("top")
    v = [(c.ref, c.verdict) for c in sel.considered]
    assert v[:200] == [(s.ref, "scouted earlier in this cycle") for s in skipped]
    assert v[200:] == [(h("top").ref, "selected"), (h("x").ref, "scouted earlier in this cycle"),
                       (h("next").ref, RUNNER_UP)]


def test_the_listing_past_the_top_is_bounded():
    after = [h(f"x{n}") for n in range(3 * LOOKAHEAD)]
    items = Counted([h("top"), *after, h("late")])
    sel, _ = drive({"harvested": Probe(items)}, excluded=frozenset(x.ref for x in after))  # type: ignore[arg-type]
    assert sel.item == h("top")
    assert len(sel.considered) == 1 + LOOKAHEAD
    assert items.seen <= 2 + LOOKAHEAD


def test_a_quarantined_goal_past_the_listing_is_still_reported():
    goals = [goal(f"ok{n}") for n in range(3 * LOOKAHEAD)]
    bad = goal("bad")
    sel, _ = drive({"goals": probe(*goals, bad)}, goal_flips={"goal:bad": QUARANTINE_FLIPS})
    assert sel.item == goals[0]
    assert sel.quarantine == ((bad, QUARANTINE_FLIPS),)
    assert verdicts(sel)["goal:bad"].startswith("quarantined")
    # Already reported in this era: nothing to look for past the listing.
    items = Counted([*goals, bad])
    sel, _ = drive({"goals": Probe(items)}, goal_flips={"goal:bad": 5},  # type: ignore[arg-type]
                   quarantined_logged=frozenset({"goal:bad"}))
    assert sel.quarantine == () and items.seen <= 2 + LOOKAHEAD


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.integers(0, 5), min_size=0, max_size=80),
    logged=st.sets(st.integers(0, 79)),
    excluded=st.sets(st.integers(0, 79)),
)
def test_property_quarantine_report_equals_a_full_scan(flips, logged, excluded):
    goals = [goal(f"g{n}") for n in range(len(flips))]
    goal_flips = {g.ref: f for g, f in zip(goals, flips, strict=True) if f}
    kw = {"goal_flips": goal_flips, "quarantined_logged": frozenset(f"goal:g{n}" for n in logged),
          "excluded": frozenset(f"goal:g{n}" for n in excluded)}
    sel, _ = drive({"goals": probe(*goals)}, **kw)
    want = [(g, goal_flips[g.ref]) for g in goals
            if g.ref not in kw["excluded"] and goal_flips.get(g.ref, 0) >= QUARANTINE_FLIPS
            and g.ref not in kw["quarantined_logged"]]
    assert list(sel.quarantine) == want
    eligible = [g for g in goals if g.ref not in kw["excluded"] and goal_flips.get(g.ref, 0) < QUARANTINE_FLIPS]
    assert sel.item == (eligible[0] if eligible else None)
