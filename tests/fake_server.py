"""The shared part of the scripted model servers on 127.0.0.1 that drive the real agent CLIs.

A fake (``fake_anthropic``, ``fake_responses``, ``fake_gemini``) is a :class:`ScriptedServer` whose
handler subclasses :class:`ScriptedHandler` and answers a POST in :meth:`ScriptedHandler.post`, in
its API's own wire format. Here: the threaded server, the script of turns (``add``; an agent turn
takes the next one, or ``EXHAUSTED``), and every request recorded (``requests``: method, path,
lower-cased headers, body) with the bodies that took a turn in ``agent_requests``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    get_answer: ClassVar[dict[str, Any]] = {"data": []}  # what a GET (a model list) is told

    @property
    def fake(self) -> ScriptedServer:
        return self.server.fake  # type: ignore[attr-defined]

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

    def _record(self, method: str, body: Any = None) -> None:
        entry = {"method": method, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
        with self.fake.lock:
            self.fake.requests.append(entry if body is None else {**entry, "body": body})

    def do_GET(self) -> None:
        self._record("GET")
        self._json(200, self.get_answer)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        self._record("POST", body)
        self.post(self.fake, body)

    def post(self, fake: Any, body: dict[str, Any]) -> None:
        raise NotImplementedError


class ScriptedServer:
    handler: ClassVar[type[ScriptedHandler]] = ScriptedHandler
    url_path: ClassVar[str] = ""  # what the CLI's base URL adds to host:port
    EXHAUSTED: ClassVar[dict[str, Any]] = {"text": "script exhausted"}

    def __init__(self, turns: list[dict[str, Any]] | None = None) -> None:
        self.turns: list[dict[str, Any]] = list(turns or [])
        self.requests: list[dict[str, Any]] = []  # every request: method, path, headers (and a POST's body)
        self.agent_requests: list[dict[str, Any]] = []  # the bodies that took a scripted turn
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.server.fake = self  # type: ignore[attr-defined]  # how a handler finds its script
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{self.url_path}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, *turns: dict[str, Any]) -> None:
        with self.lock:
            self.turns.extend(turns)

    def _next(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.agent_requests.append(body)
            if self.turns:
                return self.turns.pop(0)
        return dict(self.EXHAUSTED)
