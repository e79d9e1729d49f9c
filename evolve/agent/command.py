"""The command runner: any agent CLI started from an argv template, never through a shell.

``{prompt_file}``, ``{report_file}``, ``{session_id}``, ``{mode}``, ``{work_json}`` and ``{cycle}``
are substituted inside each argv element in one pass (a value is never re-expanded); the same
values are in the child env as ``EVOLVE_*``. The agent writes its JSON report to the report file.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping

import orjson

from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport, parse_report
from evolve.config import AgentConfig
from evolve.procgroup import Limits, run_group
from evolve.redact import Redactor
from evolve.store.atomic import write_new

PLACEHOLDER = re.compile(r"\{(prompt_file|report_file|session_id|mode|work_json|cycle)\}")
ENV_NAMES = {
    "prompt_file": "EVOLVE_PROMPT_FILE",
    "report_file": "EVOLVE_REPORT_FILE",
    "session_id": "EVOLVE_SESSION_ID",
    "mode": "EVOLVE_MODE",
    "work_json": "EVOLVE_WORK_JSON",
    "cycle": "EVOLVE_CYCLE",
}


def substitute(template: list[str], values: Mapping[str, str]) -> list[str]:
    """Per-element, single-pass placeholder substitution."""
    return [PLACEHOLDER.sub(lambda m: values[m.group(1)], part) for part in template]


def child_env(base: Mapping[str, str], inv: Invocation) -> tuple[dict[str, str], dict[str, str]]:
    """The child's environment and the changes made to ``base`` (for --dry-run)."""
    changes = {ENV_NAMES[k]: v for k, v in inv.values().items()}
    changes["EVOLVE_REPO"] = str(inv.repo)
    env = dict(base)
    env.pop("CLAUDECODE", None)
    env.update(changes)
    return env, changes


class CommandRunner:
    name = "command"

    def __init__(self, cfg: AgentConfig, base_env: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.base_env = dict(os.environ if base_env is None else base_env)

    def plan(self, inv: Invocation) -> tuple[list[str], dict[str, str]]:
        argv = substitute(self.cfg.argv, inv.values())
        _, changes = child_env(self.base_env, inv)
        return argv, changes

    def run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
        on_heartbeat: Callable[[float], None] | None = None,
    ) -> AgentReport:
        inv.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            return self._run(inv, on_start=on_start, stop=stop, on_heartbeat=on_heartbeat)
        finally:
            # The prompt and the agent's report are exchange files, not records: the ledger and the
            # (redacted) run log keep what matters, so nothing secret lingers in .agents/.
            inv.prompt_file.unlink(missing_ok=True)
            inv.report_file.unlink(missing_ok=True)

    def _run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None,
        stop: threading.Event | None,
        on_heartbeat: Callable[[float], None] | None,
    ) -> AgentReport:
        write_new(inv.prompt_file, inv.prompt.encode("utf-8"))
        inv.report_file.unlink(missing_ok=True)
        argv = substitute(self.cfg.argv, inv.values())
        env, _ = child_env(self.base_env, inv)
        try:
            proc = run_group(
                argv,
                cwd=inv.repo,
                env=env,
                limits=Limits(
                    timeout_s=self.cfg.timeout_s,
                    idle_timeout_s=self.cfg.idle_timeout_s,
                    heartbeat_s=self.cfg.heartbeat_s,
                ),
                log_path=inv.log_file,
                on_start=on_start,
                stop=stop,
                on_heartbeat=on_heartbeat,
                redactor=Redactor.from_env(env),
            )
        except OSError as exc:
            return AgentReport("failed", error_class="fatal", error=f"cannot start agent {argv[0]!r}: {exc}")
        base = {"duration_s": round(proc.duration_s, 3), "exit_code": proc.returncode}
        if proc.interrupted:
            return AgentReport("failed", error_class="interrupted", error="interrupted", **base)
        if proc.timed_out:
            return AgentReport(
                "failed", error_class="timeout", error=f"agent {proc.timed_out} timeout; process group killed", **base
            )
        try:
            raw = inv.report_file.read_bytes()
        except FileNotFoundError:
            raw = None
        if proc.returncode != 0:
            report = _parse(raw) if raw else None
            cls = report.error_class if report and report.error_class else "crashed"
            tail = proc.output_tail.strip().splitlines()[-1:] or [""]
            error = f"agent exited {proc.returncode}: {tail[0][:300]}"
            return AgentReport("failed", error_class=cls, error=error, **base)
        if raw is None:
            return AgentReport("failed", error_class="crashed", error="agent wrote no report", **base)
        report = _parse(raw)
        return AgentReport(**{**report.__dict__, **base})


def _parse(raw: bytes) -> AgentReport:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return AgentReport("failed", error_class="crashed", error="report file is not valid JSON")
    return parse_report(obj)
