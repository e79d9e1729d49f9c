"""Where the latest goals snapshot and each GOALS era's baseline are kept, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evolve.paths import FITNESS_BASELINES, FITNESS_LATEST
from evolve.store.atomic import write_json
from evolve.timeutil import utc_stamp
from evolve.work.goals.model import GoalsFile


def snapshot_path(evolve_dir: Path) -> Path:
    return evolve_dir / FITNESS_LATEST


def write_snapshot(path: Path, snap: dict[str, Any]) -> None:
    """Atomic: a reader (or a crash) sees the previous snapshot or this one, never half of one."""
    write_json(path, snap)


def read_snapshot(path: Path) -> dict[str, Any] | None:
    """The snapshot, or None when it is missing or not one (not JSON, or ``goals`` not a list)."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("goals"), list):
        return None
    return obj


def capture_baseline(evolve_dir: Path, gf: GoalsFile, snap: dict[str, Any]) -> Path | None:
    """The era's first snapshot, kept as its baseline; None (nothing written) when the era already has one."""
    era_dir = evolve_dir / FITNESS_BASELINES / f"goals-{gf.era}"
    if era_dir.is_dir() and any(era_dir.glob("*.json")):
        return None
    path = era_dir / f"{utc_stamp()}.json"
    write_json(path, snap)
    return path
