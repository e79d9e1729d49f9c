"""What every runner is given for one cycle: the repo, the run directory, the session and the work.

Its own module so that the runners (claude, command, http, scripted), their factory and the fire
share one value without importing a particular runner to get it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from evolve import redact
from evolve.agent.prompt import Orientation
from evolve.work.item import WorkItem


@dataclass(frozen=True)
class Invocation:
    repo: Path
    run_dir: Path
    cycle: int
    mode: str
    session_id: str
    resume: bool
    work: WorkItem
    orientation: Orientation
    fork_from: str | None = None  # mode "fork": the parent session resumed with --fork-session
    # Where the agent writes what it hands back (the report file): writable in the sandbox, unlike
    # run_dir (docs/DESIGN.md §8.6); run_dir when not given.
    exchange_dir: Path | None = None

    @property
    def prompt(self) -> str:
        """The whole orientation and task as one text (the command runner's prompt file)."""
        return self.orientation.full()

    @property
    def prompt_file(self) -> Path:
        return self.run_dir / f"cycle-{self.cycle}.prompt.md"

    @property
    def report_file(self) -> Path:
        return (self.exchange_dir or self.run_dir) / f"cycle-{self.cycle}.report.json"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"cycle-{self.cycle}.log"

    def values(self) -> dict[str, str]:
        return {
            "prompt_file": str(self.prompt_file),
            "report_file": str(self.report_file),
            "session_id": self.session_id,
            "mode": self.mode,
            # A sink: argv is world-readable in /proc and the env is the agent's to pass on.
            "work_json": orjson.dumps(redact.current().json(self.work.as_json())).decode(),
            "cycle": str(self.cycle),
        }
