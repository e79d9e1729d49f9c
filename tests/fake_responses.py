"""A scripted OpenAI Responses API server on 127.0.0.1 for driving the real Codex CLI.

Each ``POST .../responses`` takes the next scripted turn and answers with the streaming SSE the
CLI reads (``response.created``, ``response.output_item.done`` per item, ``response.completed``
with the request's usage); every request body is recorded so tests assert on what the CLI sent
(instructions, prior turns on ``codex exec resume``, none when fresh).

A turn is a dict: ``{"text": ...}``, ``{"shell": "printf hi > f"}`` (an ``exec_command`` call the
CLI runs with its own tool), ``{"status": 429|500, "error": {...}}``, ``{"hang": seconds}``,
with optional ``"usage": {"input_tokens": N, "output_tokens": M}``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar

from fake_server import ScriptedHandler, ScriptedServer

DEFAULT_USAGE = {"input_tokens": 1200, "output_tokens": 40}


class ResponsesHandler(ScriptedHandler):
    get_answer: ClassVar[dict[str, Any]] = {"object": "list", "data": [], "models": []}

    def post(self, fake: Any, body: dict[str, Any]) -> None:
        if not self.path.rstrip("/").endswith("/responses"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        turn = fake._next(body)
        if turn.get("hang"):
            time.sleep(float(turn["hang"]))
        if turn.get("status"):
            err = turn.get("error") or {"type": "server_error", "message": "scripted error"}
            self._json(int(turn["status"]), {"error": err}, turn.get("headers"))
            return
        try:
            self._stream(body, turn)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a hang it was killed for): nothing to answer

    def _stream(self, body: dict[str, Any], turn: dict[str, Any]) -> None:
        rid = f"resp_{uuid.uuid4().hex[:12]}"
        usage = {**DEFAULT_USAGE, **turn.get("usage", {})}
        usage = {**usage, "total_tokens": usage["input_tokens"] + usage["output_tokens"],
                 "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        base = {"id": rid, "object": "response", "model": body.get("model", "m"), "output": []}
        self._event({"type": "response.created", "response": {**base, "status": "in_progress"}})
        items = list(_items(turn))
        for i, item in enumerate(items):
            self._event({"type": "response.output_item.added", "output_index": i, "item": item})
            self._event({"type": "response.output_item.done", "output_index": i, "item": item})
        done = {**base, "status": "completed", "output": items, "usage": usage}
        self._event({"type": "response.completed", "response": done})
        self.wfile.flush()
        self.close_connection = True

    def _event(self, data: dict[str, Any]) -> None:
        self.wfile.write(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode())


class FakeResponses(ScriptedServer):
    handler = ResponsesHandler
    url_path = "/v1"


def _items(turn: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if turn.get("text"):
        out.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:12]}", "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": turn["text"], "annotations": []}]})
    if turn.get("shell"):
        # The CLI's own shell tool (``exec_command``, argument ``cmd``), as 0.171 offers it.
        out.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:12]}", "call_id":
                    f"call_{uuid.uuid4().hex[:12]}", "name": "exec_command",
                    "arguments": json.dumps({"cmd": turn["shell"]})})
    return out


def input_texts(body: dict[str, Any]) -> list[str]:
    """Every text in the request's ``input`` items (user and assistant turns, tool outputs)."""
    out: list[str] = []
    for item in body.get("input") or []:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)]
        for key in ("output", "arguments"):
            if isinstance(item.get(key), str):
                out.append(item[key])
    return out


def roles(body: dict[str, Any]) -> list[str]:
    return [str(i.get("role") or i.get("type")) for i in body.get("input") or [] if isinstance(i, dict)]
