"""What to do about a fire that died (docs/DESIGN.md §4.0): a pure decision from session-state and the ledger."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evolve.cycle.transition import ClaimAction, claim_action
from evolve.store.records import ClaimedWork, FireRecord


@dataclass(frozen=True)
class Reconcile:
    dead_fire: bool = False
    crashed_cycle: int | None = None  # append a ``crashed`` entry for this cycle
    kill_pgid: int | None = None  # agent group to kill if still alive
    claim: ClaimAction | None = None  # FINALIZE or RELEASE the dead fire's claim; None: no claim


def decide(
    fire: FireRecord | None,
    claimed: ClaimedWork | None,
    last_cycle: int,
    last_entry: dict[str, Any] | None,
) -> Reconcile:
    """``fire`` is ``session-state.fire``; we hold the lock, so whoever recorded it is gone."""
    crashed = None
    pgid = None
    if fire is not None:
        if fire.cycle is not None and fire.cycle > last_cycle:
            crashed = fire.cycle
        if fire.agent_pgid is not None and fire.agent_pgid > 1:
            pgid = fire.agent_pgid
    claim = None
    if claimed is not None:
        cc = claimed.cycle
        logged = crashed is None and last_entry is not None and isinstance(cc, int) and last_entry.get("cycle") == cc
        # The cycle's entry is the commit point: the live path's own rule decides from it.
        claim = (
            claim_action(str(last_entry.get("result")), heavy=last_entry.get("context_heavy") is True)
            if logged and last_entry is not None
            else ClaimAction.RELEASE
        )
    return Reconcile(fire is not None, crashed, pgid, claim)
