"""UTC timestamps in the ledger's ``...Z`` form, and parsing them back."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def utc_iso(ts: float | None = None) -> str:
    """``2026-11-29T19:15:25Z`` for ``ts`` (default: now)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def utc_stamp(ts: float | None = None) -> str:
    """A filename-safe UTC stamp for files moved aside: ``20261129T191525Z``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if ts is None else ts))


def parse_iso(text: object) -> float | None:
    """Epoch seconds from an ISO-8601 timestamp, or None when it does not parse."""
    if not isinstance(text, str) or not text:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def human_s(seconds: float | None) -> str:
    """A duration for people: ``3d4h``, ``2h05m``, ``4m10s``, ``12s`` (``?`` when unknown)."""
    if seconds is None:
        return "?"
    s = round(abs(seconds))
    sign = "-" if seconds < 0 else ""
    if s >= 86400:
        return f"{sign}{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{sign}{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{sign}{s // 60}m{s % 60:02d}s"
    return f"{sign}{s}s"
