"""The Claude Code CLI runner: ``claude -p --output-format stream-json --verbose``.

Fresh runs pre-assign ``--session-id`` and carry the orientation in one
``--append-system-prompt-file``; resumed runs use ``--resume <id>`` (never ``--continue``) and put
the dynamic block at the top of the prompt, because a resumed conversation keeps its recorded
system prompt. The prompt goes in on stdin. The stream is parsed as it arrives; the process, its
limits and the invalid-session rebuild are the shared :class:`~evolve.agent.clirun.CliRunner`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from evolve.agent import stream
from evolve.agent.clirun import CliRunner, Finished, invalid_session_report
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport
from evolve.config import AgentConfig

# The Claude Code CLI's own settings and credentials; Bedrock/Vertex users add theirs in [agent] pass_env.
CLAUDE_ENV = ("ANTHROPIC_*", "CLAUDE_*")


class ClaudeRunner(CliRunner):
    name = "claude"
    api_env = CLAUDE_ENV

    def __init__(
        self,
        cfg: AgentConfig,
        base_env: Mapping[str, str] | None = None,
        *,
        autocompact_pct: int = 40,
        context_window: int = 0,
    ) -> None:
        super().__init__(cfg, base_env, context_window=context_window)
        self.autocompact_pct = autocompact_pct

    # -- the exact call --------------------------------------------------------------------

    def system_file(self, inv: Invocation) -> Path:
        return inv.run_dir / f"cycle-{inv.cycle}.system.md"

    def extra_files(self, inv: Invocation) -> dict[Path, str]:
        return {} if inv.resume else {self.system_file(inv): inv.orientation.system()}

    def argv(self, inv: Invocation) -> list[str]:
        cfg = self.cfg
        argv = [
            *cfg.argv,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-mode",
            cfg.permission_mode,
        ]
        if cfg.allowed_tools:
            argv += ["--allowedTools", ",".join(cfg.allowed_tools)]
        if cfg.model:
            argv += ["--model", cfg.model]
        if cfg.max_turns:
            argv += ["--max-turns", str(cfg.max_turns)]
        if cfg.max_budget_usd:
            argv += ["--max-budget-usd", f"{cfg.max_budget_usd:g}"]
        if inv.resume and inv.fork_from and inv.mode == "fork":
            # A fork branches the parent's conversation under a pre-assigned child id.
            argv += ["--resume", inv.fork_from, "--fork-session", "--session-id", inv.session_id]
        elif inv.resume:
            argv += ["--resume", inv.session_id]
        else:
            argv += ["--session-id", inv.session_id, "--append-system-prompt-file", str(self.system_file(inv))]
        if self.settings_for is not None:  # the repository's untrusted settings left out (docs/DESIGN.md §8.5)
            argv += self.settings_for(inv.repo).claude_args()
        return argv

    def env(self, inv: Invocation) -> tuple[dict[str, str], dict[str, str]]:
        changes = {
            "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(self.autocompact_pct),
            "EVOLVE_CYCLE": str(inv.cycle),
            "EVOLVE_SESSION_ID": inv.session_id,
            "EVOLVE_MODE": inv.mode,
            "EVOLVE_REPO": str(inv.repo),
        }
        env = self.env_base()
        env.pop("CLAUDECODE", None)  # a nested-session marker makes the CLI refuse to start
        env.update(changes)
        return env, {**changes, "CLAUDECODE": "<removed>"}

    def prompt_text(self, inv: Invocation) -> str:
        return inv.orientation.resumed_prompt() if inv.resume else inv.orientation.task + "\n"

    # -- the stream ------------------------------------------------------------------------

    def parser(self, inv: Invocation) -> stream.StreamState:
        return stream.StreamState()

    def finish(self, inv: Invocation, state: stream.StreamState, done: Finished) -> AgentReport:
        proc, base = done.proc, done.base
        if inv.resume and stream.invalid_session(proc.output_tail, state.result):
            return invalid_session_report(base, "no conversation found for the session id")
        report = stream.to_report(state, output_tail=proc.output_tail, window_override=self.context_window)
        if report.error_class == "limit":
            wait = stream.retry_after_s(state)
            if wait is not None:
                report = replace(report, error=f"{report.error} (retry_after={wait:g}s)")
        return replace(report, **base)
