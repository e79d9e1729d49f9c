"""The work-selection ladder (SPEC §6) as a pure function of what the sources said.

Rungs in order (standard): harvested → beads → goals (directive gaps, then failing goals) →
generators. ``--quality`` puts high and medium harvested findings first. Probes are asked for
lazily: :func:`select` returns ``need`` naming the rung it must see next, and the shell fills it
in and asks again, so goals are measured and generators run only when the rungs above are empty.
The metronome, the oscillation quarantine and restorative mode are filters applied here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.work.item import WorkItem, clean_text

SOFT_REPEAT = 3
HARD_REPEAT = 5
QUARANTINE_FLIPS = 3
PRODUCTIVE = frozenset({"improved", "regressed", "harvested"})
FINDING_SEVERITIES = frozenset({"high", "medium"})

_SUFFIX = re.compile(r"-\d+(st|nd|rd|th)?$")


@dataclass(frozen=True)
class Probe:
    items: tuple[WorkItem, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class LadderInput:
    harvested: Probe | None = None
    beads: Probe | None = None
    goals: Probe | None = None  # directive gaps first, then failing goals by weight
    generated: Probe | None = None  # what the generators added to the queue
    beads_enabled: bool = True
    goals_enabled: bool = True
    generators_configured: bool = False
    quality: bool = False
    restorative: bool = False
    trailing_modes: tuple[str, ...] = ()  # modes of productive entries, oldest first
    goal_flips: Mapping[str, int] = field(default_factory=dict)
    quarantined_logged: frozenset[str] = frozenset()
    landed: frozenset[str] = frozenset()  # directive refs already landed in this GOALS era
    excluded: frozenset[str] = frozenset()  # refs scouted earlier in this cycle
    rescope: str | None = None


@dataclass(frozen=True)
class Considered:
    rung: str
    ref: str
    title: str
    verdict: str


@dataclass(frozen=True)
class Selection:
    item: WorkItem | None = None
    rung: str | None = None
    reason: str = ""
    need: str | None = None  # "harvested" | "beads" | "goals" | "generated"
    blocked_mode: str | None = None
    use_rescope: bool = False
    quarantine: tuple[tuple[WorkItem, int], ...] = ()
    considered: tuple[Considered, ...] = ()
    probe_errors: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Every rung was consulted and had nothing, and no probe failed."""
        return self.item is None and self.blocked_mode is None and not self.probe_errors


def work_mode(item: WorkItem) -> str:
    """The metronome's ``mode``: ``selected_source:shape`` with an ordinal suffix stripped."""
    return f"{item.source}:{_SUFFIX.sub('', shape_of(item))}"


def shape_of(item: WorkItem) -> str:
    if item.source in ("goal", "directive"):
        return item.ref.split(":", 1)[-1]
    return item.type or "work"


def trailing_streak(modes: Sequence[str], mode: str) -> int:
    n = 0
    for m in reversed(modes):
        if m != mode:
            break
        n += 1
    return n


def rescope_item(text: str) -> WorkItem:
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    first = next((ln for ln in text.splitlines() if ln.strip()), "operator directive")
    return WorkItem(
        source="directive", ref=f"rescope:{digest}", title=clean_text(first), description=text, type="rescope"
    )


def _rungs(inp: LadderInput) -> list[tuple[str, str]]:
    """``(rung name, input field)`` in consultation order."""
    rungs: list[tuple[str, str]] = []
    if inp.quality:
        rungs.append(("findings", "harvested"))
    rungs.append(("harvested", "harvested"))
    if inp.beads_enabled:
        rungs.append(("beads", "beads"))
    if inp.goals_enabled:
        rungs.append(("goals", "goals"))
    if inp.quality:
        rungs.append(("harvested", "harvested"))
        rungs.pop(1)  # in quality mode the non-finding harvested items come after goals
    if inp.generators_configured:
        rungs.append(("generators", "generated"))
    return rungs


def _in_rung(rung: str, item: WorkItem, quality: bool) -> bool:
    if not quality or rung not in ("findings", "harvested"):
        return True
    finding = item.severity.lower() in FINDING_SEVERITIES
    return finding if rung == "findings" else not finding


