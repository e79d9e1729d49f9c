"""The HTTP runner: an OpenAI-compatible chat-completions server (llama.cpp, vLLM, Ollama, ...).

evolve owns the conversation (docs/DESIGN.md §5.1, §5.4: the local-provider path). Each session's history
lives in ``sessions/<session_id>.json``: the non-pinned messages plus the boundaries (the history
index at the start of each cycle). Every call sends, in order:

1. the pinned system messages — the static orientation (identity, report protocol, remembered
   facts) and the dynamic one (cycle brief, work item, events) — never trimmed;
2. the history, trimmed oldest-first to ``agent.message_budget_chars`` after subtracting the
   pinned size once, never starting with an orphaned assistant or tool message;
3. a user message: the task plus the answer format.

A First call (``inv.resume`` false, which is also how a stale return arrives: a new session id)
sends no history. The model answers with a unified diff in a ```diff block, which evolve applies
with ``git apply`` (checked first; a rejected diff leaves the tree as it was and fails the cycle),
and a final ```evolve-report block. The API key is sent as a bearer token and written nowhere.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from evolve import __version__, redact
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport, Usage, loads_report, parse_report
from evolve.config import AgentConfig
from evolve.git import patch
from evolve.procgroup import capped, progressed
from evolve.results import SUCCESS
from evolve.store.atomic import write_json, write_new
from evolve.store.dirfd import ensure_dir
from evolve.timeutil import utc_iso
from evolve.work.item import clean_text

Message = dict[str, Any]

ANSWER_FORMAT = """\
[Answer format]
You have no tools in this conversation: you cannot run commands or open files. evolve applies your
answer for you:
1. Put every change in ONE unified diff (git style, paths relative to the repository root with a/
   and b/ prefixes; --- /dev/null for a new file) in a fenced block tagged diff:
```diff
--- a/path/to/file
+++ b/path/to/file
@@ -1,2 +1,2 @@
 unchanged line
-old line
+new line
```
   evolve runs `git apply` on it; a diff that does not apply cleanly fails the cycle and changes
   nothing. Never touch .agents/ or .git/. Leave the block out when no change is needed.
2. End with the fenced evolve-report block described in the report protocol.
"""

MAX_BODY = 32 << 20  # a reply larger than this is malformed
POLL_S = 0.05
_REPORT_BLOCK = re.compile(r"^```evolve-report[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_DIFF_BLOCK = re.compile(r"^```(?:diff|patch)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_ANY_BLOCK = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_OVERFLOW = re.compile(
    r"context length|context_length_exceeded|maximum context|context window|too many tokens|prompt is too long"
    r"|exceeds? the (?:available )?context",
    re.IGNORECASE,
)


# -- trimming (pure) ----------------------------------------------------------------------------


def msg_chars(m: Message) -> int:
    """A message's size for the budget: its text (structured content counted as its JSON)."""
    content = m.get("content")
    if isinstance(content, str):
        n = len(content)
    elif content is None:
        n = 0
    else:
        n = len(orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS, default=str))
    calls = m.get("tool_calls")
    if calls:
        n += len(orjson.dumps(calls, option=orjson.OPT_NON_STR_KEYS, default=str))
    return n


def total_chars(messages: Sequence[Message]) -> int:
    return sum(msg_chars(m) for m in messages)


def trim_history(history: Sequence[Message], limit: int) -> list[Message]:
    """The longest suffix of ``history`` that starts with a user message and fits ``limit``.

    Oldest first: drop the head while over the limit, then drop until a user message leads (an
    assistant or tool reply without its question is never sent). Everything from the newest user
    message on is always kept, even over the limit; without any user message nothing is sent.
    """
    last_user = max((i for i, m in enumerate(history) if m.get("role") == "user"), default=None)
    if last_user is None:
        return []
    sizes = [msg_chars(m) for m in history]
    size = sum(sizes)
    start = 0
    while start < last_user and (size > limit or history[start].get("role") != "user"):
        size -= sizes[start]
        start += 1
    return list(history[start:])


def assemble(pinned: Sequence[Message], history: Sequence[Message], budget: int) -> list[Message]:
    """Pinned system messages (never trimmed) + history trimmed to what the budget leaves of them.

    The pinned size is subtracted from the budget exactly once.
    """
    limit = max(0, budget - total_chars(pinned))
    return [*pinned, *trim_history(history, limit)]


