"""What happens after a cycle (docs/DESIGN.md §4.2-§4.4, §8): one pure function.

``after_cycle(state, facts, policy)`` takes the loop's state as it was when the cycle ended, the
facts the cycle produced and the configured policy, and returns a :class:`Transition`: the next
state, what to do with the claim, whether to park the item, the breaker change, the stop reason
and exit code, and the log/notify effects the shell performs. Nothing here reads a file, a clock
or the environment, so every rule is a row in a table test (``tests/test_transition.py``).

The shell (:mod:`evolve.cycle.fire`) applies a transition in a fixed order — ledger entry, claim,
follow-up work, state — so a crash between two steps is reconciled by :func:`claim_action`, the
same rule :mod:`evolve.cycle.reconcile` uses for a fire that died.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from evolve import exitcodes
from evolve.cycle import budget
from evolve.results import COMMIT_FAILED, GREEN, LAND_FAILED, SUCCESS, CycleResult
from evolve.store.session_state import SessionState
from evolve.timeutil import utc_iso

PERCEPTS_KEPT = 20  # facts agents reported, newest last
PARKED_KEPT = 200  # refs parked by the attempt budget, remembered for `status` and `evolve requeue`
INFRA = "fatal"  # an infrastructure error (missing binary, HTTP 401): the item did nothing wrong
DIRECTIVES_KEPT = 200  # landed directives remembered per GOALS era


class ClaimAction(StrEnum):
    FINALIZE = "finalize"  # consumed: the work stands
    RELEASE = "release"  # back to the source for another attempt
    NONE = "none"  # already settled (a scout with nothing next) or no source to talk to
    KEEP = "keep"  # the item waits with its green commits (pending): its claim is the pending record's


class Breaker(StrEnum):
    OPEN = "open"
    CLOSED = "closed"  # it was open or counting, and a good cycle reset it


class Stop(StrEnum):
    """Why a cycle ends the fire (``FireOutcome.reason``)."""

    INTERRUPTED = "interrupted"
    RATE_LIMITED = "rate_limited"
    AGENT_FATAL = "agent_fatal"
    COMMIT_FAILED = "commit_failed"  # the repo cannot take a commit: every further cycle would be wasted
    CONTEXT_HANDOFF = "context-handoff"
    BREAKER_OPEN = "breaker_open"


def claim_action(result: str, *, heavy: bool) -> ClaimAction:
    """Consume only work that stands and whose session did not run out of room.

    A heavy cycle parks its item for a fresh session: released, so the next session takes it again.
    A ``pending`` cycle's item keeps its claim whatever else holds: its work exists and waits to land,
    and it is finalized once that work is on the branch (docs/DESIGN.md §8.3), never redone.
    """
    if result == CycleResult.PENDING:
        return ClaimAction.KEEP
    return ClaimAction.FINALIZE if result in SUCCESS and not heavy else ClaimAction.RELEASE


@dataclass(frozen=True)
class Policy:
    max_attempts: int = 3
    breaker_failures: int = 3
    breaker_cooldown_s: float = 1800.0
    streak_limit: int = 2


@dataclass(frozen=True)
class CycleFacts:
    """What one cycle produced, reduced to what the post-cycle rules read."""

    cycle: int
    result: CycleResult
    work_ref: str
    source: str
    mode: str  # the metronome's ``source:shape``
    now: float
    heavy: bool = False
    context_signal: str = ""
    error_class: str = ""
    percepts: tuple[str, ...] = ()
    has_new_work: bool = False
    directive_era: str | None = None  # a directive's GOALS era, when the item is one
    claim_settled: bool = False  # the claim was already dealt with (or there is no source)


@dataclass(frozen=True)
class Effect:
    """A log line (and, with ``notify``, an observer event) the shell emits for the transition."""

    event: str
    level: str = "info"
    fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    notify: bool = False


@dataclass(frozen=True)
class Park:
    """Park the item: its attempt budget is spent (docs/DESIGN.md §8)."""

    note: str
    attempts: int


@dataclass(frozen=True)
class Transition:
    state: SessionState  # the next state (a new object: the input is never changed)
    claim: ClaimAction
    park: Park | None = None
    queue_new_work: bool = False
    breaker: Breaker | None = None
    stop: Stop | None = None
    exit_code: int = exitcodes.OK
    handoff: bool = False  # write HANDOFF and the context-handoff entry, then end the fire
    effects: tuple[Effect, ...] = ()


def after_cycle(state: SessionState, facts: CycleFacts, policy: Policy) -> Transition:
    """The whole post-cycle decision (see the module docstring)."""
    effects: list[Effect] = []
    claim = ClaimAction.NONE if facts.claim_settled else claim_action(facts.result, heavy=facts.heavy)
    attempts, parked, park = _attempts(state, facts, claim, policy)
    streak = budget.next_streak(state.context_streak, heavy=facts.heavy, result=facts.result)
    if facts.heavy and facts.work_ref not in parked:
        parked = [*parked, facts.work_ref]
    if streak != state.context_streak:
        fields = _fields(streak=streak, limit=policy.streak_limit, signal=facts.context_signal)
        effects.append(Effect("context.streak", fields=fields))
    failures, until, breaker = _breaker(state, facts, policy, effects)
    nxt = replace(
        state,
        claimed_work=None,
        attempts=attempts,
        parked_work=parked,
        parked_items=_parked_items(state, facts, claim, park),
        landed_directives=_landed(state, facts),
        percepts=[*state.percepts, *facts.percepts][-PERCEPTS_KEPT:] if facts.percepts else list(state.percepts),
        last_logged_cycle=facts.cycle,
        mode_repeat_streak=_mode_streak(state, facts),
        last_result=str(facts.result),
        last_mode=facts.mode,
        last_selected_source=facts.source,
        context_streak=streak,
        consecutive_failures=failures,
        breaker_open_until=until,
    )
    stop, code, handoff = _stop(facts, streak, policy, breaker)
    return Transition(
        state=nxt,
        claim=claim,
        park=park,
        queue_new_work=facts.has_new_work and facts.result in GREEN,
        breaker=breaker,
        stop=stop,
        exit_code=code,
        handoff=handoff,
        effects=tuple(effects),
    )


def after_handoff(state: SessionState, cycle: int) -> SessionState:
    """The state once HANDOFF and the ``context-handoff`` entry (at ``cycle``) are written."""
    session = replace(state.agent_session, ended_heavy=True) if state.agent_session else None
    return replace(
        state,
        last_logged_cycle=cycle,
        last_result=str(CycleResult.CONTEXT_HANDOFF),
        context_streak=0,
        agent_session=session,
    )


def _fields(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType({k: (v if v != "" else None) for k, v in kw.items()})


def _attempts(
    state: SessionState, facts: CycleFacts, claim: ClaimAction, policy: Policy
) -> tuple[dict[str, int], list[Any], Park | None]:
    """The per-item attempt budget (docs/DESIGN.md §8): park an item that keeps failing.

    Rate limits, interruptions, context hand-offs, a failed commit (the repo's fault, issue 15) and
    an infrastructure error (``fatal``: a missing binary, bad credentials, issue 16) are not
    attempts: the item did nothing wrong.
    """
    attempts, parked, ref = dict(state.attempts), list(state.parked_work), facts.work_ref
    if claim in (ClaimAction.FINALIZE, ClaimAction.KEEP):
        attempts.pop(ref, None)
        return attempts, [r for r in parked if r != ref], None
    counts = (
        claim is ClaimAction.RELEASE
        and facts.result in (CycleResult.FAILED, CycleResult.REGRESSED)
        and not facts.heavy
        and facts.error_class not in ("limit", "interrupted", COMMIT_FAILED, LAND_FAILED, INFRA)
    )
    if not counts:
        return attempts, parked, None
    n = attempts.get(ref, 0) + 1
    if n < policy.max_attempts:
        attempts[ref] = n
        return attempts, parked, None
    attempts.pop(ref, None)
    note = f"evolve: parked after {n} failed attempts (last: {facts.result} {facts.error_class})".strip()
    return attempts, parked, Park(note, n)


def _parked_items(state: SessionState, facts: CycleFacts, claim: ClaimAction, park: Park | None) -> list[str]:
    """The refs the attempt budget parked (until `evolve requeue`); one that lands is no longer parked."""
    items = [r for r in state.parked_items if r != facts.work_ref]
    if park is not None:
        items.append(facts.work_ref)
    elif claim not in (ClaimAction.FINALIZE, ClaimAction.KEEP) and facts.work_ref in state.parked_items:
        items.append(facts.work_ref)  # still parked: keep it (at the end: the newest park last)
    return items[-PARKED_KEPT:]


def _landed(state: SessionState, facts: CycleFacts) -> list[str]:
    if facts.source == "directive" and facts.result is CycleResult.IMPROVED and facts.directive_era:
        return [*state.landed_directives, f"{facts.directive_era}|{facts.work_ref}"][-DIRECTIVES_KEPT:]
    return list(state.landed_directives)


def _mode_streak(state: SessionState, facts: CycleFacts) -> int:
    if not facts.result.productive:
        return state.mode_repeat_streak
    return state.mode_repeat_streak + 1 if state.last_mode == facts.mode else 1


def _breaker(
    state: SessionState, facts: CycleFacts, policy: Policy, effects: list[Effect]
) -> tuple[int, str | None, Breaker | None]:
    """Failed non-limit cycles count; ``max`` of them in a row open it; any other result resets it.

    Interrupted cycles neither count nor reset: the operator stopped the run, the agent did not fail.
    An infrastructure error (``fatal``) opens it at once: the next attempt would fail the same way
    until an operator fixes the cause (and `evolve breaker reset` closes it then).
    """
    failures, until = state.consecutive_failures, state.breaker_open_until
    if facts.result is CycleResult.FAILED and facts.error_class != "limit":
        failures += 1
        if failures < policy.breaker_failures and facts.error_class != INFRA:
            return failures, until, None
        until = utc_iso(facts.now + policy.breaker_cooldown_s)
        cause = "infrastructure error (fatal)" if facts.error_class == INFRA else f"{failures} failed cycles in a row"
        fields = _fields(failures=failures, until=until, cause=cause, remedy="evolve breaker reset, once fixed")
        effects.append(Effect("breaker.open", "warning", fields, notify=True))
        return failures, until, Breaker.OPEN
    if facts.result in (CycleResult.FAILED, CycleResult.INTERRUPTED):
        return failures, until, None
    if failures or until:
        effects.append(Effect("breaker.closed"))
        return 0, None, Breaker.CLOSED
    return 0, None, None


def _stop(facts: CycleFacts, streak: int, policy: Policy, breaker: Breaker | None) -> tuple[Stop | None, int, bool]:
    """The first stop that applies, in order; a context hand-off outranks the breaker."""
    if facts.result is CycleResult.INTERRUPTED:
        return Stop.INTERRUPTED, exitcodes.SIGTERM, False
    if facts.error_class == "limit":
        return Stop.RATE_LIMITED, exitcodes.TEMPFAIL, False
    if facts.error_class == "fatal":
        return Stop.AGENT_FATAL, exitcodes.ERROR, False
    if facts.error_class == COMMIT_FAILED:  # the operator must fix git (evolve doctor names the cause)
        return Stop.COMMIT_FAILED, exitcodes.ERROR, False
    if budget.handoff_due(streak, policy.streak_limit):
        return Stop.CONTEXT_HANDOFF, exitcodes.OK, True
    if breaker is Breaker.OPEN:
        return Stop.BREAKER_OPEN, exitcodes.OK, False
    return None, exitcodes.OK, False
