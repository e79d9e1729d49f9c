"""Red team of issue 22: the workspace boundary attacked the way a hostile agent, an unlucky operator or a
real repository would. Each test is a break of one of the issue's "What must hold" items, reproduced with
real git and real fires; its docstring says what must hold instead.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from support import Env, entry, git, improved_step


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def test_a_landing_finished_after_a_death_never_writes_into_the_branch_the_operator_switched_to(
        env: Env, cli) -> None:
    """Items 2, 4, 7: the fire dies right after git's fast-forward moved ``main`` (crash point
    ``land.moved``); before the next fire the operator switches their checkout to ``feature``, as anyone
    may between two cron fires. The next fire's recovery "finishes" the fast-forward path by path in the
    checkout named by the intent, without asking which branch that checkout is on now: it writes
    ``main``'s landed file into the operator's ``feature`` working tree and stages it in ``feature``'s
    index, so the operator's next commit on ``feature`` carries evolve's change. What must hold: a landing
    is finished only in a checkout that still has its branch checked out; ``feature`` (its tip, index and
    files) is untouched, and ``main`` carries the landed commit."""
    git(env.repo, "branch", "feature")
    env.queue(entry("once"))
    env.steps([improved_step(path="once.txt", content="once\n")])
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_CRASHPOINT": "land.moved"})
    assert r.code == -signal.SIGKILL, r.stderr
    landed = head(env.repo, "main")
    assert git(env.repo, "show", f"{landed}:once.txt") == "once\n"  # git's fast-forward went through
    feature = head(env.repo, "feature")
    git(env.repo, "checkout", "-q", "feature")  # the operator, between two fires
    assert git(env.repo, "status", "--porcelain").strip() == "" and not (env.repo / "once.txt").exists()
    env.steps([{"report": {"result": "unchanged", "summary": "nothing"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert head(env.repo, "main") == landed
    assert head(env.repo, "feature") == feature
    assert git(env.repo, "symbolic-ref", "HEAD").strip() == "refs/heads/feature"
    # feature's checkout as the operator left it: nothing of main's landing in its files or its index
    assert git(env.repo, "status", "--porcelain").strip() == "", git(env.repo, "status", "--porcelain")
    assert not (env.repo / "once.txt").exists()
