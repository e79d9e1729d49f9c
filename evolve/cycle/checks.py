"""The GOALS checks a chain may not rewrite unseen: the parser :mod:`evolve.git.checks` is handed (§8.5)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from evolve.work.goals.parse import load_goals


def goal_checks(name: str, data: bytes) -> tuple[str, ...] | None:
    """The sorted check commands of a GOALS file's bytes; a malformed file is its bytes' own marker (a change)."""
    with tempfile.TemporaryDirectory(prefix="evolve-goals-") as tmp:
        (Path(tmp) / Path(name).name).write_bytes(data)
        try:
            gf = load_goals(Path(tmp))
        except Exception:  # hostile or malformed: what it runs cannot be told, so any change counts
            return ("<unreadable>", hashlib.sha256(data).hexdigest())
    return tuple(sorted(g.check for g in gf.goals)) if gf is not None else None
