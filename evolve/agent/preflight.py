"""The runner preflight (issue 16): the cheap half of ``evolve doctor``'s agent check, run by every fire.

A missing agent binary or an empty ``base_url`` is the configuration's fault, not the work item's:
a fire that finds one ends with exit 78 (EX_CONFIG) *before* it claims any work, so no item is
charged an attempt and the breaker stays shut. Only what costs nothing is checked here (the config
and a ``PATH`` lookup); ``evolve doctor`` adds the expensive checks (``--version``, credentials).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The npm package of each CLI runner, for the install hint.
NPM = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "gemini": "@google/gemini-cli"}


@dataclass(frozen=True)
class Problem:
    message: str
    fix: str


def which(cmd: str, env: Mapping[str, str]) -> str | None:
    """``cmd`` resolved as the runner will start it: a path must be an executable file, a name is looked up on PATH."""
    if os.sep in cmd:
        return cmd if os.path.isfile(cmd) and os.access(cmd, os.X_OK) else None
    return shutil.which(cmd, path=env.get("PATH"))


def check(agent: Any, env: Mapping[str, str]) -> tuple[list[Problem], str | None]:
    """The runner's configuration errors, and the resolved binary (None for the http runner or on error)."""
    if agent.runner == "http":
        if not agent.base_url:
            return [Problem("runner = http but [agent] base_url is empty",
                            "set [agent] base_url to the OpenAI-compatible endpoint")], None
        if not str(agent.base_url).startswith(("http://", "https://")):
            return [Problem(f"[agent] base_url {str(agent.base_url)[:100]!r} is not an http(s) URL",
                            "set [agent] base_url to the endpoint, e.g. http://127.0.0.1:8080/v1")], None
        return [], None
    if not agent.argv:
        return [Problem("[agent] argv is empty", 'set [agent] argv, e.g. ["claude"]')], None
    binary = agent.argv[0]
    path = which(binary, env)
    if path is None:
        fix = (f"install it (npm install -g {NPM[agent.runner]}) or set [agent] argv to its path"
               if agent.runner in NPM else "fix [agent] argv[0], or put it on the PATH evolve runs with")
        return [Problem(f"{binary!r} not found on PATH", fix)], None
    return [], path


def before_claim(agent: Any, env: Mapping[str, str], own: Callable[[], str | None]) -> list[Problem]:
    """Everything a fire checks before it claims work: the cheap checks above, then (when they pass)
    the runner's own check of what its CLI needs (``own``: a provider config, a sandbox that allows
    edits; :func:`evolve.agent.runners.preflight`). Its words may quote config, so they are masked."""
    problems, _ = check(agent, env)
    if problems:
        return problems
    problem = own()
    if problem is None:
        return []
    from evolve import redact

    return [Problem(redact.current().text(problem)[:300], "see `evolve doctor` and the README's runner section")]
