"""Dormancy (docs/DESIGN.md §6): when every rung is empty three passes in a row, the loop rests.

Burst mode writes DORMANT (auto-cleared by Step 1 as soon as work appears); loop mode never writes
a marker and logs ``blocked.jsonl`` instead. A probe error is never an empty pass.
"""

from __future__ import annotations

from dataclasses import dataclass

REASON = "stagnation: all sources empty x3"


@dataclass(frozen=True)
class EmptyPass:
    idle_streak: int
    generator_empty_streak: int
    action: str | None  # "dormant" | "blocked" | None


def empty_pass(idle_streak: int, generator_empty_streak: int, mode: str) -> EmptyPass:
    """Both streaks count the empty passes before this one; the third in a row rests the loop."""
    rest = idle_streak >= 2 and generator_empty_streak >= 2
    action = ("dormant" if mode == "burst" else "blocked") if rest else None
    return EmptyPass(idle_streak + 1, generator_empty_streak + 1, action)
