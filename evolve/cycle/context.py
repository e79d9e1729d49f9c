"""What the pieces of a fire's shell share (docs/DESIGN.md §4): where, how configured, who, when.

:class:`evolve.cycle.fire.Fire` runs the cycles; recovery (:mod:`evolve.cycle.recovery`), Step 1
(:mod:`evolve.cycle.step1`), the cycles that run no agent (:mod:`evolve.cycle.side`) and the scout
dispositions (:mod:`evolve.cycle.scout`) are shell functions over this one context, so none of
them reaches into the fire and the fire stays a thin loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evolve import redact
from evolve.config import Config
from evolve.cycle.entry import base_entry
from evolve.cycle.select import Selector
from evolve.harness import hooks
from evolve.paths import Paths
from evolve.store import session_state
from evolve.store.atomic import write_json
from evolve.store.ledger import Ledger
from evolve.timeutil import utc_iso
from evolve.work.item import WorkItem, WorkSource

Observer = Callable[[str, dict[str, Any]], None]


@dataclass
class FireContext:
    paths: Paths
    cfg: Config
    ledger: Ledger
    log: Any  # a structlog logger bound to the fire
    clock: Callable[[], float]
    fire_id: str
    env: dict[str, str]  # every child's environment (carries EVOLVE_FIRE_ID)
    selector: Selector
    state: session_state.SessionState = field(default_factory=session_state.SessionState)
    observers: list[Observer] = field(default_factory=list)

    def save(self) -> None:
        session_state.save(self.paths.state, self.state)

    def emit(self, event: str, **payload: Any) -> None:
        """Tell observers (notifications, metrics) about a state change; they never break a fire."""
        for observer in self.observers:
            try:
                observer(event, {"event": event, "repo": str(self.paths.repo), "fire_id": self.fire_id, **payload})
            except Exception as exc:  # an observer is best effort by contract
                self.log.warning("observer.error", observer_event=event, error=str(exc)[:200])

    def source(self, name: str | None) -> WorkSource | None:
        return self.selector.source_for(name)

    def session_id(self) -> str | None:
        session = self.state.agent_session
        return session.id or None if session is not None else None

    def entry(
        self, cycle: int, result: str, item: WorkItem, source: str, mode: str, timestamp: str | None = None
    ) -> dict[str, Any]:
        """A ledger entry for a cycle about ``item`` in the loop's current agent session."""
        return base_entry(
            cycle=cycle,
            result=result,
            timestamp=timestamp or utc_iso(self.clock()),
            title=item.title,
            source=source,
            work_ref=item.ref,
            mode=mode,
            session_id=self.session_id(),
            fire_id=self.fire_id,
        )

    def write_cycle_state(self, cycle: int, item: WorkItem, phase: str, start_sha: str | None) -> None:
        """``cycle-state.json``: the active cycle for the compaction hook and ``status`` (docs/DESIGN.md §7.2)."""
        write_json(  # the sink: a harvested title may carry a secret
            self.paths.cycle_state,
            redact.current().json({
                "cycle": cycle,
                "phase": phase,
                "step": phase,
                "work_ref": item.ref,
                "title": item.title,
                **hooks.plan_fields(self.paths.repo, item.data),
                "cycle_start_sha": start_sha,
                "written_at": utc_iso(self.clock()),
            }),
        )
