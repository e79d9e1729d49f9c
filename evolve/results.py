"""The vocabulary of cycle results (docs/DESIGN.md §3), spelled once.

``CycleResult`` is a ``StrEnum``: a member *is* its string, so ledger lines, JSON output and
comparisons with values read back from disk (plain strings written by us or by the upstream
``/evolve`` tooling) all keep working. Every set of results the code reasons about is named here.
"""

from __future__ import annotations

from enum import StrEnum


class CycleResult(StrEnum):
    IMPROVED = "improved"  # substantive change, gate green, committed
    REGRESSED = "regressed"  # gate or a goal went red; the cycle's changes reverted
    HARVESTED = "harvested"  # durable follow-up work instead of code
    UNCHANGED = "unchanged"  # idle, downgraded improved, or a metronome block
    SCOUT = "scout"  # split / defer / park decision
    CONTEXT_HANDOFF = "context-handoff"  # the fire ended to resume in a fresh session
    QUARANTINED = "quarantined"  # an oscillating goal skipped
    FAILED = "failed"  # agent or infrastructure error (see ``error_class``)
    INTERRUPTED = "interrupted"  # SIGTERM/SIGINT/SIGHUP during the cycle
    CRASHED = "crashed"  # logged by the next fire for a fire that died mid-cycle
    # Green and committed, but not on the branch yet: waits under refs/evolve/pending/<branch> (§8.3).
    # The entry that later settles it (``pending_cycle``: this cycle) is ``improved`` with the landed sha,
    # or ``failed`` (``land_conflict``) when it never could land.
    PENDING = "pending"

    @property
    def productive(self) -> bool:
        """Counts towards the metronome's same-shape streak."""
        return self in PRODUCTIVE


# The results after which the cycle's change (if any) stands and the item may be consumed.
SUCCESS: frozenset[str] = frozenset({CycleResult.IMPROVED, CycleResult.HARVESTED, CycleResult.UNCHANGED})
# Cycles whose shape the metronome counts (a red attempt at the same thing is still the same shape).
PRODUCTIVE: frozenset[str] = frozenset({CycleResult.IMPROVED, CycleResult.REGRESSED, CycleResult.HARVESTED,
                                        CycleResult.PENDING})
# Green work: the gate said yes (whether it is on the branch yet or still waits to land).
GREEN: frozenset[str] = SUCCESS | {CycleResult.PENDING}
# A cycle that went wrong by itself (status: the last cycle failed → degraded).
FAILURES: frozenset[str] = frozenset({CycleResult.FAILED, CycleResult.CRASHED})
# A cycle that ended without its work standing ("last success" skips these).
UNSUCCESSFUL: frozenset[str] = FAILURES | {CycleResult.INTERRUPTED, CycleResult.REGRESSED}

# An ``error_class`` evolve itself sets, never one an agent may report (agent.report.ERROR_CLASSES):
# the gate could not commit a green change (issue 15). The cycle is ``failed``, the item released and
# not charged an attempt (the repo, not the item, is at fault); it does count for the breaker.
COMMIT_FAILED = "commit_failed"
# The gate's green commits could not land (docs/DESIGN.md §8.3): the operator's branch moved and they do
# not replay onto it, or are red there. Kept under ``refs/evolve/unlanded/<cycle>``; the item is released
# and not charged an attempt (it did nothing wrong), and it is retried on the new base.
LAND_FAILED = "land_conflict"
# The change may never land as it is (a commit holds a secret's value, a file over [git] max_file_mb), or the
# agent left the cycle's line (checked out another branch, moved HEAD): kept under refs/evolve/unlanded/<cycle>;
# an attempt is charged.
LAND_REFUSED = "land_refused"
# A file evolve obeys (its config, a marker, the shared .git's config or hooks, a trust record, the ledger)
# changed during the agent's or the gate's run (docs/DESIGN.md §8.5): the cycle's work is kept under
# refs/evolve/unlanded/<cycle>, nothing lands, the fire ends, and later fires refuse until the operator looks.
GUARD_REFUSED = "guard_refused"
# The mode of a ledger entry that records a landing made after its cycle (``pending_cycle`` names it).
LAND_MODE = "land"


def is_landing(entry: dict[str, object]) -> bool:
    """An entry that settles an earlier ``pending`` cycle (landed or released): no agent ran for it."""
    return entry.get("mode") == LAND_MODE and isinstance(entry.get("pending_cycle"), int)


def is_idle_poll(entry: dict[str, object]) -> bool:
    """A pass that found no work (``evolve.cycle.side.idle``): the loop polling, not a cycle of work.

    Counted apart from cycles by the metrics, ``status`` ("today") and the report, and hidden by
    ``evolve history`` unless ``--all``.
    """
    return entry.get("target") == "idle" and entry.get("mode") == "idle"
