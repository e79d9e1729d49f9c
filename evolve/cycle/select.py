"""The shell around the pure ladder: read every source from disk now, fill probes on demand.

Nothing read before a cycle is reused after it (docs/DESIGN.md §6): each call re-reads the queue, asks the
tracker again and re-checks the goal snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from evolve.childenv import work_env
from evolve.config import Config, claim_visibility_s
from evolve.cycle import pending
from evolve.paths import Paths
from evolve.store.ledger import Ledger
from evolve.store.markers import read_marker
from evolve.timeutil import utc_iso
from evolve.work import generators, ladder
from evolve.work.beads import BeadsSource
from evolve.work.goal_source import GoalsSource
from evolve.work.harvested import HarvestedQueue
from evolve.work.item import LazyItems, SourceError, WorkItem, WorkSource, item_keys, keys_of


class Selector:
    def __init__(
        self,
        paths: Paths,
        cfg: Config,
        env: Mapping[str, str],
        log: Any,
        *,
        write: bool = True,
        sources: list[WorkSource] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        # Tracker, generators and goal checks run in the repo: each gets an allow-listed env (childenv).
        self.env = work_env(env, cfg.work.pass_env)
        self.log = log
        self.write = write
        self.harvested = HarvestedQueue(
            paths.nextwork,
            repo_names=(paths.repo.name,),
            quality=cfg.work.quality,
            claim_visibility_s=claim_visibility_s(cfg),  # another tool's stale claim is taken over
            clock=clock,
        )
        self.beads = BeadsSource(cfg.work.beads_command, paths.repo, timeout_s=cfg.work.probe_timeout_s, env=self.env)
        self.goals = GoalsSource(
            paths.repo,
            paths.evolve_dir,
            goal_timeout_s=cfg.work.goal_timeout_s,
            total_timeout_s=cfg.work.goals_timeout_s,
            env=env,
            write=write,
            pass_env=cfg.gate.pass_env,
            path=cfg.workspace.path,
            warn=lambda w: log.warning("goals.row_warning", detail=w[:300]),
        )
        self.sources: list[WorkSource] = sources or [self.harvested, self.beads, self.goals]
        self.generated_preview: list[dict[str, Any]] = []

    def work_in(self, tree: Path) -> None:
        """Goals are measured where the agent works (its worktree, docs/DESIGN.md §8.3): the gate's
        before/after comparison and the failing-goal rung then see the same tree."""
        self.goals.repo = tree

    def source_for(self, name: str | None) -> WorkSource | None:
        for src in self.sources:
            if src.name == name or name in getattr(src, "names", ()):
                return src
        return None

    # -- probes ----------------------------------------------------------------------------

    def _probe(self, fn: Callable[[], Sequence[WorkItem]], name: str) -> ladder.Probe:
        try:
            items = fn()
            # A lazy sequence stays lazy (the ladder reads only what it needs); lists become tuples.
            return ladder.Probe(items if isinstance(items, LazyItems) else tuple(items))
        except SourceError as exc:
            self.log.warning("source.probe_error", source=name, error=str(exc)[:300])
            return ladder.Probe(error=str(exc)[:300])

    def _run_generators(self) -> ladder.Probe:
        items, errors = generators.run_all(
            self.cfg.work.generators, repo=self.paths.repo, env=self.env, timeout_s=self.cfg.work.probe_timeout_s
        )
        for err in errors:
            self.log.warning("generator.error", error=err[:300])
        fresh = generators.dedup(items, self.harvested.known_keys(keys_of(items)))
        self.generated_preview = fresh
        if not fresh:
            return ladder.Probe(error="; ".join(errors)[:300] if errors and not items else None)
        if not self.write:
            # --dry-run: show what would be queued, queue nothing.
            preview = [self.harvested.preview_item(it) for it in fresh]
            return ladder.Probe(tuple(preview))
        appended_at = self.harvested.lines  # as last read: the new entry is on this line or a later one
        self.harvested.append_entry(generators.generator_entry(fresh, utc_iso()))
        self.log.info("generator.items", count=len(fresh))
        keys = keys_of(fresh)

        def queued(since: int) -> tuple[WorkItem, ...]:
            return tuple(w for w in self.harvested.candidates(since) if item_keys(w.data) & keys)

        found = queued(appended_at) or queued(0)  # (all of it if the file was rewritten under us)
        return ladder.Probe(found)

    # -- selection -------------------------------------------------------------------------

    def ladder_input(self, state: Any, *, restorative: bool, excluded: frozenset[str]) -> ladder.LadderInput:
        # An item whose green commits wait to land keeps its claim: never selected (nor taken over) again.
        excluded = excluded | pending.held_refs(self.paths.pending)
        tail = Ledger(self.paths.ledger).tail(500).entries
        era = ladder.era_entries(tail)
        rescope = read_marker(self.paths.rescope, 0)
        goals_era = self.goals.era()
        landed = frozenset(
            r.split("|", 1)[1]
            for r in getattr(state, "landed_directives", [])
            if isinstance(r, str) and r.startswith(f"{goals_era}|")
        )
        return ladder.LadderInput(
            beads_enabled=bool(self.cfg.work.beads_command),
            goals_enabled=not self.cfg.work.beads_only,
            generators_configured=bool(self.cfg.work.generators),
            quality=self.cfg.work.quality,
            restorative=restorative,
            trailing_modes=ladder.productive_modes(tail),
            goal_flips=ladder.flips_by_ref(era),
            quarantined_logged=frozenset(str(e.get("work_ref")) for e in era if e.get("result") == "quarantined"),
            landed=landed,
            excluded=excluded,
            rescope=rescope.content.strip() or None if rescope.present else None,
        )

    def _resolve(self, inp: ladder.LadderInput, *, measure: bool = True) -> ladder.Selection:
        """Answer the ladder's ``need`` requests until it decides."""
        goals = self.goals.candidates if measure else (lambda: self.goals.items(allow_measure=False))
        while True:
            sel = ladder.select(inp)
            if sel.need == "harvested":
                inp = replace(inp, harvested=self._probe(self.harvested.candidates, "harvested"))
            elif sel.need == "beads":
                inp = replace(inp, beads=self._probe(self.beads.candidates, "beads"))
            elif sel.need == "goals":
                inp = replace(inp, goals=self._probe(goals, "goals"))
            elif sel.need == "generated":
                inp = replace(inp, generated=self._run_generators())
            else:
                return sel

    def select(self, state: Any, *, restorative: bool, excluded: frozenset[str] = frozenset()) -> ladder.Selection:
        return self._resolve(self.ladder_input(state, restorative=restorative, excluded=excluded))

    def probe_any_work(self, state: Any) -> str:
        """For the DORMANT gate: ``work``, ``empty`` or ``error`` (no generators, no new measurement)."""
        if pending.held_refs(self.paths.pending):
            return "work"  # green commits waiting to land are work: DORMANT must never keep them from landing
        inp = replace(self.ladder_input(state, restorative=False, excluded=frozenset()), generators_configured=False)
        sel = self._resolve(inp, measure=False)
        if sel.item is not None or sel.blocked_mode is not None:
            return "work"
        return "error" if sel.probe_errors else "empty"
