"""The command runner: any agent CLI started from an argv template, never through a shell.

``{prompt_file}``, ``{report_file}``, ``{session_id}``, ``{mode}``, ``{work_json}`` and ``{cycle}``
are substituted inside each argv element in one pass (a value is never re-expanded); the same
values are in the child env as ``EVOLVE_*``. The agent writes its JSON report to the report file,
or ends its stdout with the fenced ``evolve-report`` block the prompt describes (the report file
wins when both exist; the last block of the output otherwise). The contract: docs/AGENTS.md.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport, last_report_block, loads_report, parse_report
from evolve.childenv import agent_env
from evolve.config import AgentConfig
from evolve.procgroup import Limits, contained, run_group
from evolve.redact import Redactor
from evolve.store.atomic import write_new
from evolve.store.dirfd import ensure_dir

PLACEHOLDER = re.compile(r"\{(prompt_file|report_file|session_id|mode|work_json|cycle)\}")
# A report's texts are capped far below this (agent/report.py); the bound is on what is read at all.
REPORT_MAX_BYTES = 64 * 1024 * 1024
# The output tail searched for a fenced report block when there is no report file: a report's texts
# are capped (agent/report.py), so a block that matters fits well inside this.
STDOUT_TAIL_BYTES = 256 * 1024
# What a command agent is told on top of the report protocol: both ways of handing the report back.
COMMAND_REPORT_NOTE = """\
[Report hand-back] Write the report JSON object to the file named by $EVOLVE_REPORT_FILE, or end
your standard output with the fenced evolve-report block above. When both exist the file is used.
"""
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


# The API keys of the agent CLIs people plug in here (claude, codex, aider...); any other is listed
# in [agent] pass_env, and [agent] api_key_env is passed too.
COMMAND_ENV = ("ANTHROPIC_*", "CLAUDE_*", "OPENAI_*")


def child_env(
    base: Mapping[str, str], inv: Invocation, cfg: AgentConfig | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The child's environment (allow-listed: childenv.agent_env) and what evolve sets in it (for --dry-run)."""
    changes = {ENV_NAMES[k]: v for k, v in inv.values().items()}
    changes["EVOLVE_REPO"] = str(inv.repo)
    cfg = cfg or AgentConfig()
    names = (*COMMAND_ENV, cfg.api_key_env) if cfg.api_key_env else COMMAND_ENV
    env = agent_env(base, names, cfg.pass_env)
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
        _, changes = child_env(self.base_env, inv, self.cfg)
        return argv, changes

    def run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
        on_heartbeat: Callable[[float], None] | None = None,
    ) -> AgentReport:
        ensure_dir(inv.run_dir)  # a linked runs/ is refused: prompts must not land outside
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
        write_new(inv.prompt_file, prompt_text(inv).encode("utf-8"))
        ensure_dir(inv.report_file.parent, mode=0o700)
        inv.report_file.unlink(missing_ok=True)
        argv = substitute(self.cfg.argv, inv.values())
        env, _ = child_env(self.base_env, inv, self.cfg)
        try:
            proc = run_group(
                argv,
                cwd=inv.repo,
                env=env,
                limits=Limits(
                    timeout_s=self.cfg.timeout_s,
                    idle_timeout_s=self.cfg.idle_timeout_s,
                    heartbeat_s=self.cfg.heartbeat_s,
                    tail_bytes=STDOUT_TAIL_BYTES,
                ),
                log_path=inv.log_file,
                on_start=on_start,
                stop=stop,
                on_heartbeat=on_heartbeat,
                # Every secret evolve holds is masked, not only the ones the agent was given.
                redactor=Redactor.from_env({**self.base_env, **env}),
                sandbox=contained(),  # the fire's (docs/DESIGN.md §8.6)
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
        raw, where = read_report_file(inv.report_file), "report file"
        if raw is None:
            raw, where = stdout_report(proc.output_tail), "evolve-report block"
        if proc.returncode != 0:
            report = _parse(raw, where) if raw else None
            cls = report.error_class if report and report.error_class else "crashed"
            tail = proc.output_tail.strip().splitlines()[-1:] or [""]
            error = f"agent exited {proc.returncode}: {tail[0][:300]}"
            return AgentReport("failed", error_class=cls, error=error, **base)
        if raw is None:
            return AgentReport(
                "failed",
                error_class="crashed",
                error="agent wrote no report (no report file, no evolve-report block at the end of its output)",
                **base,
            )
        report = _parse(raw, where)
        return AgentReport(**{**report.__dict__, **base})


def prompt_text(inv: Invocation) -> str:
    """The prompt file's text: the orientation, and how a command agent hands its report back."""
    return f"{inv.prompt}\n{COMMAND_REPORT_NOTE}"


def stdout_report(output: str) -> bytes | None:
    """The last fenced ``evolve-report`` block of the agent's output, as report-file bytes; None without one."""
    block = last_report_block(output)
    return None if block is None else block.encode("utf-8", "replace")


def read_report_file(path: Path) -> bytes | None:
    """The report file's bytes; None when there is none. The agent wrote it, so it is read as untrusted:
    a regular file (a symlink to a device or a FIFO would never end), at most REPORT_MAX_BYTES (more
    is returned as not JSON rather than held in memory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        return b""  # unreadable: "not valid JSON", a crashed cycle
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        chunks, size = [], 0
        while size <= REPORT_MAX_BYTES and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
        return b"" if size > REPORT_MAX_BYTES else b"".join(chunks)
    finally:
        os.close(fd)


def _parse(raw: bytes, where: str = "report file") -> AgentReport:
    try:
        obj = loads_report(raw)
    except ValueError:
        return AgentReport("failed", error_class="crashed", error=f"{where} is not valid JSON")
    return parse_report(obj)