def select(inp: LadderInput) -> Selection:
    considered: list[Considered] = []
    errors: list[str] = []
    quarantine: list[tuple[WorkItem, int]] = []
    soft: tuple[WorkItem, str, int] | None = None

    def done(**kw: Any) -> Selection:
        return Selection(considered=tuple(considered), probe_errors=tuple(errors), quarantine=tuple(quarantine), **kw)

    for rung, fld in _rungs(inp):
        probe: Probe | None = getattr(inp, fld)
        if probe is None:
            return done(need=fld)
        if probe.error:
            errors.append(f"{rung}: {probe.error}")
            continue
        items = _eligible(rung, probe.items, inp, considered, quarantine)
        if not items:
            continue
        top = items[0]
        mode = work_mode(top)
        streak = trailing_streak(inp.trailing_modes, mode)
        if streak >= HARD_REPEAT:
            if inp.rescope:
                considered.append(Considered(rung, top.ref, top.title, f"metronome hard block ({mode} x{streak})"))
                item = rescope_item(inp.rescope)
                return done(item=item, rung="rescope", use_rescope=True, reason=f"RESCOPE overrides {mode} x{streak}")
            considered.append(Considered(rung, top.ref, top.title, f"metronome hard block ({mode} x{streak})"))
            return done(blocked_mode=mode, reason=f"{mode} repeated {streak} times; RESCOPE needed")
        if streak >= SOFT_REPEAT:
            # Every rung whose top repeats the mode is skipped (in quality mode the harvested source
            # is two rungs, and generated items are harvested items); the first one is the fallback.
            considered.append(Considered(rung, top.ref, top.title, f"metronome: rung skipped ({mode} x{streak})"))
            if soft is None:
                soft = (top, rung, streak)
            continue
        considered.append(Considered(rung, top.ref, top.title, "selected"))
        return done(item=top, rung=rung, reason=f"top of the {rung} rung")
    if soft is not None:
        item, rung, streak = soft
        return done(item=item, rung=rung, reason=f"metronome soft skip ({streak}) found nothing else")
    return done()


def _eligible(
    rung: str,
    items: Iterable[WorkItem],
    inp: LadderInput,
    considered: list[Considered],
    quarantine: list[tuple[WorkItem, int]],
) -> list[WorkItem]:
    out = []
    for it in items:
        if not _in_rung(rung, it, inp.quality):
            continue
        verdict = None
        if it.ref in inp.excluded:
            verdict = "scouted earlier in this cycle"
        elif it.source == "directive" and it.ref in inp.landed:
            verdict = "directive already landed in this GOALS era"
        elif inp.restorative and not it.is_red_reducing:
            verdict = "restorative mode: does not reduce red"
        elif it.source == "goal" and inp.goal_flips.get(it.ref, 0) >= QUARANTINE_FLIPS:
            flips = inp.goal_flips[it.ref]
            verdict = f"quarantined ({flips} improved->regressed flips)"
            if it.ref not in inp.quarantined_logged and all(q.ref != it.ref for q, _ in quarantine):
                quarantine.append((it, flips))
        if verdict:
            considered.append(Considered(rung, it.ref, it.title, verdict))
            continue
        out.append(it)
    return out


def flips_by_ref(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """improved→regressed transitions per work ref, over entries oldest first."""
    last: dict[str, str] = {}
    flips: dict[str, int] = {}
    for e in entries:
        ref, result = e.get("work_ref"), e.get("result")
        if not isinstance(ref, str) or result not in ("improved", "regressed"):
            continue
        if result == "regressed" and last.get(ref) == "improved":
            flips[ref] = flips.get(ref, 0) + 1
        last[ref] = result
    return flips


def era_entries(tail: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The entries since the last context-handoff: the current agent-session era."""
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].get("result") == "context-handoff":
            return list(tail[i + 1 :])
    return list(tail)


def productive_modes(tail: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(str(e.get("mode")) for e in tail if e.get("result") in PRODUCTIVE and e.get("mode"))
