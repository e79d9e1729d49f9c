"""The gate (docs/DESIGN.md §8): the agent's word is verified — its own changes, the gate commands, the goals.

Red (a gate command, or a goal that passed before the cycle and fails after it) reverts exactly the
cycle's own commits and changes: the operator's pre-existing dirty paths are never touched.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evolve import crashpoint, redact
from evolve.agent.report import AgentReport
from evolve.childenv import BASE, FIRE, child_env, with_path
from evolve.config import Config, bad_rel_path
from evolve.cycle.pending import Held
from evolve.cycle.publish import Publisher
from evolve.cycle.workspace import InPlace, Isolated, Land, Start, Workspace
from evolve.git import change as gitchange
from evolve.git import filters as gitfilters
from evolve.git import land
from evolve.git import refs as gitrefs
from evolve.git import run as gitrun
from evolve.paths import Paths
from evolve.procgroup import Limits, contained, run_group
from evolve.results import COMMIT_FAILED, GUARD_REFUSED, LAND_FAILED, LAND_REFUSED, SUCCESS, CycleResult
from evolve.store.atomic import open_artifact
from evolve.store.dirfd import ensure_dir
from evolve.work.item import WorkItem, clean_text

_STRUCTURAL_RED = re.compile(r"Pass [0-9]+: (FAILED|BLOCKED)")
OUTPUT_TAIL_BYTES = 8 * 1024  # of a red command's output kept in the run log
OUTPUT_TAIL_LINES = 60
EXCERPT_CHARS = 600  # of that tail kept in the ledger entry (``gate_output``)
EXCERPT_LINES = 8
COMMAND_CHARS = 160  # of a command line in ``gate_detail``
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Red:
    """Why the gate went red: one line naming the command (``gate_detail``) and its output's tail."""

    detail: str
    output: str = ""  # redacted, at most OUTPUT_TAIL_LINES lines / OUTPUT_TAIL_BYTES


def command_label(argv: list[str]) -> str:
    """The command as an operator would type it, bounded (pure)."""
    text = shlex.join(argv)
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"


