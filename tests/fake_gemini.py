"""A scripted Gemini API server on 127.0.0.1 for driving the real Gemini CLI.

Each ``POST /v1beta/models/<model>:streamGenerateContent?alt=sse`` that carries tools (the agent's
own turns) takes the next scripted turn and answers with SSE chunks (``candidates`` with
``text`` or ``functionCall`` parts, ``usageMetadata``); other requests (``countTokens``, side
queries without tools) get short answers. Every request is recorded so tests assert on what the
CLI sent (the system instruction, prior turns on ``--resume``, none when fresh).

A turn is a dict: ``{"text": ...}``, ``{"call": {"name": "write_file", "args": {...}}}``,
``{"status": 429|500|400, "error": {...}}``, ``{"hang": seconds}``, with optional
``"usage": {"promptTokenCount": N, "candidatesTokenCount": M}``.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

from fake_server import ScriptedHandler, ScriptedServer

DEFAULT_USAGE = {"promptTokenCount": 1200, "candidatesTokenCount": 40}


class GeminiHandler(ScriptedHandler):
    get_answer: ClassVar[dict[str, Any]] = {"models": []}

    def post(self, fake: Any, body: dict[str, Any]) -> None:
        if ":countTokens" in self.path:
            self._json(200, {"totalTokens": 10})
            return
        agent = bool(body.get("tools")) and ":streamGenerateContent" in self.path
        turn = fake._next(body) if agent else {"text": '{"reasoning": "done", "next_speaker": "user"}'}
        if turn.get("hang"):
            time.sleep(float(turn["hang"]))
        if turn.get("status"):
            status = int(turn["status"])
            err = {"code": status, "message": "scripted error", "status": "INTERNAL", **turn.get("error", {})}
            self._json(status, {"error": err}, turn.get("headers"))
            return
        chunk = _chunk(turn, body)
        if ":streamGenerateContent" not in self.path:
            self._json(200, chunk)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        self.wfile.flush()
        self.close_connection = True


class FakeGemini(ScriptedServer):
    handler = GeminiHandler

    def env(self) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": self.url, "GEMINI_API_KEY": "gm-dummy-test-key"}


def _chunk(turn: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if turn.get("text"):
        parts.append({"text": turn["text"]})
    if turn.get("call"):
        parts.append({"functionCall": turn["call"]})
    usage = {**DEFAULT_USAGE, **turn.get("usage", {})}
    usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"]
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage,
        "modelVersion": "gemini-test",
    }


def texts(body: dict[str, Any]) -> list[str]:
    """Every text the request's ``contents`` carry (user and model turns, function calls and results)."""
    out: list[str] = []
    for content in body.get("contents") or []:
        for part in content.get("parts") or [] if isinstance(content, dict) else []:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str):
                out.append(part["text"])
            for key in ("functionCall", "functionResponse"):
                if isinstance(part.get(key), dict):
                    out.append(json.dumps(part[key]))
    return out


def system_text(body: dict[str, Any]) -> str:
    si = body.get("systemInstruction") or {}
    parts = si.get("parts") if isinstance(si, dict) else None
    return "\n".join(p.get("text", "") for p in parts or [] if isinstance(p, dict))
