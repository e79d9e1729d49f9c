"""The Claude Code CLI runner: ``claude -p --output-format stream-json --verbose``.

Fresh runs pre-assign ``--session-id`` and carry the orientation in one
``--append-system-prompt-file``; resumed runs use ``--resume <id>`` (never ``--continue``) and put
the dynamic block at the top of the prompt, because a resumed conversation keeps its recorded
system prompt. The prompt goes in on stdin. The stream is parsed as it arrives.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from evolve.agent import stream
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport
from evolve.childenv import agent_env
from evolve.config import AgentConfig
from evolve.procgroup import Limits, run_group
from evolve.redact import Redactor
from evolve.store.atomic import write_new
from evolve.store.dirfd import ensure_dir

# The Claude Code CLI's own settings and credentials; Bedrock/Vertex users add theirs in [agent] pass_env.
CLAUDE_ENV = ("ANTHROPIC_*", "CLAUDE_*")


class ClaudeRunner:
    name = "claude"

    def __init__(
        self,
        cfg: AgentConfig,
        base_env: Mapping[str, str] | None = None,
        *,
        autocompact_pct: int = 40,
        context_window: int = 0,
    ) -> None:
        self.cfg = cfg
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.autocompact_pct = autocompact_pct
        self.context_window = context_window

    # -- the exact call --------------------------------------------------------------------

    def system_file(self, inv: Invocation) -> Path:
        return inv.run_dir / f"cycle-{inv.cycle}.system.md"

    def stdin_file(self, inv: Invocation) -> Path:
        return inv.run_dir / f"cycle-{inv.cycle}.prompt.md"

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
        return argv

    def env(self, inv: Invocation) -> tuple[dict[str, str], dict[str, str]]:
        changes = {
            "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(self.autocompact_pct),
            "EVOLVE_CYCLE": str(inv.cycle),
            "EVOLVE_SESSION_ID": inv.session_id,
            "EVOLVE_MODE": inv.mode,
            "EVOLVE_REPO": str(inv.repo),
        }
        env = agent_env(self.base_env, CLAUDE_ENV, self.cfg.pass_env)
        env.pop("CLAUDECODE", None)  # a nested-session marker makes the CLI refuse to start
        env.update(changes)
        return env, {**changes, "CLAUDECODE": "<removed>"}

    def prompt_text(self, inv: Invocation) -> str:
        return inv.orientation.resumed_prompt() if inv.resume else inv.orientation.task + "\n"

    def plan(self, inv: Invocation) -> tuple[list[str], dict[str, str]]:
        return self.argv(inv), self.env(inv)[1]

    # -- running ---------------------------------------------------------------------------

    def run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
        on_heartbeat: Callable[..., None] | None = None,
    ) -> AgentReport:
        report = self._once(inv, on_start=on_start, stop=stop, on_heartbeat=on_heartbeat)
        if inv.resume and report.error_class is not None and report.disposition == "invalid-session":
            # The stored conversation is gone: rebuild as a fresh session, once, never in a loop.
            fresh = replace(inv, mode="first", resume=False, session_id=str(uuid.uuid4()))
            report = self._once(fresh, on_start=on_start, stop=stop, on_heartbeat=on_heartbeat)
            report = replace(report, disposition=(report.disposition + "; rebuilt after invalid session").strip("; "))
        return report

    def _once(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None,
        stop: threading.Event | None,
        on_heartbeat: Callable[..., None] | None,
    ) -> AgentReport:
        ensure_dir(inv.run_dir)  # a linked runs/ is refused: prompts must not land outside
        system = self.system_file(inv)
        stdin = self.stdin_file(inv)
        try:
            if not inv.resume:
                write_new(system, inv.orientation.system().encode("utf-8"))
            write_new(stdin, self.prompt_text(inv).encode("utf-8"))
            state = stream.StreamState()
            env, _ = self.env(inv)

            def beat(elapsed: float) -> None:
                if on_heartbeat:
                    on_heartbeat(elapsed, state.progress())

            started = time.monotonic()
            try:
                proc = run_group(
                    self.argv(inv),
                    cwd=inv.repo,
                    env=env,
                    limits=Limits(
                        timeout_s=self.cfg.timeout_s,
                        idle_timeout_s=self.cfg.idle_timeout_s,
                        heartbeat_s=self.cfg.heartbeat_s,
                    ),
                    log_path=inv.run_dir / f"cycle-{inv.cycle}.log",
                    stdin_path=stdin,
                    on_start=on_start,
                    on_output=state.feed,
                    stop=stop,
                    on_heartbeat=beat,
                # Every secret evolve holds is masked, not only the ones the agent was given.
                redactor=Redactor.from_env({**self.base_env, **env}),
                )
            except OSError as exc:
                return AgentReport("failed", error_class="fatal", error=f"cannot start {self.cfg.argv[0]!r}: {exc}")
            state.finish()
        finally:
            # Temp files go even on error; the per-cycle log stays for the operator.
            system.unlink(missing_ok=True)
            stdin.unlink(missing_ok=True)
        base: dict[str, Any] = {"duration_s": round(time.monotonic() - started, 3), "exit_code": proc.returncode}
        if proc.interrupted:
            return AgentReport(
                "failed", error_class="interrupted", error="interrupted", session_id=state.session_id, **base
            )
        if proc.timed_out:
            return AgentReport(
                "failed",
                error_class="timeout",
                session_id=state.session_id,
                error=f"agent {proc.timed_out} timeout; process group killed",
                **base,
            )
        if inv.resume and stream.invalid_session(proc.output_tail, state.result):
            return AgentReport(
                "failed",
                error_class="fatal",
                disposition="invalid-session",
                error="no conversation found for the session id",
                **base,
            )
        report = stream.to_report(state, output_tail=proc.output_tail, window_override=self.context_window)
        if report.error_class == "limit":
            wait = stream.retry_after_s(state)
            if wait is not None:
                report = replace(report, error=f"{report.error} (retry_after={wait:g}s)")
        return replace(report, **base)
