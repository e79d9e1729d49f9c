"""Reconciling a dead fire (docs/DESIGN.md §4.0): a pure decision from session-state and the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from evolve.cycle.reconcile import Reconcile
from evolve.cycle.reconcile import decide as _decide
from evolve.store.records import ClaimedWork, FireRecord


def fire(cycle: Any = 6, **kw: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"pid": 4242, "pgid": 4242, "agent_pgid": 4300, "started_at": "2026-01-01T00:00:00Z",
                         "cycle": cycle}
    f.update(kw)
    return f


def claim(cycle: Any = 6, **kw: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"ref": "e1#0", "source": "harvested", "claimed_by": f"evolve:cycle-{cycle}",
                         "claimed_at": "2026-01-01T00:00:01Z", "cycle": cycle}
    c.update(kw)
    return c


def decide(f: dict[str, Any] | None, c: dict[str, Any] | None, last_cycle: int, last: Any) -> Reconcile:
    """The records as session-state.json holds them (read the way the store reads them)."""
    return _decide(FireRecord.from_json(f), ClaimedWork.from_json(c), last_cycle, last)


def entry(cycle: int, result: str) -> dict[str, Any]:
    return {"cycle": cycle, "result": result}


def test_nothing_to_do() -> None:
    assert decide(None, None, 0, None) == Reconcile()
    assert decide(None, None, 5, entry(5, "improved")) == Reconcile()
    assert decide({}, None, 5, entry(5, "improved")) == Reconcile()
    d = decide(None, None, 0, None)
    assert not d.dead_fire and d.crashed_cycle is None and d.kill_pgid is None and d.claim is None


def test_dead_fire_mid_cycle_is_crashed_and_its_claim_released() -> None:
    d = decide(fire(6), claim(6), 5, entry(5, "improved"))
    assert d.dead_fire
    assert d.crashed_cycle == 6
    assert d.kill_pgid == 4300
    assert d.claim == "release"


def test_dead_fire_on_empty_ledger() -> None:
    d = decide(fire(1), claim(1), 0, None)
    assert d.crashed_cycle == 1 and d.claim == "release"


@pytest.mark.parametrize("last_cycle", [6, 7, 20])
def test_cycle_already_logged_is_not_crashed_again(last_cycle: int) -> None:
    d = decide(fire(6), None, last_cycle, entry(last_cycle, "improved"))
    assert d.dead_fire
    assert d.crashed_cycle is None
    assert d.claim is None


@pytest.mark.parametrize("cycle", [None, "6", 6.0, True, [6]])
def test_fire_without_a_usable_cycle_is_not_crashed(cycle: Any) -> None:
    d = decide(fire(cycle), None, 5, entry(5, "improved"))
    assert d.dead_fire and d.crashed_cycle is None


def test_agent_pgid_carried() -> None:
    assert decide(fire(6, agent_pgid=9876), None, 5, None).kill_pgid == 9876
    # the dead fire's pgid is recorded too, but only the agent's group is killed
    assert decide(fire(6, agent_pgid=None), None, 5, None).kill_pgid is None


@pytest.mark.parametrize("pgid", [None, 0, 1, -5, True, "4300", 43.0])
def test_unusable_agent_pgid_is_never_killed(pgid: Any) -> None:
    assert decide(fire(6, agent_pgid=pgid), None, 5, None).kill_pgid is None


def test_agent_pgid_carried_even_when_cycle_was_logged() -> None:
    d = decide(fire(6, agent_pgid=5000), None, 6, entry(6, "improved"))
    assert d.crashed_cycle is None and d.kill_pgid == 5000


@pytest.mark.parametrize("result", ["improved", "harvested", "unchanged"])
def test_claim_finalized_when_its_cycle_logged_success(result: str) -> None:
    # died after the ledger append but before the claim was finalized
    d = decide(fire(6), claim(6), 6, entry(6, result))
    assert d.crashed_cycle is None
    assert d.claim == "finalize"
    d2 = decide(None, claim(6), 6, entry(6, result))
    assert d2.claim == "finalize" and not d2.dead_fire


@pytest.mark.parametrize(
    "result", ["regressed", "failed", "scout", "quarantined", "interrupted", "crashed", "context-handoff", None]
)
def test_claim_released_when_its_cycle_logged_non_success(result: str | None) -> None:
    d = decide(fire(6), claim(6), 6, entry(6, result) if result else {"cycle": 6})
    assert d.claim == "release"


def test_claim_released_when_a_different_cycle_was_logged() -> None:
    assert decide(None, claim(6), 5, entry(5, "improved")).claim == "release"
    assert decide(None, claim(6), 7, entry(7, "improved")).claim == "release"


def test_claim_released_when_cycle_unknown_or_ledger_empty() -> None:
    c = claim(6)
    del c["cycle"]
    assert decide(None, c, 6, entry(6, "improved")).claim == "release"
    assert decide(None, claim("6"), 6, entry(6, "improved")).claim == "release"
    assert decide(None, claim(6), 0, None).claim == "release"


def test_no_fire_with_claim() -> None:
    d = decide(None, claim(3), 2, entry(2, "improved"))
    assert not d.dead_fire and d.crashed_cycle is None and d.kill_pgid is None
    assert d.claim == "release"


def test_logged_but_context_heavy_cycle_releases_its_claim() -> None:
    heavy = {"cycle": 6, "result": "harvested", "context_heavy": True}
    assert decide(None, claim(6), 6, heavy).claim == "release"
    assert decide(None, claim(6), 6, {**heavy, "context_heavy": False}).claim == "finalize"
