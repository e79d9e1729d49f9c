"""What to do about a fire that died (SPEC §4.0): a pure decision from session-state and the ledger."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUCCESS = frozenset({"improved", "harvested", "unchanged"})


@dataclass(frozen=True)
class Reconcile:
    dead_fire: bool = False
    crashed_cycle: int | None = None  # append a ``crashed`` entry for this cycle
    kill_pgid: int | None = None  # agent group to kill if still alive
    claim: str | None = None  # "finalize" | "release" | None


def decide(
    fire: dict[str, Any] | None,
    claimed: dict[str, Any] | None,
    last_cycle: int,
    last_entry: dict[str, Any] | None,
) -> Reconcile:
    """``fire`` is ``session-state.fire``; we hold the lock, so whoever recorded it is gone."""
    crashed = None
    pgid = None
    if fire:
        c = fire.get("cycle")
        if isinstance(c, int) and not isinstance(c, bool) and c > last_cycle:
            crashed = c
        p = fire.get("agent_pgid")
        if isinstance(p, int) and not isinstance(p, bool) and p > 1:
            pgid = p
    claim = None
    if claimed:
        cc = claimed.get("cycle")
        logged_ok = (
            crashed is None
            and last_entry is not None
            and isinstance(cc, int)
            and last_entry.get("cycle") == cc
            and last_entry.get("result") in SUCCESS
            # A heavy cycle parks its item for a fresh session: released, as the live path does.
            and last_entry.get("context_heavy") is not True
        )
        claim = "finalize" if logged_ok else "release"
    return Reconcile(bool(fire), crashed, pgid, claim)
