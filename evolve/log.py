"""structlog set-up: logs go to stderr, JSON lines when it is not a TTY, readable text on a TTY.

stdout is kept for what a command answers (``fire --dry-run``, ``status --json``, ``history --json``
print exactly one JSON document there). When stderr is the journal (``$JOURNAL_STREAM`` names its
device and inode, as systemd sets it), each line starts with its syslog priority (``<4>`` for a
warning), which journald strips and records, so ``journalctl -p warning`` finds evolve's warnings.

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
# syslog priorities (sd-daemon(3)): what journald reads from a "<N>" line prefix.
PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "exception": 3, "critical": 2}
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


def journal_stream(stream: Any, env: Any = None) -> bool:
    """Whether ``stream`` is the journal: ``$JOURNAL_STREAM`` is ``DEV:INODE`` of the fd systemd connected.

    Compared with the stream's own fd, so a shell started from a unit (which inherits the variable)
    but writing to a terminal or a file gets no prefixes.
    """
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    try:
        st = os.fstat(stream.fileno())
        return bool(ino) and (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (AttributeError, OSError, ValueError):
        return False


def _priority_prefix(_: Any, method: str, event: dict[str, Any]) -> Any:
    """The last processor for the journal: ``<N>`` before the rendered line (journald strips it)."""
    return f"<{PRIORITIES.get(method, 6)}>".encode() + (event if isinstance(event, bytes) else str(event).encode())


def configure(*, json: bool | None = None, stream: Any = None, journal: bool | None = None) -> None:
    global _configured
    stream = stream or sys.stderr
    if json is None:
        json = not (hasattr(stream, "isatty") and stream.isatty())
    level = _LEVELS.get(os.environ.get("EVOLVE_LOG_LEVEL", "info").lower(), 20)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    if journal is None:
        journal = journal_stream(stream)
    if json:
        tail = [_priority_prefix] if journal else []
        structlog.configure(
            processors=[*shared, structlog.processors.JSONRenderer(serializer=_orjson_dumps), *tail],
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
