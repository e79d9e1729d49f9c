"""Pick the runner the config names; every runner yields the same :class:`AgentReport`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport
from evolve.config import Config
from evolve.paths import Paths

# The CLI runners: a failed run has already made the conversation, so its retry resumes it.
RESUMING_CLIS = ("claude", "codex", "gemini")


class Runner(Protocol):
    name: str

    def plan(self, inv: Invocation) -> tuple[list[str], dict[str, str]]:
        """The exact argv and the env changes the run would use (for --dry-run)."""
        ...

    def run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
        on_heartbeat: Callable[..., None] | None = None,
    ) -> AgentReport: ...


def preflight(runner: Runner) -> str | None:
    """A configuration problem that would fail every run (None: none seen), checked before any claim.

    Optional on a runner: the CLI runners have one (:meth:`evolve.agent.clirun.CliRunner.preflight`).
    """
    check = getattr(runner, "preflight", None)
    return check() if callable(check) else None


def make_runner(cfg: Config, env: Mapping[str, str], paths: Paths) -> Runner:
    runner = _make(cfg, env, paths)
    if cfg.agent.runner in ("claude", "codex", "gemini"):
        from evolve.agent import settings as agentsettings

        kind = cfg.agent.runner
        # What of the CLI's project settings reaches the run (docs/DESIGN.md §8.5): asked per tree, per run.
        runner.settings_for = lambda tree: agentsettings.for_tree(paths, kind, tree, env)  # type: ignore[attr-defined]
    return runner


def _make(cfg: Config, env: Mapping[str, str], paths: Paths) -> Runner:
    kind = cfg.agent.runner
    if kind == "http":
        from evolve.agent.http import HttpRunner

        return HttpRunner(cfg.agent, env, paths.sessions_dir, context_window=cfg.context.context_window)
    if kind == "claude":
        from evolve.agent.claude import ClaudeRunner

        return ClaudeRunner(
            cfg.agent, env, autocompact_pct=cfg.context.autocompact_pct, context_window=cfg.context.context_window
        )
    if kind == "codex":
        from evolve.agent.codex import CodexRunner

        return CodexRunner(
            cfg.agent,
            env,
            context_window=cfg.context.context_window,
            worktree=cfg.git.isolation == "worktree",
            autocompact_pct=cfg.context.autocompact_pct,
        )
    if kind == "gemini":
        from evolve.agent.gemini import GeminiRunner

        return GeminiRunner(cfg.agent, env, context_window=cfg.context.context_window)
    from evolve.agent.command import CommandRunner

    return CommandRunner(cfg.agent, env)
