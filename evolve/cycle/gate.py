"""The gate (docs/DESIGN.md §8): the agent's word is verified — its own changes, the gate commands, the goals.

Red (a gate command, or a goal that passed before the cycle and fails after it) reverts exactly the
cycle's own commits and changes: the operator's pre-existing dirty paths are never touched.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve import crashpoint, gitops
from evolve.agent.report import AgentReport
from evolve.childenv import BASE, FIRE, child_env
from evolve.config import Config
from evolve.paths import Paths
from evolve.procgroup import Limits, run_group
from evolve.results import COMMIT_FAILED, SUCCESS, CycleResult
from evolve.work.item import WorkItem, clean_text

_STRUCTURAL_RED = re.compile(r"Pass [0-9]+: (FAILED|BLOCKED)")


@dataclass(frozen=True)
class Verdict:
    result: CycleResult
    fields: dict[str, Any] = field(default_factory=dict)
    revert: bool = False


def judge(claimed: str, *, substantive: bool, red: str | None) -> Verdict:
    """The cycle's result from the agent's claim and what the gate saw (pure)."""
    if claimed not in SUCCESS:
        return Verdict(CycleResult(claimed), revert=True)  # failed runs leave nothing; scouts only touch metadata
    if red:
        return Verdict(CycleResult.REGRESSED, {"gate": "FAIL", "gate_detail": red}, revert=True)
    if claimed == CycleResult.IMPROVED and not substantive:
        return Verdict(CycleResult.UNCHANGED, {"downgraded_from": "improved"})
    return Verdict(CycleResult(claimed))


def committed(result: CycleResult, commit_error: str | None) -> Verdict:
    """Consumed implies committed (pure): a change that could not be committed is a failed cycle.

    ``commit_failed`` counts for the breaker (the repo is broken for every item alike) but is not
    an attempt against the item (transition._attempts): the item did nothing wrong.
    """
    if commit_error is None:
        return Verdict(result)
    return Verdict(CycleResult.FAILED, {"error_class": COMMIT_FAILED, "error": commit_error[:300]})


def goal_regressions(pre: dict[str, Any] | None, post: dict[str, Any] | None) -> list[str]:
    """Goals that passed before the cycle and fail after it (pure)."""
    if not pre or not post:
        return []
    before = {g.get("goal_id"): g.get("result") for g in pre.get("goals", []) if isinstance(g, dict)}
    return sorted(
        str(g.get("goal_id"))
        for g in post.get("goals", [])
        if isinstance(g, dict) and g.get("result") == "fail" and before.get(g.get("goal_id")) == "pass"
    )


def goal_fields(snap: dict[str, Any] | None) -> dict[str, Any]:
    if not snap:
        return {}
    summary = snap.get("summary") if isinstance(snap.get("summary"), dict) else {}
    out = {"goals_passing": summary.get("passing"), "goals_total": summary.get("total")}
    if snap.get("goals_era"):
        out["goals_era"] = snap["goals_era"]
    return {k: v for k, v in out.items() if v is not None}


class Gate:
    def __init__(self, paths: Paths, cfg: Config, log: Any, env: dict[str, str] | None = None) -> None:
        self.paths = paths
        self.cfg = cfg
        self.log = log
        self.env = env or {}
        self.git_policy = gitops.GitPolicy(run_hooks=cfg.git.run_hooks, sign=cfg.git.sign, timeout_s=cfg.git.timeout_s)

    def command_env(self) -> dict[str, str]:
        """A gate command runs the repo's code: locale, PATH, the fire's id and ``[gate] pass_env``, no secret."""
        return child_env(self.env, (*BASE, *FIRE), self.cfg.gate.pass_env)

    def undo(self, start_sha: str | None, dirty_before: set[str]) -> None:
        try:
            gitops.restore_cycle(self.paths.repo, start_sha, dirty_before, self.git_policy)
        except gitops.GitError as exc:
            # Loud, not fatal: the ledger still records the cycle as red and the claim is released.
            self.log.error("gate.undo_failed", error=str(exc)[:300])

    def verify(
        self,
        cycle: int,
        item: WorkItem,
        report: AgentReport,
        start_sha: str | None,
        dirty_before: set[str],
        *,
        goals: Any = None,
        pre: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The cycle's result and the ledger fields the gate adds. ``goals`` measures after the cycle."""
        crashpoint.reached("gate")
        repo = self.paths.repo
        extra: dict[str, Any] = {"cycle_start_sha": start_sha}
        touched = (gitops.dirty_paths(repo) - dirty_before) | gitops.changed_since(repo, start_sha)
        red = self.run_commands() if report.result in SUCCESS else None
        verdict = judge(report.result, substantive=bool(gitops.substantive(touched)), red=red)
        if verdict.revert:
            if red:
                self.log.warning("gate.fail", cycle=cycle, detail=red)
            self.undo(start_sha, dirty_before)
            extra.update(verdict.fields)
            return verdict.result, {**extra, **goal_fields(pre)}
        result = verdict.result
        extra.update(verdict.fields)
        saved = self._commit(cycle, item, result, dirty_before)
        if saved is not None:
            return saved[0], {**extra, **saved[1], **goal_fields(pre)}
        post = goals.measure_post() if goals is not None and pre is not None else None
        lost = goal_regressions(pre, post)
        if lost:
            detail = "goal regressed: " + ", ".join(lost)
            self.log.warning("gate.fail", cycle=cycle, detail=detail)
            self.undo(start_sha, dirty_before)
            # The tree is back at the cycle's start, so the pre-cycle measurement is what stands now:
            # logging it keeps Step 1's goal-regression rule from halting on a reverted drop.
            return CycleResult.REGRESSED, {
                **extra,
                "gate": "FAIL",
                "gate_detail": detail,
                "goals_regressed": lost,
                **goal_fields(pre),
            }
        if post is not None:
            goals.accept(post)  # kept: fitness-latest.json now describes this tree (docs/DESIGN.md §6.3)
        head = gitops.head(repo)
        if head and head != start_sha:
            extra["sha"] = head
            self._push()
        if self.cfg.gate.commands or post is not None:
            extra["gate"] = "PASS"
        return result, {**extra, **goal_fields(post or pre)}

    def _commit(
        self, cycle: int, item: WorkItem, result: str, dirty_before: set[str]
    ) -> tuple[CycleResult, dict[str, Any]] | None:
        """Commit the cycle's paths; None when that worked (or there was nothing to commit).

        On failure the verdict is :func:`committed`'s ``failed``, and the change is kept, not lost:
        saved under ``refs/evolve/uncommitted/<cycle>`` and the paths put back to HEAD, so the
        released item starts clean next time. Only when even that save fails is the tree left dirty.
        """
        repo = self.paths.repo
        to_commit = [p for p in (gitops.dirty_paths(repo) - dirty_before) if not gitops.is_internal(p)]
        if not (self.cfg.git.commit and to_commit):
            return None
        message = gitops.commit_message(cycle, clean_text(item.title, 4000), result)
        try:
            sha = gitops.commit_paths(repo, to_commit, message, self.git_policy)
        except gitops.GitError as exc:
            self.log.error("git.commit_failed", cycle=cycle, error=str(exc))
            verdict = committed(CycleResult(result), str(exc))
            return verdict.result, {**verdict.fields, **self._keep(cycle, sorted(to_commit), message)}
        if sha:
            self.log.info("git.commit", sha=sha, paths=len(to_commit))
        return None

    def _keep(self, cycle: int, paths: list[str], message: str) -> dict[str, Any]:
        """Save an uncommitted change under a ref and restore its paths; the ledger fields saying where."""
        repo = self.paths.repo
        try:
            ref = gitops.save_uncommitted(repo, paths, cycle, message)
        except (gitops.GitError, OSError) as exc:
            self.log.error("git.save_failed", cycle=cycle, error=str(exc)[:300])
            return {"uncommitted_paths": paths, "uncommitted_left_in_tree": True}
        out: dict[str, Any] = {"uncommitted_ref": ref, "uncommitted_paths": paths}
        self.log.warning("git.uncommitted_saved", cycle=cycle, ref=ref, paths=len(paths))
        try:
            gitops.restore_paths(repo, paths)
        except (gitops.GitError, OSError) as exc:
            self.log.error("git.restore_failed", cycle=cycle, error=str(exc)[:300])
            out["uncommitted_left_in_tree"] = True  # saved, but also still there: say so
        return out

    def _push(self) -> None:
        if not self.cfg.git.push:
            return
        try:
            gitops.git(self.paths.repo, "push", policy=self.git_policy)
            self.log.info("git.push")
        except gitops.GitError as exc:
            self.log.error("git.push_failed", error=str(exc))

    def run_commands(self) -> str | None:
        """The first red gate command's one-line reason, or None when all are green."""
        env = self.command_env()
        for argv in self.cfg.gate.commands:
            with tempfile.TemporaryDirectory(prefix="evolve-gate-") as tmp:
                out = Path(tmp).resolve() / "out"  # our private dir, canonical (TMPDIR may be a link)
                try:
                    proc = run_group(
                        argv,
                        cwd=self.paths.repo,
                        env=env,
                        limits=Limits(timeout_s=self.cfg.gate.timeout_s, grace_s=2.0, tail_bytes=0),
                        log_path=out,
                    )
                except OSError as exc:
                    return f"{argv[0]}: {exc}"
                text = out.read_text(errors="replace") if out.exists() else ""
            if proc.timed_out:
                return f"{argv[0]}: timed out after {self.cfg.gate.timeout_s:g}s; process group killed"
            if proc.returncode != 0:
                return f"{argv[0]}: exit {proc.returncode}"
            if _STRUCTURAL_RED.search(text):
                return f"{argv[0]}: structural FAILED/BLOCKED marker"
        return None
