"""A scripted OpenAI-compatible chat-completions server for the HTTP runner's tests.

Responses are served from a queue in order (status, headers, JSON or raw body, optional delay);
every request received is recorded (path, headers, parsed JSON body). An empty queue answers 500.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


@dataclass
class Scripted:
    status: int = 200
    body: Any = None  # dict/list → JSON; bytes/str → sent as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    def roles(self) -> list[str]:
        return [m["role"] for m in self.messages]

    def history(self) -> list[dict[str, Any]]:
        """The non-system part of the request."""
        return [m for m in self.messages if m["role"] != "system"]


def completion(content: str, prompt_tokens: int = 100, completion_tokens: int = 20) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class FakeOpenAI:
    def __init__(self) -> None:
        self.script: queue.Queue[Scripted] = queue.Queue()
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._closed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    body = raw
                with server._lock:
                    server.requests.append(Received(self.path, dict(self.headers.items()), body))
                try:
                    step = server.script.get_nowait()
                except queue.Empty:
                    step = Scripted(500, {"error": {"message": "no scripted response left"}})
                if step.delay:
                    time.sleep(step.delay)
                data = step.body
                if isinstance(data, str):
                    data = data.encode()
                elif not isinstance(data, bytes):
                    data = orjson.dumps(data)
                try:
                    self.send_response(step.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in step.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout / interrupt tests)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def push(self, *steps: Scripted) -> None:
        for s in steps:
            self.script.put(s)

    def reply(self, content: str, **usage: int) -> None:
        self.push(Scripted(200, completion(content, **usage)))

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
