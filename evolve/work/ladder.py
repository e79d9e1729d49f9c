"""The work-selection ladder (docs/DESIGN.md §6) as a pure function of what the sources said.

Rungs in order (standard): harvested → beads → goals (directive gaps, then failing goals) →
generators. ``--quality`` puts high and medium harvested findings first. Probes are asked for
lazily: :func:`select` returns ``need`` naming the rung it must see next, and the shell fills it
in and asks again, so goals are measured and generators run only when the rungs above are empty.
The metronome, the oscillation quarantine and restorative mode are filters applied here.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.results import PRODUCTIVE
from evolve.work.item import WorkItem, clean_text

SOFT_REPEAT = 3
HARD_REPEAT = 5
QUARANTINE_FLIPS = 3
RUNNERS_UP = 5  # eligible items listed in ``considered`` after a rung's top (for --dry-run)
LOOKAHEAD = 50  # items looked at past a rung's top while listing them
RUNNER_UP = "runner-up"
FINDING_SEVERITIES = frozenset({"high", "medium"})

_SUFFIX = re.compile(r"-\d+(st|nd|rd|th)?$")
# A trailing number on a title ("retry lint 2", "bump deps #3", "flaky test (2nd)"): the same work again.
_TITLE_NUMBER = re.compile(r"[\s#(\-]*\d+(st|nd|rd|th)?\)?$")
ITEM_SOURCES_BY_ID = ("goal", "directive")  # their shape is already one goal / directive
KEY_SEP = "~"


@dataclass(frozen=True)
class Probe:
    items: Sequence[WorkItem] = ()  # a tuple, or a lazy sequence converted on read
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
    trailing_modes: tuple[str, ...] = ()  # metronome keys of productive entries, oldest first (productive_modes)
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


def title_stem(title: str) -> str:
    """A title as the metronome compares it: case and spacing folded, a trailing number dropped (pure)."""
    text = " ".join(str(title).lower().split())
    return _TITLE_NUMBER.sub("", text).strip()[:80]


def _key(mode: str, title: str) -> str:
    if mode.split(":", 1)[0] in ITEM_SOURCES_BY_ID:
        return mode
    stem = title_stem(title)
    return f"{mode}{KEY_SEP}{stem}" if stem else mode


def metronome_key(item: WorkItem) -> str:
    """What "the same shape" means to the metronome (docs/DESIGN.md §6.5, issue 16).

    A goal or a directive is one piece of work already: its mode (``goal:<id>``) is the key. A
    concrete item (harvested, bead, generated) adds its title stem to its ``source:type`` mode: five
    *different* bugs in a row are normal work, while the same item coming back again and again
    (re-queued, regenerated with a number on its title) is a thrash.
    """
    return _key(work_mode(item), item.title)


def entry_key(e: Mapping[str, Any]) -> str:
    """:func:`metronome_key` of the cycle a ledger entry records (its ``mode`` and ``target``)."""
    return _key(str(e.get("mode")), str(e.get("target") or ""))


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
        top, after = _scan_rung(rung, probe.items, inp, considered, quarantine)
        if top is None:
            continue
        mode = metronome_key(top)
        streak = trailing_streak(inp.trailing_modes, mode)
        if streak >= HARD_REPEAT:
            considered.append(Considered(rung, top.ref, top.title, f"metronome hard block ({mode} x{streak})"))
            considered.extend(after)
            if inp.rescope:
                item = rescope_item(inp.rescope)
                return done(item=item, rung="rescope", use_rescope=True, reason=f"RESCOPE overrides {mode} x{streak}")
            return done(blocked_mode=mode, reason=f"{mode} repeated {streak} times; RESCOPE needed")
        if streak >= SOFT_REPEAT:
            # Every rung whose top repeats the mode is skipped (in quality mode the harvested source
            # is two rungs, and generated items are harvested items); the first one is the fallback.
            considered.append(Considered(rung, top.ref, top.title, f"metronome: rung skipped ({mode} x{streak})"))
            considered.extend(after)
            if soft is None:
                soft = (top, rung, streak)
            continue
        considered.append(Considered(rung, top.ref, top.title, "selected"))
        considered.extend(after)
        return done(item=top, rung=rung, reason=f"top of the {rung} rung")
    if soft is not None:
        item, rung, streak = soft
        return done(item=item, rung=rung, reason=f"metronome soft skip ({streak}) found nothing else")
    return done()


def _scan_rung(
    rung: str,
    items: Iterable[WorkItem],
    inp: LadderInput,
    considered: list[Considered],
    quarantine: list[tuple[WorkItem, int]],
) -> tuple[WorkItem | None, list[Considered]]:
    """The rung's first eligible item, and what to list after it.

    Items skipped before the top get their verdict in ``considered``. The scan stops soon after
    the top: it lists up to :data:`RUNNERS_UP` eligible runners-up (and the verdicts met on the way),
    looking at no more than :data:`LOOKAHEAD` items past the top, so a long rung is never walked to
    its end. Only goals still due to be reported as quarantined are looked for further (on the goals
    rung), so that the quarantine report stays what a full scan would give.
    """
    rest = iter(items)
    top: WorkItem | None = None
    for it in rest:
        if not _in_rung(rung, it, inp.quality):
            continue
        verdict = _verdict(it, inp, quarantine)
        if verdict is None:
            top = it
            break
        considered.append(Considered(rung, it.ref, it.title, verdict))
    if top is None:
        return None, []
    after: list[Considered] = []
    runners = seen = 0
    for it in rest:
        if runners >= RUNNERS_UP or seen >= LOOKAHEAD:
            _find_quarantined(rung, itertools.chain((it,), rest), inp, after, quarantine)
            break
        seen += 1
        if not _in_rung(rung, it, inp.quality):
            continue
        verdict = _verdict(it, inp, quarantine)
        if verdict is None:
            runners += 1
        after.append(Considered(rung, it.ref, it.title, verdict or RUNNER_UP))
    return top, after


def _find_quarantined(
    rung: str,
    rest: Iterator[WorkItem],
    inp: LadderInput,
    after: list[Considered],
    quarantine: list[tuple[WorkItem, int]],
) -> None:
    """Past the listing: report the goals newly quarantined that the rest of the rung holds.

    Goals come only on the goals rung; the other rungs are not walked for them.
    """
    if rung != "goals":
        return
    pending = set(_pending_quarantine(inp, quarantine))
    if not pending:
        return
    for it in rest:
        if it.ref in pending and _in_rung(rung, it, inp.quality):
            pending.discard(it.ref)
            verdict = _verdict(it, inp, quarantine)
            if verdict is not None:
                after.append(Considered(rung, it.ref, it.title, verdict))
            if not pending:
                return


def _pending_quarantine(inp: LadderInput, quarantine: list[tuple[WorkItem, int]]) -> frozenset[str]:
    """Goal refs that would be reported as newly quarantined and have not been yet."""
    if not inp.goal_flips:
        return frozenset()
    reported = {q.ref for q, _ in quarantine}
    return frozenset(
        ref
        for ref, flips in inp.goal_flips.items()
        if flips >= QUARANTINE_FLIPS and ref not in inp.quarantined_logged and ref not in reported
    )


def _verdict(it: WorkItem, inp: LadderInput, quarantine: list[tuple[WorkItem, int]]) -> str | None:
    """Why ``it`` is not eligible, or None; a goal met here quarantined for the first time is reported."""
    if it.ref in inp.excluded:
        return "scouted earlier in this cycle"
    if it.source == "directive" and it.ref in inp.landed:
        return "directive already landed in this GOALS era"
    if inp.restorative and not it.is_red_reducing:
        return "restorative mode: does not reduce red"
    if it.source == "goal" and inp.goal_flips.get(it.ref, 0) >= QUARANTINE_FLIPS:
        flips = inp.goal_flips[it.ref]
        if it.ref not in inp.quarantined_logged and all(q.ref != it.ref for q, _ in quarantine):
            quarantine.append((it, flips))
        return f"quarantined ({flips} improved->regressed flips)"
    return None


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
    """The metronome keys (:func:`entry_key`) of the productive entries, oldest first."""
    return tuple(entry_key(e) for e in tail if e.get("result") in PRODUCTIVE and e.get("mode"))
