"""Step 1, the halt gate (docs/DESIGN.md §4.1), as a pure function of an on-disk snapshot.

Probes with side effects or cost (the dormancy work probe, the governor command) are requested
lazily: :func:`evaluate` returns ``need`` and the shell fills that field in and asks again, so a
governor never runs when KILL already decided the fire.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.store.markers import Marker

KILL = "kill"
USER_HALT = "user_halt"
DORMANT = "dormant"
GOVERNOR = "governor_budget_burned"
BREAKER = "breaker_open"
GOAL_REGRESSION = "goal_regression"

NEED_DORMANT_PROBE = "dormant_probe"
NEED_GOVERNOR = "governor"

_RED = re.compile(r"FAIL|BLOCKED")


@dataclass(frozen=True)
class HaltSnapshot:
    now: float
    kill_ttl_s: float
    global_kill: Marker
    local_kill: Marker
    stop: Marker
    dormant: Marker
    handoff: Marker
    ack_regression: Marker
    governor_configured: bool = False
    dormant_probe: str | None = None  # "work" | "empty" | "error"; None = not probed yet
    governor_exit: int | None = None  # None = not run yet; -1 = could not run
    breaker_open_until: float | None = None
    ledger_tail: Sequence[dict[str, Any]] = ()
    ack_regression_cycle: int = 0


@dataclass(frozen=True)
class Step1:
    halt: str | None = None
    need: str | None = None
    detail: str = ""
    clear_dormant: bool = False
    clear_handoff: bool = False
    consume_ack: bool = False
    acked_cycle: int = 0
    breaker_probe: bool = False
    restorative: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def goal_drop(tail: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
    """``(cycle, detail)`` when the last two goal-carrying entries show a drop in the same era.

    Only entries with the same ``goals_total`` (and the same ``goals_era`` when both carry one)
    are comparable, so a GOALS edit or a single-goal re-measure never reads as a regression.
    ``cycle`` is the dropping entry's cycle; upstream writers may leave it out, and then it is
    :func:`drop_cycle` of the tail, so the drop still counts as newer than any acknowledged one.
    """
    carrying = [e for e in tail if _count(e.get("goals_passing")) and _count(e.get("goals_total"))]
    if len(carrying) < 2:
        return None
    prev, last = carrying[-2], carrying[-1]
    if prev["goals_total"] != last["goals_total"]:
        return None
    if prev.get("goals_era") and last.get("goals_era") and prev["goals_era"] != last["goals_era"]:
        return None
    if last["goals_passing"] >= prev["goals_passing"]:
        return None
    fell = f"goals passing fell {prev['goals_passing']} -> {last['goals_passing']} of {last['goals_total']}"
    return drop_cycle(tail, last), fell


def drop_cycle(tail: Sequence[dict[str, Any]], last: dict[str, Any]) -> int:
    """The cycle a drop is acknowledged by: the entry's own ``cycle``; without one (rows upstream
    wrote), one more than the newest numbered entry before it — the cycle evolve numbers next — so
    the drop counts as newer than any acknowledgement before it, an ``ACK-REGRESSION`` records it,
    and the cycles evolve appends afterwards do not move it."""
    own = last.get("cycle")
    if _count(own):
        return int(own)
    before = tail[: next(i for i, e in enumerate(tail) if e is last)]
    return max((int(e["cycle"]) for e in before if _count(e.get("cycle"))), default=0) + 1


def is_red(entry: dict[str, Any] | None) -> bool:
    """The last cycle was red, in either dialect: evolve's ``regressed`` or ``gate: FAIL``, or an
    upstream writer's ``result`` naming ``FAIL`` or ``BLOCKED`` (e.g. ``"FAIL: tests"``)."""
    if not entry:
        return False
    result = entry.get("result")
    if result == "regressed" or (isinstance(result, str) and _RED.search(result)):
        return True
    gate = entry.get("gate")
    return isinstance(gate, str) and bool(_RED.search(gate))


def sticky_state(m: Marker, ttl_s: float) -> str:
    """A KILL or STOP marker: ``live`` (it halts), ``stale``, ``expired`` or ``absent``.

    * ``expires:`` recorded → live until then (the operator's own ``--for``/``--until``);
    * ``written-by:`` recorded (``evolve stop``/``kill``) → live until ``evolve resume``: the
      operator said stop, and no clock, however wrong or stepped, may take that back;
    * otherwise (written by hand or by another tool) the TTL applies, and the marker is stale only
      when BOTH its mtime and the timestamp on its first line are older than it: a file restored
      or copied with an old mtime, or rewritten with an old first line, is still fresh.

    An ``expires:`` line that does not parse counts as no expiry: a halt fails closed.
    """
    if not m.present:
        return "absent"
    if m.expires_in_s is not None:
        return "live" if m.expires_in_s > 0 else "expired"
    if m.author:
        return "live"
    old = m.age_s > ttl_s and (m.written_age_s is None or m.written_age_s > ttl_s)
    return "stale" if old else "live"


