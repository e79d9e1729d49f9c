"""Goals and directives as a work source: directive gaps first, then failing goals by weight.

Measuring runs every check, so a fresh snapshot is reused while HEAD and the GOALS era are
unchanged; a measurement that fails (total timeout) never replaces the last good snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.git import refs as gitrefs
from evolve.paths import FITNESS_LATEST_POST
from evolve.work.goals import (
    GoalsFile,
    MeasureError,
    capture_baseline,
    directive_item,
    failing_goals,
    goal_item,
    load_goals,
    measure,
    read_snapshot,
    snapshot_path,
    write_snapshot,
)
from evolve.work.item import SourceError, WorkItem


class GoalsSource:
    """Implements :class:`evolve.work.item.WorkSource` for ``goal`` and ``directive`` items."""

    name = "goal"
    names = ("goal", "directive")

    def __init__(
        self,
        repo: Path,
        evolve_dir: Path,
        *,
        goal_timeout_s: float,
        total_timeout_s: float,
        env: Mapping[str, str],
        write: bool = True,
        pass_env: Sequence[str] = (),
        path: Sequence[str] = (),
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.repo = repo
        self.evolve_dir = evolve_dir
        self.goal_timeout_s = goal_timeout_s
        self.total_timeout_s = total_timeout_s
        self.env = dict(env)
        self.pass_env = tuple(pass_env)  # [gate] pass_env: checks get what gate commands get
        self.path = tuple(path)  # [workspace] path: directories of the tree first on the checks' PATH
        self.write = write
        self.measured: dict[str, Any] | None = None
        self.warn = warn  # told each row GOALS.md skipped or repaired, once per GOALS era
        self._warned_era: str | None = None

    def load(self) -> GoalsFile | None:
        gf = load_goals(self.repo)
        if gf is not None and gf.warnings and self.warn is not None and gf.era != self._warned_era:
            self._warned_era = gf.era
            for w in gf.warnings:
                self.warn(w)
        return gf

    def snapshot(self, gf: GoalsFile, *, allow_measure: bool = True) -> dict[str, Any] | None:
        cached = read_snapshot(snapshot_path(self.evolve_dir))
        if cached and cached.get("goals_era") == gf.era and cached.get("git_sha") == gitrefs.head(self.repo):
            return cached
        if not allow_measure:
            return cached if cached and cached.get("goals_era") == gf.era else None
        try:
            snap = measure(
                self.repo, gf, goal_timeout_s=self.goal_timeout_s, total_timeout_s=self.total_timeout_s, env=self.env,
                pass_env=self.pass_env, path=self.path,
            )
        except MeasureError as exc:
            raise SourceError(f"goal measurement failed: {exc}") from exc
        if self.write:
            write_snapshot(snapshot_path(self.evolve_dir), snap)
            capture_baseline(self.evolve_dir, gf, snap)
        self.measured = snap
        return snap

    def pre_cycle(self) -> dict[str, Any] | None:
        """The measurement the cycle starts from (cached while HEAD is unchanged); None without goals."""
        gf = self.load()
        if gf is None or not gf.goals:
            return None
        return self.snapshot(gf)

    def measure_post(self) -> dict[str, Any] | None:
        """Measure after the cycle into ``fitness-latest-post.json`` only.

        ``fitness-latest.json`` is what upstream readers take for the tree as it stands, without
        checking its ``git_sha``: it gets the post-cycle measurement only once the gate keeps the
        cycle (:meth:`accept`); a reverted cycle leaves the pre-cycle one there. A failed
        measurement returns None and replaces nothing.
        """
        gf = self.load()
        if gf is None or not gf.goals:
            return None
        try:
            snap = measure(
                self.repo, gf, goal_timeout_s=self.goal_timeout_s, total_timeout_s=self.total_timeout_s, env=self.env,
                pass_env=self.pass_env, path=self.path,
            )
        except MeasureError:
            return None
        if self.write:
            write_snapshot(self.evolve_dir / FITNESS_LATEST_POST, snap)
        return snap

    def accept(self, snap: dict[str, Any] | None) -> None:
        """The gate kept the cycle: ``snap`` (its post-cycle measurement) describes the tree now."""
        if snap is not None and self.write:
            write_snapshot(snapshot_path(self.evolve_dir), snap)

    def items(self, *, allow_measure: bool = True) -> list[WorkItem]:
        gf = self.load()
        if gf is None:
            return []
        out = [
            directive_item(d, gf.era)
            for d in sorted(gf.directives, key=lambda d: d.number)
            if d.steer.lower() != "hold"
        ]
        if gf.goals:
            snap = self.snapshot(gf, allow_measure=allow_measure)
            if snap is not None:
                by_id = {g.get("goal_id"): g for g in snap.get("goals", []) if isinstance(g, dict)}
                out.extend(goal_item(g, by_id.get(g.id)) for g in failing_goals(snap, gf))
        return out

    def candidates(self) -> list[WorkItem]:
        return self.items()

    def era(self) -> str | None:
        try:
            gf = self.load()
        except SourceError:
            return None
        return gf.era if gf else None

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        """Goals are not claimed anywhere: the claim lives in session-state."""

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        """A goal is done when its check passes; the next measurement says so."""

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        """Nothing to undo."""

    def hold(self, item: WorkItem, claimer: str, now: str, note: str) -> None:
        """Nothing to mark: a goal is not claimed anywhere (its waiting work is in ``pending.json``)."""

    def defer(self, item: WorkItem, now: str, reason: str) -> None:
        """A failing goal or an open directive is offered again at the next selection: nothing to record."""

    def split(self, item: WorkItem, now: str, children: Sequence[Mapping[str, Any]]) -> None:
        """The children go to the harvested queue; the goal itself stays until its check passes."""

    def park(self, item: WorkItem, now: str, note: str) -> bool:
        """GOALS.md is the operator's: a goal cannot be held out of selection from here."""
        return False
