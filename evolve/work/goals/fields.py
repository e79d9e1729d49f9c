"""Validation of one goal's fields, shared by the YAML and the Markdown parsers so both reject the same things."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from evolve.work.goals.model import Goal, GoalsError


def file_error(path: Path, reason: str) -> GoalsError:
    """One line naming the file: the message lands in logs and blocked.jsonl as is."""
    return GoalsError(f"{path}: {' '.join(reason.split())}")


def parse_id(path: Path, raw: object, where: str) -> str:
    """Any non-empty single-line id: ids are data (refs, titles), never part of a command."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    if not isinstance(raw, str) or not raw.strip():
        raise file_error(path, f"{where}: missing id")
    gid = raw.strip()
    if re.search(r"[\x00-\x1f\x7f]", gid):
        raise file_error(path, f"{where}: id contains control characters")
    return gid


def parse_weight(path: Path, where: str, raw: object) -> int:
    if isinstance(raw, str) and re.fullmatch(r"\s*\d+\s*", raw):
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 10:
        raise file_error(path, f"{where}: weight must be an integer 1-10, got {raw!r}")
    return raw


def parse_tags(path: Path, where: str, raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list) or not all(isinstance(t, str | int) and not isinstance(t, bool) for t in raw):
        raise file_error(path, f"{where}: tags must be a list of strings")
    return tuple(s for s in (unwrap_code(str(t).strip()) for t in raw) if s)


def parse_continuous(path: Path, where: str, raw: object) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise file_error(path, f"{where}: continuous must be a mapping with metric and threshold")
    threshold = raw.get("threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)):
        raise file_error(path, f"{where}: continuous.threshold must be a number")
    metric = raw.get("metric")
    return {"metric": "" if metric is None else str(metric), "threshold": threshold}


def unique_goals(path: Path, goals: list[Goal]) -> tuple[Goal, ...]:
    seen: set[str] = set()
    for g in goals:
        if g.id in seen:
            raise file_error(path, f"duplicate goal id {g.id!r}")
        seen.add(g.id)
    return tuple(goals)


def unwrap_code(cell: str) -> str:
    """Drop the backticks only when the whole cell is one code span: two spans joined by ``&&`` stay as written."""
    run = len(cell) - len(cell.lstrip("`"))
    if run == 0 or len(cell) < 2 * run + 1 or not cell.endswith("`" * run) or cell.endswith("`" * (run + 1)):
        return cell
    inner = cell[run:-run]
    if "`" * run in inner and re.search(rf"(?<!`){'`' * run}(?!`)", inner):
        return cell
    if inner.startswith(" ") and inner.endswith(" ") and inner.strip():
        inner = inner[1:-1]
    return inner.strip()
