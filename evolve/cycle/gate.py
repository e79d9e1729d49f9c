"""The gate (SPEC §8): the agent's word is verified — its own changes, the gate commands, the commit."""

from __future__ import annotations

import contextlib
import re
import subprocess
from typing import Any

from evolve import gitops
from evolve.agent.report import AgentReport
from evolve.config import Config
from evolve.paths import Paths
from evolve.work.item import WorkItem, clean_text

_STRUCTURAL_RED = re.compile(r"Pass [0-9]+: (FAILED|BLOCKED)")
COMMITTED_RESULTS = frozenset({"improved", "harvested", "unchanged"})


class Gate:
    def __init__(self, paths: Paths, cfg: Config, log: Any) -> None:
        self.paths = paths
        self.cfg = cfg
        self.log = log

    def undo(self, start_sha: str | None, dirty_before: set[str]) -> None:
        with contextlib.suppress(gitops.GitError):
            gitops.restore_cycle(self.paths.repo, start_sha, dirty_before)

    def verify(
        self, cycle: int, item: WorkItem, report: AgentReport, start_sha: str | None, dirty_before: set[str]
    ) -> tuple[str, dict[str, Any]]:
        """The cycle's result and the ledger fields the gate adds."""
        repo = self.paths.repo
        extra: dict[str, Any] = {"cycle_start_sha": start_sha}
        if report.result not in COMMITTED_RESULTS:
            # failed runs leave nothing behind; scouts only touch queue and tracker metadata.
            self.undo(start_sha, dirty_before)
            return report.result, extra
        touched = (gitops.dirty_paths(repo) - dirty_before) | gitops.changed_since(repo, start_sha)
        real = gitops.substantive(touched)
        red = self.run_commands()
        if red:
            self.log.warning("gate.fail", cycle=cycle, detail=red)
            gitops.restore_cycle(repo, start_sha, dirty_before)
            extra.update(gate="FAIL", gate_detail=red)
            return "regressed", extra
        result = report.result
        if result == "improved" and not real:
            result = "unchanged"
            extra["downgraded_from"] = "improved"
        to_commit = [p for p in (gitops.dirty_paths(repo) - dirty_before) if not gitops.is_internal(p)]
        if self.cfg.git.commit and to_commit:
            message = gitops.commit_message(cycle, clean_text(item.title, 72), result)
            try:
                sha = gitops.commit_paths(repo, to_commit, message)
            except gitops.GitError as exc:
                self.log.error("git.commit_failed", error=str(exc))
                sha = None
            if sha:
                self.log.info("git.commit", sha=sha, paths=len(to_commit))
        head = gitops.head(repo)
        if head and head != start_sha:
            extra["sha"] = head
        if self.cfg.gate.commands:
            extra["gate"] = "PASS"
        return result, extra

    def run_commands(self) -> str | None:
        """The first red gate command's one-line reason, or None when all are green."""
        for argv in self.cfg.gate.commands:
            try:
                proc = subprocess.run(
                    argv,
                    cwd=self.paths.repo,
                    capture_output=True,
                    text=True,
                    timeout=self.cfg.gate.timeout_s or None,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                return f"{argv[0]}: timed out"
            except OSError as exc:
                return f"{argv[0]}: {exc}"
            if proc.returncode != 0:
                return f"{argv[0]}: exit {proc.returncode}"
            if _STRUCTURAL_RED.search(proc.stdout + proc.stderr):
                return f"{argv[0]}: structural FAILED/BLOCKED marker"
        return None
