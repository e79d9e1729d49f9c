"""The runner preflight (issue 16): the cheap half of ``evolve doctor``'s agent check, run by every fire.

A missing agent binary or an empty ``base_url`` is the configuration's fault, not the work item's:
a fire that finds one ends with exit 78 (EX_CONFIG) *before* it claims any work, so no item is
charged an attempt and the breaker stays shut. Only what costs nothing is checked here (the config,
a ``PATH`` lookup and, for the Codex and Gemini runners, the CLI's own config files), so ``evolve
status`` runs it too; ``evolve doctor`` adds the expensive checks (``--version``, credentials).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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


def check(agent: Any, env: Mapping[str, str], *, worktree: bool = False) -> tuple[list[Problem], str | None]:
    """The runner's configuration errors, and the resolved binary (None for the http runner or on error).
    ``worktree``: the agent works in evolve's worktree (``[git] isolation = "worktree"``)."""
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
    problem = runner_problem(agent, env, worktree=worktree)
    return ([] if problem is None else [problem]), path


# -- the Codex and Gemini CLIs' own configuration (docs/DESIGN.md §5.4) ----------------------------

CODEX_SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
GEMINI_APPROVAL_MODES = ("default", "auto_edit", "yolo", "plan")


def codex_sandbox(permission_mode: str) -> str:
    """``[agent] permission_mode`` when it is a Codex sandbox mode; otherwise one that allows edits."""
    return permission_mode if permission_mode in CODEX_SANDBOXES else "workspace-write"


def gemini_approval_mode(permission_mode: str) -> str:
    """``[agent] permission_mode`` when it is a Gemini approval mode; otherwise one that allows edits."""
    return permission_mode if permission_mode in GEMINI_APPROVAL_MODES else "auto_edit"


def codex_home(env: Mapping[str, str]) -> Path:
    if env.get("CODEX_HOME"):
        return Path(env["CODEX_HOME"])
    return Path(env.get("HOME") or str(Path.home())) / ".codex"


def gemini_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("GEMINI_CLI_HOME") or env.get("HOME") or str(Path.home())) / ".gemini"


def gemini_auth(home: Path) -> str | None:
    """``security.auth.selectedType`` from the user settings, when it is set."""
    import orjson  # only on the gemini runner's path

    try:
        obj = orjson.loads((home / "settings.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    auth = ((obj.get("security") or {}).get("auth") or {}) if isinstance(obj, dict) else {}
    kind = auth.get("selectedType") if isinstance(auth, dict) else None
    return kind if isinstance(kind, str) and kind else None


def runner_problem(agent: Any, env: Mapping[str, str], *, worktree: bool = False) -> Problem | None:
    """A Codex or Gemini configuration on which every run would fail (None: none seen, or another runner)."""
    if agent.runner == "codex":
        sandbox = codex_sandbox(agent.permission_mode)
        if sandbox == "read-only":
            return Problem('runner codex: permission_mode = "read-only" lets the agent change nothing',
                           'set [agent] permission_mode = "workspace-write"')
        if agent.base_url:
            if not env.get(agent.api_key_env):
                return Problem(f"runner codex: ${agent.api_key_env} is not set (the provider's env_key)",
                               f"export {agent.api_key_env} in the service environment")
            return None
        home = codex_home(env)
        if not (home / "config.toml").is_file() and not (home / "auth.json").is_file():
            return Problem(f"runner codex: no provider config ({home}/config.toml) and no login "
                           f"({home}/auth.json)",
                           "set [agent] base_url, or configure the CLI as the user evolve runs as")
        return None
    if agent.runner == "gemini":
        if gemini_approval_mode(agent.permission_mode) == "plan":
            return Problem('runner gemini: permission_mode = "plan" is read-only: the agent could change nothing',
                           'set [agent] permission_mode = "auto_edit"')
        home = gemini_home(env)
        if gemini_auth(home) is None and not env.get("GOOGLE_GENAI_USE_VERTEXAI"):
            return Problem(f"runner gemini: no auth method in {home}/settings.json (security.auth.selectedType, "
                           'e.g. "gemini-api-key"); the CLI exits before any request without one',
                           'write {"security": {"auth": {"selectedType": "gemini-api-key"}}} there')
        return None
    return None

