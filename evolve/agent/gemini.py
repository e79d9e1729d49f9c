"""The Gemini CLI runner: ``gemini -p "" --output-format stream-json``, the prompt on stdin.

Facts of the CLI this relies on (checked against @google/gemini-cli 0.61, see tests/test_gemini_runner.py):

- A fresh run pre-assigns its session with ``--session-id <uuid>``; a resumed one uses
  ``--resume <uuid>``. Sessions are stored per project directory, so a resume only finds its
  session from the same cwd: the invocation's repo, which is evolve's worktree at a stable path.
  An unknown id exits 42 ("Error resuming session: ..."): rebuilt once as a fresh session. A run
  that failed before its first answer stored no session, so the fire's retry of it is rebuilt too.
- Headless runs refuse an untrusted folder: ``--skip-trust`` trusts the work tree for this run.
  ``--approval-mode`` is ``[agent] permission_mode`` when it names a Gemini mode, else
  ``auto_edit`` (edits allowed, shell commands not).
- A custom endpoint is ``GOOGLE_GEMINI_BASE_URL`` (``[agent] base_url``), with an API key and
  ``security.auth.selectedType = "gemini-api-key"`` in the settings; without an auth type the CLI
  exits 41 before any request, which the preflight catches before a claim.
- ``result.stats`` covers this run only, summed over its requests (not occupancy); the last
  request's input is in the session's chat file (``<home>/.gemini/tmp/<project>/chats/
  session-*-<id8>.jsonl``, ``type: gemini`` records), read from where this run started appending.
  The window is never printed: the CLI's own limit table says 1,048,576 for current models, the
  default here (``[context] context_window`` overrides it).
- The CLI compresses history itself at ``model.compressionThreshold`` (0.5 of the window by
  default); ``evolve setup`` can set it (docs/DESIGN.md §7).

Gemini has no system-prompt flag short of replacing the CLI's own: the whole orientation leads the
first prompt, and a resumed run gets the resumed prompt (the dynamic block first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve.agent import preflight, stream
from evolve.agent.clirun import CliRunner, Finished, invalid_session_report
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport, Usage, session_id_or_none

GEMINI_ENV = ("GEMINI_*", "GOOGLE_*")
APPROVAL_MODES = preflight.GEMINI_APPROVAL_MODES
DEFAULT_WINDOW = 1_048_576  # the CLI's tokenLimit for current models; it never reports one
EXIT_AUTH = 41  # "Invalid auth method selected."
EXIT_SESSION = 42  # "Error resuming session: Invalid session identifier"
_AUTH = ("api key not valid", "api_key_invalid", "unauthenticated", "permission_denied", "401", "403",
         "invalid auth method")
_LIMIT = ("429", "resource_exhausted", "resource has been exhausted", "quota", "rate limit")
_OVERFLOW = ("exceeds the maximum number of tokens", "context window", "input token count")


@dataclass
class GeminiState(stream.JsonLines):
    """``--output-format stream-json`` parsed as it arrives (pure: bytes in, state out)."""

    session_id: str | None = None
    model: str | None = None
    turns: int = 0
    answer: list[str] = field(default_factory=list)  # the assistant text since the last tool call
    result: dict[str, Any] | None = None

    def event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "init":
            self.session_id = session_id_or_none(msg.get("session_id")) or self.session_id
            self.model = msg.get("model") if isinstance(msg.get("model"), str) else None
        elif kind == "message" and msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
            if not msg.get("delta") and self.answer:
                self.answer = []
            self.answer.append(msg["content"])
        elif kind == "tool_use":
            self.turns += 1
            self.answer = []  # the final answer is what follows the last tool call
        elif kind == "result":
            self.result = msg

    @property
    def final_text(self) -> str:
        return "".join(self.answer)

    def progress(self) -> dict[str, Any]:
        return {"turns": self.turns}


gemini_home = preflight.gemini_home  # where the CLI keeps its settings and chats


def chat_file(home: Path, session_id: str) -> Path | None:
    """The session store's chat file for ``session_id`` (the CLI names it by the id's first 8 chars)."""
    if len(session_id) < 8 or "/" in session_id or not (home / "tmp").is_dir():
        return None
    for path in sorted((home / "tmp").glob(f"*/chats/session-*-{session_id[:8]}.jsonl"), reverse=True):
        try:
            with open(path, "rb") as f:
                head = orjson.loads(f.readline() or b"{}")
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(head, dict) and head.get("sessionId") == session_id:
            return path
    return None


def last_request(path: Path, offset: int = 0) -> Usage:
    """The input of the last model response recorded from ``offset`` on (this run's part of the file)."""
    usage = Usage()
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return usage
    for line in data.splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "gemini" and isinstance(rec.get("tokens"), dict):
            tokens = rec["tokens"]
            usage = Usage.parse({"input_tokens": tokens.get("input", 0), "output_tokens": tokens.get("output", 0)})
    return usage


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


settings_auth = preflight.gemini_auth


class GeminiRunner(CliRunner):
    name = "gemini"
    api_env = GEMINI_ENV

    @property
    def approval_mode(self) -> str:
        """``[agent] permission_mode`` when it is a Gemini approval mode; otherwise one that allows edits."""
        return preflight.gemini_approval_mode(self.cfg.permission_mode)

    def argv(self, inv: Invocation) -> list[str]:
        argv = [*self.cfg.argv, "-p", "", "--output-format", "stream-json", "--approval-mode", self.approval_mode,
                "--skip-trust"]
        if self.cfg.model:
            argv += ["--model", self.cfg.model]
        return argv + (["--resume", inv.session_id] if inv.resume else ["--session-id", inv.session_id])

    def env(self, inv: Invocation) -> tuple[dict[str, str], dict[str, str]]:
        changes = {
            "EVOLVE_CYCLE": str(inv.cycle),
            "EVOLVE_SESSION_ID": inv.session_id,
            "EVOLVE_MODE": inv.mode,
            "EVOLVE_REPO": str(inv.repo),
        }
        if self.cfg.base_url:
            changes["GOOGLE_GEMINI_BASE_URL"] = self.cfg.base_url
        env = self.env_base()
        env.update(changes)
        return env, changes

    # -- the stream ------------------------------------------------------------------------

    def parser(self, inv: Invocation) -> GeminiState:
        return GeminiState()

    def session_file(self, inv: Invocation, session_id: str) -> Path | None:
        return chat_file(gemini_home(self.env(inv)[0]), session_id)

    def finish(self, inv: Invocation, state: GeminiState, done: Finished) -> AgentReport:
        proc, base = done.proc, done.base
        tail = proc.output_tail
        # "Invalid session identifier", or "No previous sessions found for this project" when none was stored.
        if inv.resume and proc.returncode == EXIT_SESSION and "error resuming session" in tail.lower():
            return invalid_session_report(base, "no stored session for the id in this directory")
        sid = state.session_id or (None if inv.resume and proc.returncode else inv.session_id)
        path = self.session_file(inv, sid) if sid else None
        common: dict[str, Any] = {
            "session_id": sid,
            "usage": last_request(path, done.mark or 0) if path else Usage(),
            "context_window": self.context_window or DEFAULT_WINDOW,
            "num_turns": state.turns,
            **base,
        }
        res = state.result
        if res is None:
            cls = "fatal" if proc.returncode == EXIT_AUTH or any(w in tail.lower() for w in _AUTH) else "crashed"
            return AgentReport("failed", error_class=cls, error=f"no result event: {tail.strip()[-300:]}", **common)
        if res.get("status") != "success":
            err = res.get("error") if isinstance(res.get("error"), dict) else {}
            detail = str(err.get("message") or res.get("status") or "error")[:300]
            cls, overflow = classify(detail)
            retryable = cls == "transient" and not overflow
            return AgentReport(
                "failed", error_class=cls, error=detail, context_overflow=overflow, retryable=retryable, **common
            )
        final = state.final_text
        block = stream.report_block(final)
        if block is None:
            return AgentReport("improved", disposition="no report block", summary=final[:500], **common)
        return stream.block_report(block, common)
