"""Where every on-disk file lives (SPEC §2); one place so no module spells a path twice."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from evolve.errors import UsageError


@dataclass(frozen=True)
class Paths:
    repo: Path
    evolve_dir: Path
    nextwork: Path
    global_kill: Path

    @classmethod
    def for_repo(cls, repo: Path, env: Mapping[str, str] | None = None) -> Paths:
        env = os.environ if env is None else env
        repo = repo.resolve()
        evolve_dir = Path(env.get("EVOLVE_DIR") or ".agents/evolve")
        nextwork = Path(env.get("EVOLVE_NEXTWORK") or ".agents/rpi/next-work.jsonl")
        xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
        return cls(
            repo=repo,
            evolve_dir=evolve_dir if evolve_dir.is_absolute() else repo / evolve_dir,
            nextwork=nextwork if nextwork.is_absolute() else repo / nextwork,
            global_kill=Path(xdg) / "evolve" / "KILL",
        )

    def _e(self, name: str) -> Path:
        return self.evolve_dir / name

    @property
    def ledger(self) -> Path:
        return self._e("cycle-history.jsonl")

    @property
    def state(self) -> Path:
        return self._e("session-state.json")

    @property
    def lock(self) -> Path:
        return self._e("fire.lock")

    @property
    def kill(self) -> Path:
        return self._e("KILL")

    @property
    def stop(self) -> Path:
        return self._e("STOP")

    @property
    def dormant(self) -> Path:
        return self._e("DORMANT")

    @property
    def handoff(self) -> Path:
        return self._e("HANDOFF")

    @property
    def rescope(self) -> Path:
        return self._e("RESCOPE")

    @property
    def ack_regression(self) -> Path:
        return self._e("ACK-REGRESSION")

    @property
    def cycle_state(self) -> Path:
        return self._e("cycle-state.json")

    @property
    def blocked(self) -> Path:
        return self._e("blocked.jsonl")

    @property
    def config(self) -> Path:
        return self._e("config.toml")

    @property
    def runs_dir(self) -> Path:
        """Per-cycle agent prompt, report and output files."""
        return self._e("runs")

    @property
    def handoffs_dir(self) -> Path:
        return self._e("handoffs")


def git_toplevel(start: Path) -> Path:
    """The git top level containing ``start``; a usage error outside a repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=start,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise UsageError("git is not installed; evolve needs it") from exc
    if out.returncode != 0:
        raise UsageError(f"{start} is not inside a git repository (use --repo PATH)")
    return Path(out.stdout.strip())
