"""A scripted Anthropic-Messages-compatible server on 127.0.0.1 for driving the real Claude Code CLI.

Each POST to ``/v1/messages`` that carries tools (the agent's own turns) takes the next scripted
turn; other requests (side queries the CLI makes) get a short text answer. Every request body is
recorded so tests can assert on what the CLI sent (system prompt, prior turns on ``--resume``).

A turn is a dict: ``{"text": ...}``, ``{"tool": {"name": "Write", "input": {...}}}``,
``{"status": 429, "headers": {"retry-after": "1"}, "error": {"type": ..., "message": ...}}``,
``{"hang": seconds}``, with optional ``"usage": {...}``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

from fake_server import ScriptedHandler, ScriptedServer

DEFAULT_USAGE = {"input_tokens": 1200, "output_tokens": 40, "cache_read_input_tokens": 0,
                 "cache_creation_input_tokens": 0}


def report_text(result: str = "improved", **fields: Any) -> str:
    """A final answer ending with the evolve-report block."""
    body = json.dumps({"result": result, "summary": fields.pop("summary", "done"), **fields})
    return f"All done.\n\n```evolve-report\n{body}\n```\n"


class AnthropicHandler(ScriptedHandler):
    get_answer: ClassVar[dict[str, Any]] = {"data": []}

    def post(self, fake: Any, body: dict[str, Any]) -> None:
        if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
            self._json(200, {"input_tokens": 10})
            return
        turn = fake._next(body) if body.get("tools") else {"text": "ok"}
        if turn.get("hang"):
            time.sleep(float(turn["hang"]))
        if turn.get("status"):
            err = turn.get("error") or {"type": "api_error", "message": "scripted error"}
            self._json(int(turn["status"]), {"type": "error", "error": err}, turn.get("headers"))
            return
        self._stream(body, turn)

    def _stream(self, body: dict[str, Any], turn: dict[str, Any]) -> None:
        usage = {**DEFAULT_USAGE, **turn.get("usage", {})}
        blocks = list(_blocks(turn))
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        msg = {"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant",
               "model": body.get("model", "claude"), "content": [], "stop_reason": None,
               "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            msg.update(content=blocks, stop_reason=stop)
            self._json(200, msg)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self._event("message_start", {"type": "message_start", "message": msg})
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                self._event("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": {"type": "text", "text": ""}})
                self._event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                    "delta": {"type": "text_delta", "text": b["text"]}})
            else:
                start = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
                self._event("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": start})
                self._event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(b["input"])}})
            self._event("content_block_stop", {"type": "content_block_stop", "index": i})
        self._event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": stop, "stop_sequence": None},
                                       "usage": {"output_tokens": usage["output_tokens"]}})
        self._event("message_stop", {"type": "message_stop"})
        self.wfile.flush()
        self.close_connection = True

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())


class FakeAnthropic(ScriptedServer):
    handler = AnthropicHandler
    EXHAUSTED: ClassVar[dict[str, Any]] = {"text": report_text("unchanged", summary="script exhausted")}

    def env(self) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": "sk-ant-dummy-test-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",
        }


def _blocks(turn: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if turn.get("text"):
        yield {"type": "text", "text": turn["text"]}
    tool = turn.get("tool")
    if tool:
        yield {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:16]}", "name": tool["name"],
               "input": tool["input"]}


def user_texts(body: dict[str, Any]) -> list[str]:
    """Every text the request carries in its messages (to check what a resumed call sent)."""
    out = []
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            for c in content:
                if isinstance(c, dict):
                    if isinstance(c.get("text"), str):
                        out.append(c["text"])
                    if isinstance(c.get("content"), str):
                        out.append(c["content"])
                    if isinstance(c.get("input"), dict):
                        out.append(json.dumps(c["input"]))
    return out


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(b.get("text", "") for b in system if isinstance(b, dict))
    return ""
