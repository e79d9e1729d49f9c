"""Measuring every goal of a GOALS file into one snapshot, under per-goal and total timeouts."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evolve.childenv import BASE, FIRE, child_env, with_path
from evolve.git import refs as gitrefs
from evolve.procgroup import capped, contained
from evolve.timeutil import utc_iso
from evolve.work.goals.check import CheckRun, run_check
from evolve.work.goals.model import Goal, GoalsFile, MeasureError
from evolve.work.goals.output import cap_output

SAFE_ENV_KEYS = (*BASE, *FIRE)  # as gate commands (childenv): a check runs the repo's code
SKIP_EXIT = 77


def measure(
    repo: Path,
    gf: GoalsFile,
    *,
    goal_timeout_s: float,
    total_timeout_s: float,
    env: Mapping[str, str] | None = None,
    parallel: int = 2,
    now: float | None = None,
    pass_env: Iterable[str] = (),
    path: Iterable[str] = (),
) -> dict[str, Any]:
    """Run every check (meta goals first, one at a time; then the rest, ``parallel`` at once) into a snapshot.

    Raises MeasureError when the total timeout passes before every goal finished: a partial snapshot
    would read as a regression, so the caller keeps the last good one instead. ``path``: directories of
    ``repo`` put first on the checks' PATH (``[workspace] path``, as for the gate commands).
    """
    # Within the fire's remaining budget too: checks that outlast max_minutes hold the whole fire.
    deadline = time.monotonic() + (capped(total_timeout_s) or total_timeout_s)
    stop = threading.Event()
    check_env = sanitized_env(env, pass_env, path=[str(repo / p) for p in path])
    results: list[CheckRun | None] = [None] * len(gf.goals)
    box = contained()  # asked here: the pool's threads do not see the fire's context (§8.6)

    def run(i: int) -> CheckRun | None:
        if stop.is_set() or time.monotonic() >= deadline:
            return None  # the total budget is spent: do not start
        return run_check(
            gf.goals[i].check, cwd=repo, env=check_env, timeout_s=goal_timeout_s, deadline=deadline, stop=stop,
            sandbox=box,
        )

    try:
        for i, g in enumerate(gf.goals):
            if g.type == "meta":
                results[i] = run(i)
        with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="goal-check") as pool:
            try:
                futures = {i: pool.submit(run, i) for i, g in enumerate(gf.goals) if g.type != "meta"}
                for i, fut in futures.items():
                    results[i] = fut.result()
            finally:
                stop.set()  # on any exception, running checks kill their groups and pending ones never start
    finally:
        stop.set()
    finished = [r for r in results if r is not None and r.outcome != "aborted"]
    if len(finished) != len(results):
        unfinished = [g.id for g, r in zip(gf.goals, results, strict=True) if r is None or r.outcome == "aborted"]
        raise MeasureError(
            f"goal measurement exceeded the total timeout of {total_timeout_s:g}s; "
            f"unfinished: {', '.join(unfinished[:10])}"
        )
    entries = [_entry(g, r) for g, r in zip(gf.goals, finished, strict=True)]
    return {
        "timestamp": utc_iso(now),
        "git_sha": _git_sha(repo),
        "goals_era": gf.era,
        "goals": entries,
        "summary": _summary(entries),
    }


def sanitized_env(env: Mapping[str, str] | None = None, pass_env: Iterable[str] = (),
                  path: Iterable[str] = ()) -> dict[str, str]:
    """Locale, identity, PATH (``path`` first), the fire's id and ``[gate] pass_env``: never API keys or
    EVOLVE_* settings."""
    return with_path(child_env(env, SAFE_ENV_KEYS, pass_env), path)


def _git_sha(repo: Path) -> str | None:
    try:
        return gitrefs.head(repo)
    except OSError:
        return None


def _entry(goal: Goal, run: CheckRun) -> dict[str, Any]:
    output = run.output
    if run.outcome == "timeout":
        output = f"{output}\n[timed out; process group killed]".strip()
    if run.cleanup_failed:
        output = f"{output}\n[process-tree cleanup failed: processes left in the check's group]".strip()
    entry: dict[str, Any] = {
        "goal_id": goal.id,
        "result": _classify(run),
        "weight": goal.weight,
        "duration_s": round(run.duration_s, 3),
        "output": cap_output(output),
        "tags": list(goal.tags),
    }
    if goal.continuous is not None:
        entry["value"] = _parse_value(run.stdout_tail)
        entry["threshold"] = goal.continuous.get("threshold")  # the agentops field, next to ``value``
    return entry


def _classify(run: CheckRun) -> str:
    """Pass, fail or skip; a check whose leftover processes cannot be killed fails.

    As in agentops, a cleanup failure is an infrastructure failure and must not inherit a pass.
    """
    if run.cleanup_failed:
        return "fail"
    if run.outcome == "timeout" or run.returncode == SKIP_EXIT:
        return "skip"
    return "pass" if run.returncode == 0 else "fail"


def _summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the weighted pass percentage over scored (non-skipped) goals, rounded to 2 places.

    When nothing was scored (no goals, or every goal skipped) the score is 100.0: nothing is failing, and an
    all-skipped run must not look like a collapse to a score-comparing regression check.
    """
    passing = [e for e in entries if e["result"] == "pass"]
    failing = [e for e in entries if e["result"] == "fail"]
    scored = sum(e["weight"] for e in passing) + sum(e["weight"] for e in failing)
    score = 100.0 if scored == 0 else round(100.0 * sum(e["weight"] for e in passing) / scored, 2)
    return {
        "total": len(entries),
        "passing": len(passing),
        "failing": len(failing),
        "skipped": len(entries) - len(passing) - len(failing),
        "score": score,
    }


def _parse_value(stdout_tail: str) -> float | None:
    """A continuous goal's value: its stdout's last non-empty line as a finite float, else None."""
    lines = [ln.strip() for ln in stdout_tail.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        value = float(lines[-1])
    except ValueError:
        return None
    return value if math.isfinite(value) else None