# -- reply parsing (pure) ------------------------------------------------------------------------


def last_block(pattern: re.Pattern[str], text: str) -> str | None:
    blocks = pattern.findall(text)
    return blocks[-1] if blocks else None


def prose(text: str, limit: int = 1000) -> str:
    """The reply without its fenced blocks, as one line (a summary when the report gives none)."""
    return clean_text(_ANY_BLOCK.sub(" ", text), limit)


def report_from_reply(content: str) -> AgentReport:
    """The agent's own word: the LAST evolve-report block; missing or unusable → ``improved``, the gate decides."""
    block = last_block(_REPORT_BLOCK, content)
    if block is None:
        return AgentReport("improved", disposition="no report block", summary=prose(content))
    try:
        obj = loads_report(block)
    except ValueError:
        return AgentReport("improved", disposition="invalid report block: not JSON", summary=prose(content))
    report = parse_report(obj)
    if report.result == "failed" and isinstance(obj, dict) and obj.get("result") != "failed":
        return AgentReport("improved", disposition=f"invalid report block: {report.error}", summary=prose(content))
    if not report.summary:
        report = replace(report, summary=prose(content))
    return report


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        secs = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, secs) if math.isfinite(secs) else None


# -- the session file ----------------------------------------------------------------------------


def session_path(sessions_dir: Path, session_id: str) -> Path:
    """``<id>.json`` for a filename-safe id; anything else is hashed (an id never picks the path)."""
    name = session_id if _SAFE_ID.fullmatch(session_id) else hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return sessions_dir / f"{name}.json"


@dataclass
class SessionFile:
    session_id: str
    messages: list[Message]
    boundaries: list[int]
    rebuilt: bool = False
    created_at: str = ""
    last_apply_error: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "created_at": self.created_at,
            "updated_at": utc_iso(),
            "rebuilt": self.rebuilt,
            "boundaries": self.boundaries,
            "messages": self.messages,
            "last_apply_error": self.last_apply_error,
        }


def _valid_message(m: object) -> bool:
    return isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool") and "content" in m


