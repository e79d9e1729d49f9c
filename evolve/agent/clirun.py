"""The shared piece of every coding-agent CLI runner: one process, a stream of JSON events, one report.

Claude Code, Codex and Gemini differ in their argv, their environment, their event vocabulary and
where they keep a session; they share everything else, which lives here once: the prompt file on
stdin, the process group with its hard and idle timeouts and heartbeat, the redacted run log,
the interrupted/timeout/cannot-start taxonomy, and "an invalid session is rebuilt once, as a
fresh one, never in a loop" (docs/DESIGN.md §5).

A runner subclass supplies :meth:`argv`, :meth:`env`, :meth:`prompt_text`, a parser
(:class:`EventParser`: bytes in, state out, pure) and :meth:`finish`, which turns the parsed
stream (and, where the CLI keeps the numbers there, its session store) into the AgentReport.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport
from evolve.config import AgentConfig
from evolve.procgroup import Limits, ProcessResult, contained, run_group
from evolve.redact import Redactor
from evolve.store.atomic import write_new
from evolve.store.dirfd import ensure_dir

INVALID_SESSION = "invalid-session"


class EventParser(Protocol):
    session_id: str | None

    def feed(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...

    def progress(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Finished:
    """What the process left behind, for a runner's :meth:`CliRunner.finish`."""

    proc: ProcessResult
    base: dict[str, Any]  # duration_s and exit_code, merged into every report
    mark: Any = None  # what :meth:`CliRunner.before` returned


class CliRunner:
    """A coding-agent CLI run as one process group whose stdout is a stream of JSON events."""

    name = "cli"
    api_env: tuple[str, ...] = ()  # the CLI's own variables (credentials, endpoint, home) passed through
    worktree = False  # the agent works in evolve's worktree ([git] isolation = "worktree"; Codex's sandbox cares)
    # What of the CLI's project settings the run in a tree gets (evolve/agent/settings.py; set by make_runner).
    settings_for: Callable[[Path], Any] | None = None

    def __init__(self, cfg: AgentConfig, base_env: Mapping[str, str] | None = None, *, context_window: int = 0) -> None:
        self.cfg = cfg
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.context_window = context_window

    # -- what a runner supplies ------------------------------------------------------------

    def argv(self, inv: Invocation) -> list[str]:
        raise NotImplementedError

    def env(self, inv: Invocation) -> tuple[dict[str, str], dict[str, str]]:
        """The child's whole environment, and the changes to show in --dry-run."""
        raise NotImplementedError

    def prompt_text(self, inv: Invocation) -> str:
        """The prompt on stdin: the whole orientation when fresh, the short nudge on a resume."""
        return inv.orientation.resumed_prompt() if inv.resume else inv.orientation.full() + "\n"

    def parser(self, inv: Invocation) -> EventParser:
        raise NotImplementedError

    def finish(self, inv: Invocation, state: Any, done: Finished) -> AgentReport:
        raise NotImplementedError

    def session_file(self, inv: Invocation, session_id: str) -> Path | None:
        """The CLI's own store of ``session_id`` (its per-request usage), where it keeps one."""
        return None

    def before(self, inv: Invocation) -> Any:
        """Runs just before the process starts: where a resumed session's file ends now (this run's
        part starts there); passed to :meth:`finish` as ``done.mark``."""
        path = self.session_file(inv, inv.session_id) if inv.resume and inv.session_id else None
        try:
            return os.path.getsize(path) if path else 0
        except OSError:
            return 0

    def extra_files(self, inv: Invocation) -> dict[Path, str]:
        """Files written before the run and removed after it (beside the prompt on stdin)."""
        return {}

    def preflight(self) -> str | None:
        """A configuration problem that makes every run fail (None: none found); checked before any
        claim by :func:`evolve.agent.preflight.check`, which this answers with."""
        from evolve.agent import preflight

        problem = preflight.runner_problem(self.cfg, self.base_env, worktree=self.worktree)
        return None if problem is None else f"{problem.message}; {problem.fix}"

    # -- shared ----------------------------------------------------------------------------

    def stdin_file(self, inv: Invocation) -> Path:
        return inv.run_dir / f"cycle-{inv.cycle}.prompt.md"

    def plan(self, inv: Invocation) -> tuple[list[str], dict[str, str]]:
        return self.argv(inv), self.env(inv)[1]

    def env_base(self, pass_env_extra: tuple[str, ...] = ()) -> dict[str, str]:
        from evolve.childenv import agent_env

        return agent_env(self.base_env, (*self.api_env, *pass_env_extra), self.cfg.pass_env)

    def run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
        on_heartbeat: Callable[..., None] | None = None,
    ) -> AgentReport:
        report = self._once(inv, on_start=on_start, stop=stop, on_heartbeat=on_heartbeat)
        if inv.resume and report.error_class is not None and report.disposition == INVALID_SESSION:
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
        settings = self.settings_for(inv.repo) if self.settings_for is not None else None
        if settings is not None and settings.refusal:  # a committed settings file the CLI cannot be told to skip
            return AgentReport("failed", error_class="fatal", error=settings.refusal)
        files = {**self.extra_files(inv), self.stdin_file(inv): self.prompt_text(inv)}
        state = self.parser(inv)
        try:
            for path, text in files.items():
                write_new(path, text.encode("utf-8"))
            env, _ = self.env(inv)
            mark = self.before(inv)

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
                    log_path=inv.log_file,
                    stdin_path=self.stdin_file(inv),
                    on_start=on_start,
                    on_output=state.feed,
                    stop=stop,
                    on_heartbeat=beat,
                    # Every secret evolve holds is masked, not only the ones the agent was given.
                    redactor=Redactor.from_env({**self.base_env, **env}),
                    sandbox=contained(),  # the fire's (docs/DESIGN.md §8.6)
                )
            except OSError as exc:
                return AgentReport("failed", error_class="fatal", error=f"cannot start {self.cfg.argv[0]!r}: {exc}")
            state.finish()
        finally:
            # Temp files go even on error; the per-cycle log stays for the operator.
            for path in files:
                path.unlink(missing_ok=True)
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
        return self.finish(inv, state, Finished(proc, base, mark))


def invalid_session_report(base: dict[str, Any], what: str) -> AgentReport:
    """A resumed run whose session the CLI does not know: :meth:`CliRunner.run` rebuilds it once."""
    return AgentReport("failed", error_class="fatal", disposition=INVALID_SESSION, error=what, **base)