def output_tail(text: str, *, lines: int = OUTPUT_TAIL_LINES, cap: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``text`` within ``cap`` characters, control characters dropped (pure)."""
    text = _CONTROL.sub("", text.replace("\r\n", "\n"))
    kept = text.rstrip("\n").split("\n")[-lines:]
    out = "\n".join(kept)
    return out if len(out) <= cap else "…" + out[-(cap - 1) :]


def excerpt(text: str) -> str:
    """A short tail for the ledger entry and the status line (pure)."""
    return output_tail(text, lines=EXCERPT_LINES, cap=EXCERPT_CHARS) if text.strip() else ""


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
        self.git_policy = gitrun.GitPolicy(run_hooks=cfg.git.run_hooks, sign=cfg.git.sign, timeout_s=cfg.git.timeout_s)
        self._cycle_goals: tuple[Any, dict[str, Any]] | None = None  # for a replay's re-gate: (source, pre)
        self.publisher: Publisher | None = Publisher(paths.repo, paths.push_state, cfg.land.remote, cfg.git.push,
                                                     self.git_policy, log, pins=paths.pins)
        # Run before the commands, where they run: the worktree's setup when an input changed (a Red if it fails).
        self.before: Callable[[Path], Red | None] | None = None
        # The guard (cycle/guard.py): after the agent run and after the gate, why the cycle is refused, or None.
        self.guard: Callable[[str], str | None] | None = None

    def command_env(self, tree: Path | None = None) -> dict[str, str]:
        """A gate command runs the repo's code: locale, PATH, the fire's id and ``[gate] pass_env``, no secret;
        ``[workspace] path`` (directories of ``tree``, where the commands run) first on PATH (§8.4)."""
        where = self.paths.repo if tree is None else tree
        dirs = [str(where / p) for p in self.cfg.workspace.path if bad_rel_path(p) is None]
        return with_path(child_env(self.env, (*BASE, *FIRE), self.cfg.gate.pass_env), dirs)

    def undo(self, ws: Workspace, start: Start) -> None:
        try:
            ws.undo(start)
        except (gitrun.GitError, OSError) as exc:
            # Loud, not fatal: the ledger still records the cycle as red and the claim is released.
            self.log.error("gate.undo_failed", error=str(exc)[:300])

    def verify(
        self,
        cycle: int,
        item: WorkItem,
        report: AgentReport,
        ws: Workspace,
        start: Start,
        *,
        goals: Any = None,
        pre: dict[str, Any] | None = None,
        held: Held | None = None,
        stop: threading.Event | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The cycle's result and the ledger fields the gate adds. ``goals`` measures after the cycle,
        in the tree the agent worked in; a green change then lands (§8.3). ``stop`` (a KILL or signal)
        stops a running gate command and lands nothing: the cycle is ``interrupted``, its work kept."""
        crashpoint.reached("gate")
        tree = start.tree
        extra: dict[str, Any] = {"cycle_start_sha": start.sha}
        refused = self._guarded(cycle, ws, start, "agent run")
        if refused is not None:
            return CycleResult.FAILED, {**extra, **refused, **goal_fields(pre)}
        off = ws.after_agent(start)  # the worktree detached again; is its HEAD still the cycle's?
        if off and report.result in SUCCESS:
            self.log.error("gate.off_line", cycle=cycle, detail=off)
            return CycleResult.FAILED, {**extra, **self._refuse(cycle, ws, start, off), **goal_fields(pre)}
        touched = (gitchange.dirty_paths(tree) - start.dirty_before) | gitchange.changed_since(tree, start.sha)
        if report.result in SUCCESS:
            # The gate judges the tree that lands: ignored files the cycle made cannot be committed (§8.3).
            dropped = ws.drop_new_ignored(start)
            if dropped:
                self.log.warning("gate.ignored_dropped", cycle=cycle, paths=[land.shown(p) for p in dropped[:20]],
                                 why="git-ignored, so never committed: the gate must not see them")
                extra["ignored_dropped"] = [land.shown(p) for p in dropped[:20]]
        red = self.run_commands(tree, stop) if report.result in SUCCESS else None
        if _stopped(stop):
            return self.interrupted(cycle, ws, start, "gate")
        substantive = bool(gitchange.substantive(touched))
        verdict = judge(report.result, substantive=substantive, red=red.detail if red else None)
        if verdict.revert:
            if red:
                self.log.warning("gate.fail", cycle=cycle, detail=red.detail)
                extra.update(self._keep_output(cycle, [red]))
            self.undo(ws, start)
            extra.update(verdict.fields)
            return verdict.result, {**extra, **goal_fields(pre)}
        result = verdict.result
        extra.update(verdict.fields)
        saved = self._commit(cycle, item, result, start)
        if saved is not None:
            return saved[0], {**extra, **saved[1], **goal_fields(pre)}
        post = goals.measure_post() if goals is not None and pre is not None else None
        if _stopped(stop):
            return self.interrupted(cycle, ws, start, "gate")
        lost = goal_regressions(pre, post)
        if lost:
            detail = "goal regressed: " + ", ".join(lost)
            self.log.warning("gate.fail", cycle=cycle, detail=detail)
            extra.update(self._keep_output(cycle, goal_reds(lost, post)))
            self.undo(ws, start)
            # The tree is back at the cycle's start, so the pre-cycle measurement is what stands now:
            # logging it keeps Step 1's goal-regression rule from halting on a reverted drop.
            return CycleResult.REGRESSED, {
                **extra,
                "gate": "FAIL",
                "gate_detail": detail,
                "goals_regressed": lost,
                **goal_fields(pre),
            }
        refused = self._guarded(cycle, ws, start, "gate")
        if refused is not None:
            return CycleResult.FAILED, {**extra, **refused, **goal_fields(pre)}
        self._cycle_goals = (goals, pre) if goals is not None and pre is not None else None
        try:
            landed = self._land(cycle, ws, start, replace(held or Held(cycle=cycle), result=str(result)), stop)
        finally:
            self._cycle_goals = None
        if landed is not None and landed[0] is not None:
            return landed[0], {**extra, **landed[1], **goal_fields(pre)}
        if landed is not None:
            extra.update(landed[1])
        if post is not None and extra.get("landed") is not False:
            # Kept and on the branch: fitness-latest.json now describes the tree as it stands (§6.3).
            # A change held pending has not landed yet, so the standing measurement stays as it was.
            goals.accept(post)
        if self.cfg.gate.commands or post is not None:
            extra["gate"] = "PASS"
        if extra.get("landed") is False:
            # Green and committed, not on the branch: the record says so (and what the gate judged, which
            # the entry that settles it carries once it lands).
            extra["gated_result"] = str(result)
            result = CycleResult.PENDING
        return result, {**extra, **goal_fields(post or pre)}

    def interrupted(self, cycle: int, ws: Workspace, start: Start, phase: str) -> tuple[str, dict[str, Any]]:
        """A KILL or signal cut the cycle short: nothing lands, and its work is kept under a ref."""
        out: dict[str, Any] = {"cycle_start_sha": start.sha, "error_class": "interrupted",
                               "error": f"interrupted during the {phase}: nothing landed"}
        try:
            ref = ws.keep(cycle, start)
        except (gitrun.GitError, OSError) as exc:
            self.log.error("workspace.keep_failed", cycle=cycle, error=str(exc)[:300])
            self.undo(ws, start)
            return CycleResult.INTERRUPTED, out
        if ref:
            out["interrupted_ref"] = ref
            out["error"] += f"; the work is kept at {ref}"
        return CycleResult.INTERRUPTED, out

    def _guarded(self, cycle: int, ws: Workspace, start: Start, phase: str) -> dict[str, Any] | None:
        """The guard refused the cycle (§8.5): its work kept under refs/evolve/unlanded/, nothing lands."""
        why = self.guard(phase) if self.guard is not None else None
        if why is None:
            return None
        return {**self._refuse(cycle, ws, start, why), "error_class": GUARD_REFUSED}

    def _refuse(self, cycle: int, ws: Workspace, start: Start, why: str) -> dict[str, Any]:
        """Work that may not land (the agent left the cycle's line): kept under refs/evolve/unlanded/, reset."""
        out: dict[str, Any] = {"error_class": LAND_REFUSED, "error": why[:300]}
        try:
            ref = ws.keep(cycle, start, unlanded=True)
        except (gitrun.GitError, OSError) as exc:
            self.log.error("workspace.keep_failed", cycle=cycle, error=str(exc)[:300])
            self.undo(ws, start)
            return out
        if ref:
            out["unlanded_ref"] = ref
        return out

    def _land(
        self, cycle: int, ws: Workspace, start: Start, held: Held | None, stop: threading.Event | None
    ) -> tuple[CycleResult | None, dict[str, Any]] | None:
        """Land the cycle's commits: (None, fields) when they are on the branch or wait for it; a
        ``failed`` verdict when they cannot land (kept under a ref); ``interrupted`` on a stop."""
        held = held or Held(cycle=cycle)
        try:
            landing = ws.land(cycle, start, held, stop)
        except (gitrun.GitError, OSError) as exc:
            self.log.error("git.land_failed", cycle=cycle, error=str(exc)[:300])
            self.undo(ws, start)
            return CycleResult.FAILED, {"error_class": LAND_FAILED, "error": str(exc)[:300]}
        if landing.outcome is Land.NOTHING:
            return None
        if landing.outcome is Land.INTERRUPTED:
            return self.interrupted(cycle, ws, start, "landing")  # type: ignore[return-value]
        if landing.outcome in (Land.CONFLICT, Land.REFUSED):
            return CycleResult.FAILED, {
                "error_class": LAND_REFUSED if landing.outcome is Land.REFUSED else LAND_FAILED,
                "error": landing.detail[:300], "unlanded_ref": landing.ref, "unlanded_sha": landing.sha,
            }
        if landing.outcome is Land.LANDED and self.publisher is not None and isinstance(ws, Isolated | InPlace):
            self.publisher.landed(getattr(ws, "branch", "") or _branch(ws.repo), landing.sha or "")
        return None, {"sha": landing.sha, **landing.fields}

    def _commit(
        self, cycle: int, item: WorkItem, result: str, start: Start
    ) -> tuple[CycleResult, dict[str, Any]] | None:
        """Commit the cycle's paths; None when that worked (or there was nothing to commit).

        On failure the verdict is :func:`committed`'s ``failed``, and the change is kept, not lost:
        saved under ``refs/evolve/uncommitted/<cycle>`` and the paths put back to HEAD, so the
        released item starts clean next time. Only when even that save fails is the tree left dirty.
        """
        tree = start.tree
        to_commit = [p for p in (gitchange.dirty_paths(tree) - start.dirty_before) if not gitchange.is_internal(p)]
        message = gitchange.commit_message(cycle, clean_text(item.title, 4000), result)
        mine = to_commit if self.cfg.git.commit else []
        refused = gitfilters.refusal(tree, [*mine, *gitchange.changed_since(tree, start.sha)], start.sha)
        if refused:  # plaintext never lands in a filtered file (§8.1): kept under a ref, not committed
            self.log.error("git.commit_refused", cycle=cycle, error=refused)
            verdict = committed(CycleResult(result), refused)
            kept = self._keep(tree, cycle, sorted(mine), message) if mine else {}
            return verdict.result, {**verdict.fields, **kept}
        if not (self.cfg.git.commit and to_commit):
            return None
        try:
            sha = gitchange.commit_paths(tree, to_commit, message, self.git_policy)
        except gitrun.GitError as exc:
            self.log.error("git.commit_failed", cycle=cycle, error=str(exc))
            verdict = committed(CycleResult(result), str(exc))
            return verdict.result, {**verdict.fields, **self._keep(tree, cycle, sorted(to_commit), message)}
        if sha:
            self.log.info("git.commit", sha=sha, paths=len(to_commit))
        return None

    def _keep(self, tree: Path, cycle: int, paths: list[str], message: str) -> dict[str, Any]:
        """Save an uncommitted change under a ref and restore its paths; the ledger fields saying where."""
        try:
            ref = gitchange.save_uncommitted(tree, paths, cycle, message)
        except (gitrun.GitError, OSError) as exc:
            self.log.error("git.save_failed", cycle=cycle, error=str(exc)[:300])
            return {"uncommitted_paths": paths, "uncommitted_left_in_tree": True}
        out: dict[str, Any] = {"uncommitted_ref": ref, "uncommitted_paths": paths}
        self.log.warning("git.uncommitted_saved", cycle=cycle, ref=ref, paths=len(paths))
        try:
            gitchange.restore_paths(tree, paths)
        except (gitrun.GitError, OSError) as exc:
            self.log.error("git.restore_failed", cycle=cycle, error=str(exc)[:300])
            out["uncommitted_left_in_tree"] = True  # saved, but also still there: say so
        return out

    def _keep_output(self, cycle: int, reds: list[Red]) -> dict[str, Any]:
        """Why the cycle went red, kept: each tail in the cycle's run log, an excerpt for the ledger."""
        r = redact.current()  # the sinks: the run log and the ledger entry
        shown = [red for red in reds if red.output.strip()]
        if not shown:
            return {}
        text = "".join(f"\n--- evolve gate: {red.detail} (output tail) ---\n{red.output}\n" for red in shown)
        log_path = self.paths.runs_dir / f"cycle-{cycle}.log"
        try:
            ensure_dir(self.paths.runs_dir)
            fd = open_artifact(log_path)  # a run log: 0600, a planted link replaced, never followed
            try:
                os.write(fd, r.text(text).encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError as exc:  # the ledger excerpt still says why
            self.log.error("gate.output_not_kept", cycle=cycle, path=str(log_path), error=str(exc)[:300])
        return {"gate_output": r.text(excerpt(shown[0].output)), "run_log": str(log_path)}

    def red_reason(self, cwd: Path, stop: threading.Event | None = None) -> str | None:
        """The gate commands again in ``cwd``: why red, or None."""
        red = self.run_commands(cwd, stop)
        return red.detail if red else None

    def regate(self, tree: Path, base: str, stop: threading.Event | None = None) -> str | None:
        """The whole gate again on commits replayed onto ``base`` (the operator's moved branch, §8.3): the
        commands, the filters the new tree declares (plaintext never lands in a filtered path), and, for a
        cycle's own landing, the goals that passed before it. Why red, or None."""
        red = self.run_commands(tree, stop)
        if red is not None:
            return red.detail
        paths = gitchange.changed(tree, base, "HEAD")
        refused = gitfilters.refusal(tree, paths, base)
        if refused:
            return refused
        raw = gitfilters.unfiltered(tree, paths)
        if raw:
            return (f"{land.paths_text(raw)}: filtered on the moved branch (.gitattributes), but the change stores "
                    "it unfiltered: it would land as plaintext; redo it on the new branch")
        if self._cycle_goals is not None and not (stop is not None and stop.is_set()):
            goals, pre = self._cycle_goals
            lost = goal_regressions(pre, goals.measure_post())
            if lost:
                return "goal regressed after the replay: " + ", ".join(lost)
        return None

    def run_commands(self, cwd: Path | None = None, stop: threading.Event | None = None) -> Red | None:
        """The first red gate command (its one-line reason and output tail), or None when all are green.

        ``cwd``: where the commands run (the repository unless said otherwise). ``stop`` stops the
        running command's process group (a KILL or signal); the caller sees it set and lands nothing.
        """
        where = self.paths.repo if cwd is None else cwd
        env = self.command_env(where)
        if self.before is not None:  # [workspace] setup again when the change touched an input (§8.4)
            red = self.before(where)
            if red is not None:
                return red
        for argv in self.cfg.gate.commands:
            label = command_label(argv)
            with tempfile.TemporaryDirectory(prefix="evolve-gate-") as tmp:
                out = Path(tmp).resolve() / "out"  # our private dir, canonical (TMPDIR may be a link)
                try:
                    proc = run_group(
                        argv,
                        cwd=where,
                        env=env,
                        limits=Limits(timeout_s=self.cfg.gate.timeout_s, grace_s=2.0, tail_bytes=0),
                        log_path=out,
                        stop=stop,
                        sandbox=contained(),  # repository code: the fire's sandbox (§8.6)
                    )
                except OSError as exc:
                    return Red(f"{label}: {exc}")
                text = out.read_text(errors="replace") if out.exists() else ""
            tail = redact.current().text(output_tail(text))
            if _stopped(stop):
                return Red(f"{label}: stopped (KILL or a signal)", tail)
            if proc.timed_out:
                return Red(f"{label}: timed out after {self.cfg.gate.timeout_s:g}s; process group killed", tail)
            if proc.returncode != 0:
                return Red(f"{label}: exit {proc.returncode}", tail)
            if _STRUCTURAL_RED.search(text):
                return Red(f"{label}: structural FAILED/BLOCKED marker", tail)
        return None


def _stopped(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def _branch(repo: Path) -> str:
    return gitrefs.branch_of(repo) or ""


def goal_reds(lost: list[str], post: dict[str, Any] | None) -> list[Red]:
    """The goals that regressed, each with the output its check printed after the cycle (pure)."""
    outputs = {
        str(g.get("goal_id")): str(g.get("output") or "") for g in (post or {}).get("goals", []) if isinstance(g, dict)
    }
    return [Red(f"goal {goal}: fail", output_tail(outputs.get(goal, ""))) for goal in lost]
