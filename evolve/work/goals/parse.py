"""Finding and reading the repo's GOALS file: the precedence between files, the era hash and the YAML forms."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from evolve.work.goals.fields import (
    file_error,
    parse_continuous,
    parse_id,
    parse_tags,
    parse_weight,
    unique_goals,
)
from evolve.work.goals.markdown import parse_markdown
from evolve.work.goals.model import GOAL_TYPES, GOALS_FILES, Goal, GoalsFile


def load_goals(repo: Path) -> GoalsFile | None:
    """The repo's goals: ``GOALS.md`` first, then ``GOALS.yaml``/``.yml``; None when there is no file.

    ``GOALS.md`` (v4: directives plus a gates table) wins over the YAML files (v1–v3), as in the agentops
    tooling (docs/DESIGN.md §6.3). A malformed file is a :class:`GoalsError`.
    """
    for name in GOALS_FILES:
        path = repo / name
        if path.exists() or path.is_symlink():
            return _load_file(path)
    return None


def _load_file(path: Path) -> GoalsFile:
    """Read the bytes once so the era hash and the parsed content describe the same file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise file_error(path, f"cannot read: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise file_error(path, f"not UTF-8 ({e.reason} at byte {e.start})") from e
    era = hashlib.sha256(data).hexdigest()[:12]
    try:
        if path.suffix.lower() == ".md":
            goals, directives, warnings = parse_markdown(path, text)
            return GoalsFile(path=path, era=era, goals=goals, directives=directives, version="4", warnings=warnings)
        version, goals = _parse_yaml(path, text)
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
        # Hostile content (impossible dates, 5000-digit numbers, deep nesting) is a malformed file,
        # never a crash: the goals rung reports a probe error and the loop goes on.
        reason = "nested too deeply" if isinstance(e, RecursionError) else " ".join(str(e).split())[:200]
        raise file_error(path, f"unusable content: {reason}") from e
    return GoalsFile(path=path, era=era, goals=goals, directives=(), version=version)


def _parse_yaml(path: Path, text: str) -> tuple[str, tuple[Goal, ...]]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise file_error(path, f"invalid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise file_error(path, "top level must be a mapping with version and goals")
    version = doc.get("version")
    if isinstance(version, str) and version.strip().isdigit():
        version = int(version)
    if isinstance(version, bool) or version not in (1, 2, 3):
        raise file_error(path, f"unsupported version {version!r} (expected 1, 2 or 3)")
    raw = doc.get("goals")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise file_error(path, "goals must be a list")
    goals = []
    for i, g in enumerate(raw):
        if not isinstance(g, dict):
            raise file_error(path, f"goals[{i}] must be a mapping")
        goals.append(_yaml_goal(path, i, g))
    return str(version), unique_goals(path, goals)


def _yaml_goal(path: Path, i: int, g: Mapping[str, Any]) -> Goal:
    gid = parse_id(path, g.get("id"), f"goals[{i}]")
    where = f"goal {gid!r}"
    check = g.get("check")
    if not isinstance(check, str) or not check.strip():
        raise file_error(path, f"{where}: missing check")
    gtype = g.get("type") or "health"
    if gtype not in GOAL_TYPES:
        raise file_error(path, f"{where}: invalid type {gtype!r} (expected one of {', '.join(GOAL_TYPES)})")
    description = g.get("description")
    return Goal(
        id=gid,
        description=str(description).strip() if description not in (None, "") else gid,
        check=check.strip(),
        weight=parse_weight(path, where, g.get("weight")),
        type=gtype,
        tags=parse_tags(path, where, g.get("tags")),
        continuous=parse_continuous(path, where, g.get("continuous")),
    )
