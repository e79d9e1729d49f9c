"""The Codex CLI runner: ``codex exec --json -`` (fresh) and ``codex exec resume --json <id> -``.

Facts of the CLI this relies on (checked against @openai/codex 0.171, see tests/test_codex_runner.py):

- The session id cannot be chosen in advance: it is the ``thread_id`` of the first
  ``thread.started`` event, and the loop records that one (not the id it planned).
- ``turn.completed.usage`` is the thread's running total across resumes, not occupancy. The last
  request's input and ``model_context_window`` are in the session's rollout file
  (``$CODEX_HOME/sessions/**/rollout-*-<thread_id>.jsonl``, ``event_msg/token_count``), read from
  where this run started appending; a ``compacted`` record there means the CLI compacted.
- ``exec`` is read-only by default (a write fails inside the tool while the run exits 0):
  ``sandbox_mode`` (``[agent] permission_mode`` when it names a Codex mode, else
  ``workspace-write``) and ``approval_policy="never"`` are passed explicitly. On Linux the
  workspace-write sandbox (bubblewrap) refuses to run anything in a tree where a path it protects
  (``.git``, ``.codex``, ``.agents``) is a symlink; evolve's worktree has a real ``.agents/`` (the
  agent's copy, docs/DESIGN.md §8.3), which the sandbox keeps read-only, so a Codex agent's
  follow-ups come through its report. A sandbox that refuses a command mid-run ends the run as
  ``fatal`` instead of "the agent said improved but changed nothing".
- With ``[agent] base_url`` set the provider is given with ``-c`` (retries off: the fire's backoff
  decides); without it the operator's ``$CODEX_HOME/config.toml`` (or login) must say where to go,
  because without a readable config the CLI silently falls back to the public endpoint.
- An ``item.completed`` of type ``error`` is only a warning (e.g. unknown model metadata); a
  failure is ``turn.failed`` / ``error`` and a non-zero exit.

Codex has no system-prompt flag for ``exec``: the whole orientation leads the first prompt, and a
resumed run gets the resumed prompt (the dynamic block first), as with Claude.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve.agent import preflight, stream
from evolve.agent.clirun import CliRunner, Finished, invalid_session_report
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport, Usage, session_id_or_none
from evolve.config import AgentConfig

CODEX_ENV = ("CODEX_*", "OPENAI_*")
SANDBOXES = preflight.CODEX_SANDBOXES
PROVIDER = "evolve"  # the provider name evolve's -c overrides define when [agent] base_url is set
_INVALID = ("no rollout found for thread id", "thread/resume failed")
_AUTH = ("401", "403", "unauthorized", "forbidden", "incorrect api key", "invalid api key", "invalid_api_key")
_LIMIT = ("429", "too many requests", "rate limit", "usage limit", "quota")
_OVERFLOW = ("context window", "context_length_exceeded", "maximum context", "too many tokens")
_RETRY_AFTER = re.compile(r"(?:try again|retry) in ([0-9]+(?:\.[0-9]+)?)\s*s", re.I)


def toml_str(value: str) -> str:
    """A TOML basic string (``-c key=value`` parses the value as TOML)."""
    return orjson.dumps(value).decode()


@dataclass
class CodexState(stream.JsonLines):
    """``codex exec --json`` parsed as it arrives (pure: bytes in, state out)."""

    session_id: str | None = None
    turns: int = 0
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # turn.failed / error events
    warnings: list[str] = field(default_factory=list)  # item.completed of type error
    sandbox_errors: list[str] = field(default_factory=list)  # the CLI's sandbox refused a command
    total_usage: dict[str, Any] | None = None
    completed: bool = False

    def event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "thread.started" and not self.session_id:
            self.session_id = session_id_or_none(msg.get("thread_id"))
        elif kind == "item.completed" and isinstance(msg.get("item"), dict):
            self._item(msg["item"])
        elif kind == "turn.completed":
            self.completed = True
            self.total_usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else None
        elif kind == "turn.failed":
            err = msg.get("error")
            self.errors.append(str(err.get("message") if isinstance(err, dict) else err)[:500])
        elif kind == "error":
            self.errors.append(str(msg.get("message"))[:500])

    def _item(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "agent_message" and isinstance(item.get("text"), str):
            self.messages.append(item["text"])
            self.turns += 1
        elif kind == "error":
            self.warnings.append(str(item.get("message"))[:300])
        elif kind in ("command_execution", "file_change", "mcp_tool_call", "reasoning"):
            self.turns += 1
            out = item.get("aggregated_output")
            if isinstance(out, str) and ("error building bubblewrap command" in out or "cannot enforce sandbox" in out):
                self.sandbox_errors.append(out.strip()[-300:])

    def progress(self) -> dict[str, Any]:
        return {"turns": self.turns}


@dataclass(frozen=True)
class RolloutReading:
    usage: Usage
    window: int
    compactions: int


codex_home = preflight.codex_home  # where the CLI keeps its config and sessions


def rollout_file(home: Path, thread_id: str) -> Path | None:
    """The session store's file for ``thread_id`` (newest when several match)."""
    if not thread_id or "/" in thread_id or not (home / "sessions").is_dir():
        return None
    found = sorted((home / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl"))
    return found[-1] if found else None


def read_rollout(path: Path, offset: int = 0) -> RolloutReading:
    """The last request's usage and window, and compactions, from ``offset`` on (this run's part)."""
    usage, window, compactions = Usage(), 0, 0
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return RolloutReading(usage, window, compactions)
    for line in data.splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        payload = rec.get("payload") if isinstance(rec.get("payload"), dict) else {}
        if rec.get("type") == "compacted" or payload.get("type") == "context_compacted":
            compactions += 1
        if payload.get("type") != "token_count" or not isinstance(payload.get("info"), dict):
            continue
        info = payload["info"]
        last = info.get("last_token_usage") if isinstance(info.get("last_token_usage"), dict) else {}
        # cached_input_tokens is part of input_tokens in the Responses API: not added twice.
        usage = Usage.parse({k: last.get(k, 0) for k in ("input_tokens", "output_tokens")})
        w = info.get("model_context_window")
        window = w if isinstance(w, int) and not isinstance(w, bool) and w > 0 else window
    return RolloutReading(usage, window, compactions)


def classify(text: str) -> tuple[str, bool]:
    """``(error_class, context_overflow)`` of a failed run's error text (docs/DESIGN.md §5 taxonomy)."""
    t = text.lower()
    if any(w in t for w in _OVERFLOW):
        return "transient", True
    if any(w in t for w in _LIMIT):
        return "limit", False
    if any(w in t for w in _AUTH):
        return "fatal", False
    return "transient", False


class CodexRunner(CliRunner):
    name = "codex"
    api_env = CODEX_ENV

    def __init__(
        self, cfg: AgentConfig, base_env: Mapping[str, str] | None = None, *, context_window: int = 0,
        worktree: bool = False, autocompact_pct: int = 40,
    ) -> None:
        super().__init__(cfg, base_env, context_window=context_window)
        self.worktree = worktree  # the agent works in evolve's own worktree ([git] isolation = "worktree")
        self.autocompact_pct = autocompact_pct

    @property
    def sandbox(self) -> str:
        """``[agent] permission_mode`` when it is a Codex sandbox mode; otherwise one that allows edits."""
        return preflight.codex_sandbox(self.cfg.permission_mode)

    def _overrides(self) -> list[str]:
        cfg = self.cfg
        pairs = [("sandbox_mode", toml_str(self.sandbox)), ("approval_policy", toml_str("never"))]
        if cfg.model:
            pairs.append(("model", toml_str(cfg.model)))
        if self.context_window:
            # The CLI's own compaction threshold is a token count: the same share of the window as Claude's.
            pairs.append(("model_auto_compact_token_limit", str(self.context_window * self.autocompact_pct // 100)))
        if cfg.base_url:
            p = f"model_providers.{PROVIDER}"
            pairs += [
                ("model_provider", toml_str(PROVIDER)),
                (f"{p}.name", toml_str(PROVIDER)),
                (f"{p}.base_url", toml_str(cfg.base_url)),
                (f"{p}.wire_api", toml_str("responses")),
                (f"{p}.env_key", toml_str(cfg.api_key_env)),
                # The CLI retries a 5xx many times on its own; the fire's backoff is the one retry policy.
                (f"{p}.request_max_retries", "0"),
                (f"{p}.stream_max_retries", "0"),
            ]
        return [a for k, v in pairs for a in ("-c", f"{k}={v}")]

    def argv(self, inv: Invocation) -> list[str]:
        head = [*self.cfg.argv, "exec"]
        if inv.resume:
            return [*head, "resume", "--json", "--skip-git-repo-check", *self._overrides(), inv.session_id, "-"]
        return [*head, "--json", "--skip-git-repo-check", *self._overrides(), "-"]

    def env(self, inv: Invocation) -> tuple[dict[str, str], dict[str, str]]:
        changes = {
            "EVOLVE_CYCLE": str(inv.cycle),
            "EVOLVE_SESSION_ID": inv.session_id,
            "EVOLVE_MODE": inv.mode,
            "EVOLVE_REPO": str(inv.repo),
        }
        env = self.env_base((self.cfg.api_key_env,) if self.cfg.base_url else ())
        env.update(changes)
        return env, changes

    # -- the stream ------------------------------------------------------------------------

    def parser(self, inv: Invocation) -> CodexState:
        return CodexState()

    def session_file(self, inv: Invocation, session_id: str) -> Path | None:
        return rollout_file(codex_home(self.env(inv)[0]), session_id)

    def finish(self, inv: Invocation, state: CodexState, done: Finished) -> AgentReport:
        proc, base = done.proc, done.base
        text = " ".join([*state.errors, proc.output_tail if not state.errors else ""])
        if inv.resume and any(w in text.lower() for w in _INVALID):
            return invalid_session_report(base, "no rollout found for the session id")
        reading = RolloutReading(Usage(), 0, 0)
        if state.session_id:
            path = self.session_file(inv, state.session_id)
            if path is not None:
                reading = read_rollout(path, done.mark or 0)
        common: dict[str, Any] = {
            "session_id": state.session_id,
            "usage": reading.usage,
            "context_window": self.context_window or reading.window,
            "num_turns": state.turns,
            "compacted": reading.compactions > 0,
            **base,
        }
        if state.sandbox_errors:
            why = f"codex sandbox {self.sandbox} refused a command: {state.sandbox_errors[-1]}"
            return AgentReport("failed", error_class="fatal", error=why[:300], **common)
        if state.errors or proc.returncode != 0 or not state.completed:
            return self._failed(state, proc.output_tail, common)
        final = state.messages[-1] if state.messages else ""
        block = stream.report_block(final)
        if block is None:
            return AgentReport("improved", disposition="no report block", summary=final[:500], **common)
        return stream.block_report(block, common)

    @staticmethod
    def _failed(state: CodexState, tail: str, common: dict[str, Any]) -> AgentReport:
        detail = (state.errors[-1] if state.errors else tail.strip()[-300:]) or "codex exited without a turn"
        if state.session_id is None and not state.errors:
            cls = "fatal" if any(w in tail.lower() for w in _AUTH) else "crashed"
            return AgentReport("failed", error_class=cls, error=f"no thread started: {detail[:300]}", **common)
        cls, overflow = classify(detail)
        if cls == "limit":
            wait = _RETRY_AFTER.search(detail)
            detail = f"{detail} (retry_after={float(wait.group(1)):g}s)" if wait else detail
        retryable = cls == "transient" and not overflow
        return AgentReport(
            "failed", error_class=cls, error=detail[:300], context_overflow=overflow, retryable=retryable, **common
        )
