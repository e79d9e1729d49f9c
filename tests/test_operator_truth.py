"""Issue 16 items 1-4: status, notifications, metrics and the report say what actually happened.

Real fires on real git repositories with real command agents (tests/support.py).
"""

from __future__ import annotations

import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support import CliResult, Env, entry, git, results

DOCS = Path(__file__).resolve().parent.parent / "docs" / "AGENTS.md"


def _doc_agent(env: Env) -> Path:
    """The ten-line example agent of docs/AGENTS.md, exactly as documented."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## A complete agent in ten lines", 1)[1]
    code = re.search(r"```python\n(.*?)```\n", section, re.S)
    assert code is not None
    lines = code.group(1).splitlines()
    assert len(lines) == 10  # the docs promise ten lines
    script = env.root / "agent.py"
    script.write_text("\n".join([f"#!{sys.executable}", *lines[1:]]) + "\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _assert_git_clean(env: Env) -> None:
    assert not (env.repo / ".git" / "index.lock").exists()
    for e in env.ledger():
        if e.get("result") == "improved" and e.get("sha"):
            assert git(env.repo, "cat-file", "-t", e["sha"]).strip() == "commit"


# -- item 3: the command-runner contract -------------------------------------------------------


def test_documented_example_agent_reporting_on_stdout_lands_its_work(
    env: Env, cli: Callable[..., CliResult]
) -> None:
    script = _doc_agent(env)
    env.write_config(agent={"argv": [str(script)], "pass_env": []})
    env.queue(entry("add a note"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert results(ledger) == ["improved"], ledger
    assert ledger[-1]["summary"] == "noted 'add a note'"
    assert (env.repo / "NOTES.md").read_text() == "- add a note\n"
    assert git(env.repo, "log", "-1", "--format=%H").strip() == ledger[-1]["sha"]
    _assert_git_clean(env)
