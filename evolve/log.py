"""structlog set-up: JSON lines on stdout when not a TTY (journald-friendly), console on a TTY.

Event names are stable (docs/DESIGN.md §9): ``fire.start``, ``handoff.cleared``, ``halt``, ``cycle.start``,
``agent.mode``, ``agent.heartbeat``, ``gate.fail``, ``handoff.written``, ``fire.end`` and more.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

import structlog

from evolve import jsonsafe, redact

_SECRET_KEYS = re.compile(r"(api[_-]?key|token|secret|password|authorization)", re.I)
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_configured = False


def _redact(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """Secrets never reach the logs: secret-named fields, env secret values and key-shaped strings."""
    r = redact.current()
    for k, v in list(event.items()):
        if _SECRET_KEYS.search(k) and not k.endswith("_env"):
            event[k] = redact.MASK
        elif isinstance(v, str | list | dict | tuple):
            event[k] = r.json(v)
    return {r.text(k): v for k, v in event.items()}


def _orjson_dumps(obj: Any, **_: Any) -> bytes:
    return jsonsafe.dumps(obj, default=str)


def configure(*, json: bool | None = None, stream: Any = None) -> None:
    global _configured
    stream = stream or sys.stdout
    if json is None:
        json = not (hasattr(stream, "isatty") and stream.isatty())
    level = _LEVELS.get(os.environ.get("EVOLVE_LOG_LEVEL", "info").lower(), 20)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    if json:
        structlog.configure(
            processors=[*shared, structlog.processors.JSONRenderer(serializer=_orjson_dumps)],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=structlog.BytesLoggerFactory(file=getattr(stream, "buffer", stream)),
            cache_logger_on_first_use=False,
        )
    else:
        structlog.configure(
            processors=[*shared, structlog.dev.ConsoleRenderer(colors=stream.isatty())],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=structlog.PrintLoggerFactory(file=stream),
            cache_logger_on_first_use=False,
        )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    _configured = True


def get(name: str = "evolve") -> Any:
    if not _configured:
        configure()
    return structlog.get_logger(name)


def bind(**kw: Any) -> None:
    structlog.contextvars.bind_contextvars(**kw)


def unbind(*keys: str) -> None:
    structlog.contextvars.unbind_contextvars(*keys)
