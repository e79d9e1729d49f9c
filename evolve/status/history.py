"""``evolve history``: the newest matching ledger entries, read backwards (never the whole file)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from evolve.results import is_idle_poll
from evolve.store.ledger import Ledger
from evolve.timeutil import parse_iso

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """``90m``, ``24h``, ``7d``, ``2w`` ago, or an ISO date/time (UTC unless it says otherwise)."""
    t = text.strip()
    if t and t[-1].lower() in _UNITS:
        try:
            return now - float(t[:-1]) * _UNITS[t[-1].lower()]
        except ValueError:
            pass
    ts = parse_iso(t if "T" in t or len(t) != 10 else t + "T00:00:00Z")
    if ts is None:
        raise ValueError(f"--since {text!r}: use e.g. 90m, 24h, 7d or an ISO timestamp")
    return ts


def history(
    ledger: Ledger, *, limit: int, since: float | None = None, results: Sequence[str] = (), idle: bool = False
) -> tuple[list[tuple[bytes, dict[str, Any]]], int, int]:
    """Matching entries oldest first, each with its raw ledger line; the malformed lines skipped; and
    the idle polls passed over (shown only with ``idle``: a night of "nothing to do" must not push
    the cycles that did something out of the last ``limit``).

    Reads backwards and stops after ``limit`` matches or at the first entry older than ``since``.
    """
    wanted = set(results)
    out: list[tuple[bytes, dict[str, Any]]] = []
    malformed = hidden = 0
    for raw in ledger.raw_lines_backwards():
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            malformed += 1
            continue
        if not isinstance(obj, dict):
            malformed += 1
            continue
        if since is not None:
            ts = parse_iso(obj.get("timestamp"))
            if ts is not None and ts < since:
                break
        if wanted and (not isinstance(obj.get("result"), str) or obj["result"] not in wanted):
            continue
        if not idle and is_idle_poll(obj):
            hidden += 1
            continue
        out.append((raw, obj))
        if len(out) >= limit:
            break
    out.reverse()
    return out, malformed, hidden
