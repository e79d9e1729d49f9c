"""What a GOALS file holds once parsed, and the two ways reading or measuring it can fail."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.work.item import SourceError

GOALS_FILES = ("GOALS.md", "GOALS.yaml", "GOALS.yml")  # precedence order
GOAL_TYPES = ("health", "architecture", "quality", "meta")


class GoalsError(SourceError):
    """The GOALS file exists but is malformed: a probe error, never to be read as "no work"."""


class MeasureError(Exception):
    """The measurement as a whole failed (total timeout, cannot start bash): keep the last good snapshot."""


@dataclass(frozen=True)
class Goal:
    id: str
    description: str
    check: str
    weight: int
    type: str = "health"
    tags: tuple[str, ...] = ()
    continuous: dict[str, Any] | None = None  # {"metric": str, "threshold": float}


@dataclass(frozen=True)
class Directive:
    number: int
    title: str
    description: str = ""
    steer: str = ""
    directive_id: str = ""
    scenarios: str = ""


@dataclass(frozen=True)
class GoalsFile:
    path: Path
    era: str  # first 12 hex chars of sha256(file bytes): one era per content
    goals: tuple[Goal, ...]
    directives: tuple[Directive, ...]
    version: str
    warnings: tuple[str, ...] = ()  # rows skipped or repaired (GOALS.md), one line each