def load_session(path: Path, session_id: str) -> SessionFile | None:
    """The stored history, or None when the file is missing or unusable."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        return None
    messages = [m for m in obj["messages"] if _valid_message(m)]
    bounds = obj.get("boundaries")
    boundaries = sorted(
        {b for b in bounds if isinstance(b, int) and not isinstance(b, bool) and 0 <= b < len(messages)}
        if isinstance(bounds, list)
        else set()
    )
    return SessionFile(
        session_id=session_id,
        messages=messages,
        boundaries=boundaries,
        rebuilt=obj.get("rebuilt") is True,
        created_at=str(obj.get("created_at") or ""),
        last_apply_error=str(obj.get("last_apply_error") or ""),
    )


# -- the runner ----------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the bearer token to wherever it points: treat it as an error."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[override]
        return None


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


class HttpRunner:
    name = "http"

    def __init__(
        self,
        cfg: AgentConfig,
        base_env: Mapping[str, str] | None,
        sessions_dir: Path,
        *,
        context_window: int = 0,
    ) -> None:
        self.cfg = cfg
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.sessions_dir = Path(sessions_dir)
        self.context_window = context_window

    # -- what would be sent --------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.cfg.base_url.rstrip("/") + "/chat/completions"

    def plan(self, inv: Invocation) -> tuple[list[str], dict[str, str]]:
        return ["POST", self.url], {}

    def _key(self) -> str:
        return self.base_env.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""

    def _redact(self, text: str) -> str:
        key = self._key()  # the configured key, whatever its variable is called; then everything else
        return redact.current().text(text.replace(key, "[redacted]") if key else text)

    def user_message(self, inv: Invocation, note: str = "") -> Message:
        text = f"{inv.orientation.task.rstrip()}\n\n{ANSWER_FORMAT}"
        if note:
            text = f"[Previous answer] {note}\n\n{text}"
        return {"role": "user", "content": text}

    def messages(self, inv: Invocation, session: SessionFile | None) -> tuple[list[Message], list[Message]]:
        """``(sent, history)``: the request's messages, and the history part of them (trimmed)."""
        pinned = [
            {"role": "system", "content": inv.orientation.static},
            {"role": "system", "content": inv.orientation.dynamic},
        ]
        prior = session.messages if session else []
        note = session.last_apply_error if session else ""
        sent = assemble(pinned, [*prior, self.user_message(inv, note)], self.cfg.message_budget_chars)
        return sent, sent[len(pinned) :]

    # -- the run -------------------------------------------------------------------------------

    def run(
        self,
        inv: Invocation,
        *,
        on_start: Callable[[int], None] | None = None,  # no child process: never called
        stop: threading.Event | None = None,
        on_heartbeat: Callable[..., None] | None = None,
    ) -> AgentReport:
        started = time.monotonic()
        path = session_path(self.sessions_dir, inv.session_id)
        session: SessionFile | None = None
        rebuilt = False
        if inv.resume:
            session = load_session(path, inv.session_id)
            rebuilt = session is None  # missing or unusable: start fresh, and say so in the file
        sent, history = self.messages(inv, session)

        def failed(error_class: str, error: str, **kw: Any) -> AgentReport:
            return AgentReport(
                "failed",
                session_id=inv.session_id,
                error_class=error_class,
                error=self._redact(error)[:500],
                duration_s=round(time.monotonic() - started, 3),
                **kw,
            )

        if not self.cfg.base_url.startswith(("http://", "https://")):
            return failed("fatal", f"agent.base_url must be an http(s) URL, got {self.cfg.base_url[:100]!r}")
        body = orjson.dumps({"model": self.cfg.model, "messages": sent, "stream": False})
        outcome = self._call(body, started, stop, on_heartbeat)
        if isinstance(outcome, AgentReport):
            return replace(
                outcome,
                session_id=inv.session_id,
                error=self._redact(outcome.error)[:500],
                duration_s=round(time.monotonic() - started, 3),
            )
        if outcome.status != 200:
            return self._http_error(outcome, failed)
        parsed = _parse_completion(outcome.body)
        if isinstance(parsed, str):
            return failed("transient", f"malformed response from {self.url}: {parsed}", retryable=True)
        content, usage = parsed

        # The reply belongs to the session whatever happens to its diff.
        boundary = len(history) - 1
        prior_bounds = session.boundaries if session else []
        dropped = (len(session.messages) if session else 0) - (len(history) - 1)
        stored = SessionFile(
            session_id=inv.session_id,
            messages=[*history, {"role": "assistant", "content": content}],
            boundaries=[b - dropped for b in prior_bounds if b - dropped >= 0 and b - dropped < boundary] + [boundary],
            rebuilt=rebuilt or (session.rebuilt if session else False),
            created_at=(session.created_at if session and session.created_at else utc_iso()),
        )

        report = report_from_reply(content)
        extra: dict[str, Any] = {
            "session_id": inv.session_id,
            "usage": usage,
            "num_turns": 1,
            "cost_usd": 0.0,
            "duration_s": round(time.monotonic() - started, 3),
        }
        if self.context_window > 0:
            extra["context_window"] = self.context_window
        report = replace(report, **extra)
        diff = last_block(_DIFF_BLOCK, content)
        if diff is not None and report.result in SUCCESS:
            error = self._apply(inv, diff)
            if error:
                stored.last_apply_error = f"your diff was not applied ({error}); the working tree is unchanged."
                report = replace(
                    report,
                    result="failed",
                    error_class="transient",
                    error=self._redact(f"diff rejected by git apply: {error}")[:500],
                    retryable=False,
                )
        self._save(path, stored)
        return report

    def _save(self, path: Path, stored: SessionFile) -> None:
        try:
            # The sink: the conversation lives under .agents/ and quotes whatever the model or a tool saw.
            write_json(path, redact.current().json(stored.as_json()))
        except OSError:
            pass  # losing the history only makes the next call start fresh (rebuilt: true)

    # -- HTTP ----------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"evolve/{__version__}",
        }
        key = self._key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _call(
        self,
        body: bytes,
        started: float,
        stop: threading.Event | None,
        on_heartbeat: Callable[..., None] | None,
    ) -> _Response | AgentReport:
        """POST in a worker thread; the caller polls ``stop``, the timeout and the heartbeat."""
        timeout = self.cfg.timeout_s or None
        # Within the fire's remaining max_minutes too (procgroup.capped; 0 = no fire), as every child is.
        budget = capped(0)
        deadline = min(started + timeout if timeout else math.inf, time.monotonic() + budget if budget else math.inf)
        if stop is not None and stop.is_set():
            return AgentReport("failed", error_class="interrupted", error="interrupted")
        req = urllib.request.Request(self.url, data=body, headers=self._headers(), method="POST")
        opener = urllib.request.build_opener(_NoRedirect())
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                with opener.open(req, timeout=timeout) as resp:
                    box["resp"] = _Response(resp.status, dict(resp.headers.items()), resp.read(MAX_BODY + 1))
            except urllib.error.HTTPError as exc:
                try:
                    data = exc.read(4096)
                except Exception:
                    data = b""
                with contextlib.suppress(Exception):
                    exc.close()
                box["resp"] = _Response(exc.code, dict(exc.headers.items()) if exc.headers else {}, data)
            except BaseException as exc:
                box["exc"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=work, name="evolve-http-agent", daemon=True)
        worker.start()
        beat = self.cfg.heartbeat_s
        next_beat = started + beat
        while not done.wait(POLL_S):
            now = time.monotonic()
            if stop is not None and stop.is_set():
                return AgentReport("failed", error_class="interrupted", error="interrupted")
            if now >= deadline:
                limit = round(deadline - started, 1)
                return AgentReport("failed", error_class="timeout", error=f"no response within {limit:g}s")
            if now >= next_beat:
                progressed()  # waiting on a bounded request: the daemon's watchdog may ping on
                if on_heartbeat is not None:
                    on_heartbeat(now - started)
                next_beat = now + beat
        if "resp" in box:
            return box["resp"]
        exc = box.get("exc")
        if isinstance(exc, TimeoutError) or (
            isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, TimeoutError)
        ):
            return AgentReport("failed", error_class="timeout", error=f"no response within {timeout or 0:g}s")
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return AgentReport(
            "failed",
            error_class="transient",
            error=f"cannot reach {self.url}: {type(reason).__name__}: {reason}",
            retryable=True,
        )

    def _http_error(self, resp: _Response, failed: Callable[..., AgentReport]) -> AgentReport:
        status = resp.status
        detail = clean_text(resp.body.decode("utf-8", "replace"), 300)
        what = f"HTTP {status} from {self.url}" + (f": {detail}" if detail else "")
        if status == 429:
            wait = retry_after_s(_header(resp.headers, "Retry-After"))
            tail = f" (retry_after={wait:g}s)" if wait is not None else ""
            return failed("limit", f"rate limited: {what}{tail}")
        if status >= 500:
            return failed("transient", what, retryable=True)
        if status in (401, 403):
            return failed("fatal", f"not authorised: {what}")
        if status in (400, 413) and _OVERFLOW.search(detail):
            return failed("transient", f"context overflow: {what}", context_overflow=True)
        if status in (408, 409, 425):
            return failed("transient", what, retryable=True)
        return failed("fatal", what)  # 3xx (redirects are refused), 404 model/url, 400 bad request

    # -- the diff ------------------------------------------------------------------------------

    def _apply(self, inv: Invocation, diff: str) -> str:
        """Apply the diff in the repo (:func:`evolve.git.patch.apply`); returns the error or ""."""
        if not diff.strip():
            return "empty diff block"
        if not diff.endswith("\n"):
            diff += "\n"
        # Absolute for git, made so lexically: resolving would follow a link planted as runs/.
        path = ensure_dir(Path(os.path.abspath(inv.run_dir))) / f"cycle-{inv.cycle}.diff"
        write_new(path, diff.encode("utf-8"))
        return clean_text(patch.apply(inv.repo, path, diff), 300)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    low = name.lower()
    return next((v for k, v in headers.items() if k.lower() == low), None)


def _parse_completion(body: bytes) -> tuple[str, Usage] | str:
    """``(content, usage)`` from a chat-completions body, or why it is malformed."""
    if len(body) > MAX_BODY:
        return "body too large"
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "body is not JSON"
    if not isinstance(obj, dict):
        return "body is not a JSON object"
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no choices"
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        return "choices[0].message.content is not a string"
    raw = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    usage = Usage.parse({"input_tokens": raw.get("prompt_tokens", 0), "output_tokens": raw.get("completion_tokens", 0)})
    return content, usage
