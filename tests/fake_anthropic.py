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
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_USAGE = {"input_tokens": 1200, "output_tokens": 40, "cache_read_input_tokens": 0,
                 "cache_creation_input_tokens": 0}


def report_text(result: str = "improved", **fields: Any) -> str:
    """A final answer ending with the evolve-report block."""
    body = json.dumps({"result": result, "summary": fields.pop("summary", "done"), **fields})
    return f"All done.\n\n```evolve-report\n{body}\n```\n"


class FakeAnthropic:
    def __init__(self, turns: list[dict[str, Any]] | None = None) -> None:
        self.turns: list[dict[str, Any]] = list(turns or [])
        self.requests: list[dict[str, Any]] = []
        self.agent_requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeAnthropic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, *turns: dict[str, Any]) -> None:
        with self.lock:
            self.turns.extend(turns)

    def env(self) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": "sk-ant-dummy-test-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",
        }

    def _next(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.agent_requests.append(body)
            if self.turns:
                return self.turns.pop(0)
        return {"text": report_text("unchanged", summary="script exhausted")}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with fake.lock:
                    fake.requests.append({"method": "GET", "path": self.path})
                self._json(200, {"data": []})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                with fake.lock:
                    fake.requests.append({"method": "POST", "path": self.path, "body": body,
                                          "headers": {k.lower(): v for k, v in self.headers.items()}})
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

        return Handler


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