def first_kill(found: Sequence[Marker], ttl_s: float) -> Marker:
    """The global KILL that decides, of those read at each global path: the first live one, else
    the first present (its stale or expired state is then what is reported), else the first."""
    for m in found:
        if sticky_state(m, ttl_s) == "live":
            return m
    return next((m for m in found if m.present), found[0])


def _ignored(name: str, m: Marker, ttl_s: float) -> str | None:
    state = sticky_state(m, ttl_s)
    if state == "stale":
        return (
            f"stale {name} marker ignored: {m.path} is {m.age_s / 86400:.1f} days old "
            f"(TTL {ttl_s / 86400:g} days); not deleted"
        )
    if state == "expired":
        return f"expired {name} marker ignored: {m.path} expired {-(m.expires_in_s or 0.0):.0f}s ago; not deleted"
    return None


def marker_halt(s: HaltSnapshot) -> Step1:
    """Rules 1 and 2 alone (KILL, then STOP): also what a running fire re-checks (§4.4)."""
    warnings = [
        w for w in (_ignored(n, m, s.kill_ttl_s) for n, m in
                    (("KILL", s.global_kill), ("KILL", s.local_kill), ("STOP", s.stop)))
        if w
    ]
    w = tuple(warnings)
    for m in (s.global_kill, s.local_kill):
        if sticky_state(m, s.kill_ttl_s) == "live":
            return Step1(halt=KILL, detail=f"{m.path}: {m.content.strip()[:200]}", warnings=w)
    if sticky_state(s.stop, s.kill_ttl_s) == "live":
        return Step1(halt=USER_HALT, detail=s.stop.content.strip()[:200], warnings=w)
    return Step1(warnings=w)


def evaluate(s: HaltSnapshot) -> Step1:
    first = marker_halt(s)
    if first.halt:
        return first
    w = first.warnings

    clear_dormant = False
    if s.dormant.present:
        if s.dormant_probe is None:
            return Step1(need=NEED_DORMANT_PROBE, warnings=w)
        if s.dormant_probe == "empty":
            return Step1(halt=DORMANT, detail=s.dormant.content.strip()[:200], warnings=w)
        if s.dormant_probe == "work":
            clear_dormant = True
        else:
            w = (*w, "DORMANT present but a work source probe failed; going on (fail open)")

    clear_handoff = s.handoff.present

    if s.governor_configured:
        if s.governor_exit is None:
            return Step1(need=NEED_GOVERNOR, clear_dormant=clear_dormant, clear_handoff=clear_handoff, warnings=w)
        if s.governor_exit == 3:
            return Step1(halt=GOVERNOR, clear_dormant=clear_dormant, clear_handoff=clear_handoff, warnings=w)
        if s.governor_exit != 0:
            ran = "could not run (see governor.error)" if s.governor_exit == -1 else f"exited {s.governor_exit}"
            w = (*w, f"governor {ran}; going on")

    common = {"clear_dormant": clear_dormant, "clear_handoff": clear_handoff}
    breaker_probe = False
    if s.breaker_open_until is not None:
        if s.breaker_open_until > s.now:
            return Step1(
                halt=BREAKER, detail=f"open for {s.breaker_open_until - s.now:.0f}s more", warnings=w, **common
            )
        breaker_probe = True

    # ACK-REGRESSION is consumed by the first fire that gets this far, drop or no drop: an ACK
    # written ahead of time must not silently acknowledge some later regression.
    consume_ack = s.ack_regression.present
    acked = 0
    drop = goal_drop(s.ledger_tail)
    if drop is not None and drop[0] > s.ack_regression_cycle:
        if not s.ack_regression.present:
            return Step1(halt=GOAL_REGRESSION, detail=drop[1], warnings=w, breaker_probe=breaker_probe, **common)
        acked = drop[0]

    last = s.ledger_tail[-1] if s.ledger_tail else None
    return Step1(
        restorative=is_red(last),
        breaker_probe=breaker_probe,
        consume_ack=consume_ack,
        acked_cycle=acked,
        warnings=w,
        **common,
    )
