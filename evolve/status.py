"""``evolve status`` and ``evolve history``: read-only views of the on-disk state.

Imports only what reading needs (no structlog, no APScheduler), so it answers fast.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any

import orjson

from evolve.paths import Paths
from evolve.store.ledger import Ledger
from evolve.store.markers import read_marker
from evolve.store.session_state import load_readonly


def _lock_held(paths: Paths) -> bool:
    try:
        fd = os.open(paths.lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _streak_limit(paths: Paths) -> int:
    from evolve.config import load
    from evolve.errors import ConfigError

    try:
        return load(paths.config, os.environ).context.streak_limit
    except ConfigError:
        return 2


def status(paths: Paths, *, recent: int = 5) -> dict[str, Any]:
    now = time.time()
    ledger = Ledger(paths.ledger)
    tail = ledger.tail(recent)
    st = load_readonly(paths.state, ledger)
    markers = {}
    for name, path in (
        ("KILL(global)", paths.global_kill),
        ("KILL", paths.kill),
        ("STOP", paths.stop),
        ("DORMANT", paths.dormant),
        ("HANDOFF", paths.handoff),
        ("RESCOPE", paths.rescope),
        ("ACK-REGRESSION", paths.ack_regression),
    ):
        m = read_marker(path, now)
        if m.present:
            markers[name] = {"path": str(path), "age_s": round(m.age_s), "content": m.content.strip()[:500]}
    cycle_state = None
    try:
        cycle_state = orjson.loads(paths.cycle_state.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        pass
    return {
        "repo": str(paths.repo),
        "running": _lock_held(paths),
        "fire": st.fire,
        "active_cycle": cycle_state,
        "claimed_work": st.claimed_work,
        "last_logged_cycle": ledger.last_cycle(),
        "last_result": st.last_result,
        "context_streak": st.context_streak,
        "context_streak_limit": _streak_limit(paths),
        "parked_work": st.parked_work,
        "idle_streak": st.idle_streak,
        "consecutive_failures": st.consecutive_failures,
        "breaker_open_until": st.breaker_open_until,
        "agent_session": st.agent_session,
        "markers": markers,
        "recent": tail.entries,
        "malformed_lines_seen": tail.malformed,
    }


def _short(e: dict[str, Any]) -> str:
    extra = ""
    if e.get("context_heavy"):
        extra += f" heavy({e.get('context_signal')})"
    if e.get("milestone"):
        extra += f" — {e['milestone']}"
    if e.get("error_class"):
        extra += f" [{e['error_class']}]"
    return f"  #{e.get('cycle')} {e.get('timestamp', '')} {e.get('result', '?'):<16} {e.get('target', '')}{extra}\n"


def render_status(info: dict[str, Any]) -> str:
    out = [f"repo     {info['repo']}\n"]
    if info["running"]:
        fire = info.get("fire") or {}
        out.append(f"running  yes (pid {fire.get('pid')}, cycle {fire.get('cycle')}, since {fire.get('started_at')})\n")
    else:
        out.append("running  no\n")
    if info.get("active_cycle"):
        ac = info["active_cycle"]
        out.append(f"cycle    {ac.get('cycle')} {ac.get('phase')}: {ac.get('title')}\n")
    out.append(f"ledger   last cycle {info['last_logged_cycle']}, last result {info['last_result']}\n")
    out.append(
        f"context  streak {info['context_streak']}/{info['context_streak_limit']}"
        f" parked {orjson.dumps(info['parked_work']).decode()}\n"
    )
    if info["consecutive_failures"] or info["breaker_open_until"]:
        out.append(f"breaker  failures {info['consecutive_failures']}, open until {info['breaker_open_until']}\n")
    if info["markers"]:
        for name, m in info["markers"].items():
            first = m["content"].splitlines()[0] if m["content"] else ""
            out.append(f"marker   {name} ({m['age_s']}s old) {first}\n")
    else:
        out.append("markers  none\n")
    if info["recent"]:
        out.append("recent\n")
        out.extend(_short(e) for e in info["recent"])
    return "".join(out)


def render_history(entries: list[dict[str, Any]], malformed: int) -> str:
    lines = [_short(e) for e in entries]
    if malformed:
        lines.append(f"  ({malformed} malformed line(s) skipped)\n")
    return "".join(lines) or "  (no cycles yet)\n"
