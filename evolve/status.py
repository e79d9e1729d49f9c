"""``evolve status`` and ``evolve history``: read-only views of the on-disk state.

Imports only what reading needs (no structlog, no APScheduler), so it answers fast, and reads only
the ledger's tail (backwards, in blocks): its cost does not grow with the ledger's length.

Health, and the exit code of ``evolve status``:

- **halted** (75): a fresh KILL or STOP, DORMANT present, or an unacknowledged goal regression —
  the next fire would stop in Step 1;
- **degraded** (1): the failure breaker is open, the last cycle failed or crashed, a fire died
  without being reconciled yet, or the config is invalid (the next fire would exit 78);
- **healthy** (0): anything else.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from evolve.paths import Paths
from evolve.store.ledger import Ledger
from evolve.store.markers import read_marker
from evolve.store.session_state import load_readonly
from evolve.timeutil import parse_iso, utc_iso

HEALTHY, DEGRADED, HALTED = "healthy", "degraded", "halted"
EXIT_FOR = {HEALTHY: 0, DEGRADED: 1, HALTED: 75}
FAILED_RESULTS = frozenset({"failed", "crashed"})
# A cycle that ended without an error (used for "last success" in status and the metrics).
UNSUCCESSFUL = frozenset({"failed", "crashed", "interrupted", "regressed"})

# The daemon (``evolve daemon``) publishes ``{pid, started_at, next_fire_at, schedule}`` here; status
# trusts it only while that pid is alive. See :func:`publish_daemon`.
DAEMON_FILE = "daemon.json"
# What a fire leaves behind for the report: one line per fire (see :mod:`evolve.notify`).
FIRES_FILE = "fires.jsonl"

TODAY_SCAN_CAP = 20_000  # entries: "cost today" never reads more than this
SESSION_SCAN_CAP = 2_000  # entries searched for the agent session's first cycle
MODE_SCAN_CAP = 200  # entries searched for the last agent mode

MARKERS: tuple[tuple[str, str, bool, str], ...] = (
    # name, Paths attribute, sticky, what it does
    ("KILL(global)", "global_kill", True, "halts every fire (kill) until an operator removes it"),
    ("KILL", "kill", True, "halts every fire (kill) until `evolve resume --kill`"),
    ("STOP", "stop", True, "halts every fire (user_halt) until `evolve resume`"),
    ("DORMANT", "dormant", False, "halts (dormant); the next fire clears it as soon as any work exists"),
    ("HANDOFF", "handoff", False, "context hand-off; the next fire clears it and starts a fresh session"),
    ("RESCOPE", "rescope", False, "operator directive; consumed by the cycle that uses it"),
    ("ACK-REGRESSION", "ack_regression", False, "acknowledges a goal regression; consumed by the next fire"),
)


# -- small readers ---------------------------------------------------------------------------


def _lock_held(paths: Paths) -> bool:
    try:
        fd = os.open(paths.lock, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def load_config(paths: Paths, env: Mapping[str, str]) -> tuple[Any, str | None]:
    """The config, or the defaults plus the error text when the file (or env) is invalid."""
    from evolve.config import Config, load
    from evolve.errors import ConfigError

    try:
        return load(paths.config, env), None
    except ConfigError as exc:
        return Config(), " ".join(str(exc).split())[:300]


def human_s(seconds: float | None) -> str:
    """``3d4h``, ``2h05m``, ``4m10s``, ``12s``."""
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


# -- the daemon's next fire, systemd timers ----------------------------------------------------


def publish_daemon(paths: Paths, *, next_fire_at: str | None, schedule: str = "", pid: int | None = None) -> None:
    """For ``evolve daemon``: record its pid and next fire time so ``status`` can show them."""
    from evolve.store.atomic import write_json

    info = {"pid": pid or os.getpid(), "next_fire_at": next_fire_at, "schedule": schedule, "updated_at": utc_iso()}
    old = _read_json(paths.evolve_dir / DAEMON_FILE)
    if isinstance(old, dict) and old.get("pid") == info["pid"] and old.get("started_at"):
        info["started_at"] = old["started_at"]
    else:
        info["started_at"] = info["updated_at"]
    write_json(paths.evolve_dir / DAEMON_FILE, info)


def daemon_info(paths: Paths) -> dict[str, Any] | None:
    """The running daemon's record (None when there is none or its pid is gone)."""
    info = _read_json(paths.evolve_dir / DAEMON_FILE)
    if isinstance(info, dict) and pid_alive(info.get("pid")):
        return info
    return None


def systemd_booted() -> bool:
    """sd_booted(3): systemd is PID 1 (in containers it usually is not, and we skip systemctl)."""
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def _run(argv: Sequence[str], timeout: float = 2.0) -> str | None:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def parse_timer_units(listing: str) -> list[str]:
    """Unit names (``*.timer``) from ``systemctl list-timers --all --plain --no-legend`` output."""
    units = []
    for line in listing.splitlines():
        for tok in line.split():
            if tok.endswith(".timer") and tok not in units:
                units.append(tok)
    return units


def parse_next_elapse(show: str) -> dict[str, float | None]:
    """``{unit: epoch | None}`` from ``systemctl show -p Id -p NextElapseUSecRealtime --timestamp=unix``."""
    out: dict[str, float | None] = {}
    unit = None
    for line in show.splitlines():
        key, _, value = line.partition("=")
        if key == "Id":
            unit = value.strip()
            out.setdefault(unit, None)
        elif key == "NextElapseUSecRealtime" and unit:
            v = value.strip().lstrip("@")
            try:
                out[unit] = float(v) if v and v not in ("0", "n/a") else None
            except ValueError:
                out[unit] = None
    return out


def systemd_timers() -> list[dict[str, Any]]:
    """``evolve*`` timers (system and user scope) with their next elapse time, when systemd runs."""
    if not systemd_booted():
        return []
    found = []
    for scope in ([], ["--user"]):
        listing = _run(["systemctl", *scope, "list-timers", "--all", "--plain", "--no-legend", "evolve*"])
        units = parse_timer_units(listing or "")
        if not units:
            continue
        show = _run(
            ["systemctl", *scope, "show", "-p", "Id", "-p", "NextElapseUSecRealtime", "--timestamp=unix", *units]
        )
        for unit, at in parse_next_elapse(show or "").items():
            found.append({"unit": unit, "scope": "user" if scope else "system", "at_epoch": at})
    return found


def next_fire(paths: Paths, now: float) -> dict[str, Any] | None:
    """When the next fire is due, if a daemon or a systemd timer says so; None when unknown."""
    d = daemon_info(paths)
    if d is not None:
        at = parse_iso(d.get("next_fire_at"))
        return {
            "source": "daemon",
            "pid": d.get("pid"),
            "schedule": d.get("schedule"),
            "at": d.get("next_fire_at"),
            "in_s": None if at is None else round(at - now),
        }
    timers = [t for t in systemd_timers() if t["at_epoch"]]
    if timers:
        t = min(timers, key=lambda x: x["at_epoch"])
        return {
            "source": "systemd",
            "unit": t["unit"],
            "scope": t["scope"],
            "at": utc_iso(t["at_epoch"]),
            "in_s": round(t["at_epoch"] - now),
        }
    return None


# -- autocompact preflight -------------------------------------------------------------------


AUTOCOMPACT_MODULE = "evolve.harness.autocompact"
DETECTOR_NAMES = ("status_info", "detect", "detect_autocompact", "autocompact_status")


def _plain(value: Any) -> Any:
    name = getattr(value, "name", None)
    if name is not None and hasattr(value, "value"):  # an Enum member
        return str(name)
    return value


def _clean(value: Any, cap: int = 200) -> str:
    """Any value as a short string that encodes (a settings file may hold a lone surrogate)."""
    text = str(value)
    text = text if len(text) <= cap else text[: cap - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _normalise_detection(result: Any) -> dict[str, Any]:
    if isinstance(result, str):
        return {"state": _clean(result.upper(), 40)}
    if hasattr(result, "name") and hasattr(result, "value") and not isinstance(result, dict):
        return {"state": _clean(str(result.name).upper(), 40)}
    data: dict[str, Any] = {}
    if isinstance(result, Mapping):
        data = dict(result)
    elif result is not None:
        names = [k for k in dir(result) if not k.startswith("_")]
        data = {k: getattr(result, k) for k in names if not callable(getattr(result, k))}
    state = data.get("state", data.get("status", data.get("kind", "unknown")))
    out = {"state": _clean(str(_plain(state)).upper(), 40) if state is not None else "unknown"}
    for key in ("value", "raw", "source", "path", "detail", "line"):
        if data.get(key) is not None:
            out[key] = _clean(_plain(data[key]))
    if isinstance(data.get("nudge_off"), bool):
        out["nudge_off"] = data["nudge_off"]
    return out


def autocompact_preflight(repo: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """CONFIGURED / INVALID / ABSENT from the harness detector (``evolve.harness.autocompact``).

    Advisory only; ``unknown`` when that module is not installed or its detector fails.
    """
    import importlib
    import importlib.util
    import inspect

    try:
        if importlib.util.find_spec(AUTOCOMPACT_MODULE) is None:
            return {"state": "unknown", "detail": "autocompact detector not available"}
        mod = importlib.import_module(AUTOCOMPACT_MODULE)
    except Exception as exc:  # a broken or missing optional module is "unknown", never an error
        return {"state": "unknown", "detail": f"autocompact detector not available ({type(exc).__name__})"}
    fn = next((getattr(mod, n) for n in DETECTOR_NAMES if callable(getattr(mod, n, None))), None)
    if fn is None:
        return {"state": "unknown", "detail": "autocompact detector has no detect function"}
    try:
        params = inspect.signature(fn).parameters
        kwargs: dict[str, Any] = {}
        for name in ("env", "environ"):
            if name in params:
                kwargs[name] = dict(env)
        args: list[Any] = []
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if positional and positional[0].name not in kwargs:
            args.append(repo)
        return _normalise_detection(fn(*args, **kwargs))
    except Exception as exc:
        return {"state": "unknown", "detail": f"autocompact detector failed: {type(exc).__name__}: {str(exc)[:120]}"}


# -- the status snapshot ---------------------------------------------------------------------


def _markers(paths: Paths, now: float, ttl_s: float) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, attr, sticky, effect in MARKERS:
        m = read_marker(getattr(paths, attr), now)
        if not m.present:
            continue
        info: dict[str, Any] = {
            "path": str(m.path),
            "age_s": round(m.age_s),
            "content": m.content.strip()[:500],
            "sticky": sticky,
            "effect": effect,
        }
        if sticky:
            info["ttl_s"] = round(ttl_s)
            info["ttl_left_s"] = round(ttl_s - m.age_s)
            info["stale"] = not m.fresh(ttl_s)
            if info["stale"]:
                info["effect"] = "ignored: older than the TTL (not deleted)"
        out[name] = info
    return out


def _scan_back(ledger: Ledger, now: float, session: dict[str, Any] | None) -> dict[str, Any]:
    """One bounded backward pass: today's cycles and cost, the last agent mode, the session's start."""
    midnight = now - now % 86400
    cost = 0.0
    cycles = 0
    partial = False
    last_mode = None
    started_cycle = (session or {}).get("started_cycle")
    started_at = None
    today_done = False
    for n, e in enumerate(ledger.scan_back()):
        ts = parse_iso(e.get("timestamp"))
        if not today_done:
            if ts is not None and ts < midnight:
                today_done = True
            elif n >= TODAY_SCAN_CAP:
                today_done = partial = True
            elif ts is not None:
                cycles += 1
                cost += _num(e.get("cost_usd")) or 0.0
        if last_mode is None and isinstance(e.get("agent_mode"), str):
            last_mode = e["agent_mode"]
        c = e.get("cycle")
        if started_at is None and isinstance(started_cycle, int) and isinstance(c, int):
            if c == started_cycle:
                started_at = e.get("timestamp")
            elif c < started_cycle:
                started_at = ""  # not found: stop looking
        session_done = started_at is not None or not isinstance(started_cycle, int) or n >= SESSION_SCAN_CAP
        if today_done and session_done and (last_mode is not None or n >= MODE_SCAN_CAP):
            break
    return {
        "cycles_today": cycles,
        "cost_today_usd": round(cost, 6),
        "cost_today_partial": partial,
        "last_agent_mode": last_mode,
        "session_started_at": started_at or None,
    }


def status(
    paths: Paths,
    *,
    recent: int = 5,
    env: Mapping[str, str] | None = None,
    now: float | None = None,
    probe_schedule: bool = True,
) -> dict[str, Any]:
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    cfg, config_error = load_config(paths, env)
    ledger = Ledger(paths.ledger)
    tail = ledger.tail(max(recent, 20))
    recent_entries = tail.entries[-recent:] if recent > 0 else []
    st = load_readonly(paths.state, ledger)
    # The typed records, as the JSON objects this view reports.
    agent_session, claimed_work, fire_rec = (
        r.to_json() if r is not None else None for r in (st.agent_session, st.claimed_work, st.fire)
    )
    running = _lock_held(paths)
    ttl_s = cfg.halt.kill_ttl_days * 86400
    markers = _markers(paths, now, ttl_s)
    cycle_state = _read_json(paths.cycle_state)
    cycle_state = cycle_state if isinstance(cycle_state, dict) else None
    scan = _scan_back(ledger, now, agent_session)

    # What is running right now.
    fire = fire_rec
    current = None
    if running:
        started = parse_iso((fire or {}).get("started_at"))
        current = {
            "pid": (fire or {}).get("pid"),
            "fire_id": (fire or {}).get("fire_id"),
            "fire_started_at": (fire or {}).get("started_at"),
            "fire_elapsed_s": None if started is None else round(now - started),
            "cycle": (fire or {}).get("cycle"),
            "work_ref": None,
            "title": None,
            "phase": None,
            "agent_elapsed_s": None,
        }
        if cycle_state:
            current.update(
                cycle=cycle_state.get("cycle", current["cycle"]),
                work_ref=cycle_state.get("work_ref"),
                title=cycle_state.get("title"),
                phase=cycle_state.get("phase"),
            )
            written = parse_iso(cycle_state.get("written_at"))
            if cycle_state.get("phase") == "agent" and written is not None:
                current["agent_elapsed_s"] = round(now - written)
        elif claimed_work:
            current.update(work_ref=claimed_work.get("ref"), title=claimed_work.get("title"))

    # The breaker.
    until = parse_iso(st.breaker_open_until)
    if until is not None and until > now:
        bstate = "open"
    elif until is not None:
        bstate = "half-open"
    else:
        bstate = "closed"
    breaker = {
        "state": bstate,
        "open_until": st.breaker_open_until,
        "eta_s": round(until - now) if bstate == "open" and until is not None else None,
        "consecutive_failures": st.consecutive_failures,
        "max_consecutive_failures": cfg.breaker.max_consecutive_failures,
        "cooldown_minutes": cfg.breaker.cooldown_minutes,
    }

    # The agent session.
    session = None
    if isinstance(agent_session, dict):
        session = dict(agent_session)
        session["last_mode"] = scan["last_agent_mode"]
        session["started_at"] = scan["session_started_at"]
        t0 = parse_iso(scan["session_started_at"])
        session["age_s"] = None if t0 is None else round(now - t0)

    # Health.
    from evolve.cycle.halt import goal_drop

    halt = None
    for name, reason in (("KILL(global)", "kill"), ("KILL", "kill"), ("STOP", "user_halt")):
        m = markers.get(name)
        if m and not m["stale"]:
            halt = {"reason": reason, "detail": f"{name} present: {' '.join(m['content'].split())[:200]}"}
            break
    if halt is None and "DORMANT" in markers:
        halt = {"reason": "dormant", "detail": "DORMANT present; cleared by the next fire once any work exists"}
    if halt is None:
        drop = goal_drop(tail.entries)
        if drop is not None and drop[0] > st.ack_regression_cycle and "ACK-REGRESSION" not in markers:
            halt = {"reason": "goal_regression", "detail": drop[1] + "; write .agents/evolve/ACK-REGRESSION to go on"}
    degraded: list[str] = []
    if bstate == "open":
        degraded.append(f"breaker open for {human_s(breaker['eta_s'])} more")
    last = tail.entries[-1] if tail.entries else None
    if last and isinstance(last.get("result"), str) and last["result"] in FAILED_RESULTS:
        cls = f" ({last['error_class']})" if last.get("error_class") else ""
        degraded.append(f"last cycle {last.get('cycle')} {last.get('result')}{cls}")
    if fire and not running:
        degraded.append(f"fire pid {fire.get('pid')} died mid-fire; the next fire reconciles it")
    if config_error:
        degraded.append(f"config invalid (fires exit 78): {config_error}")
    warnings = [f"{name} is older than its TTL and ignored" for name, m in markers.items() if m.get("stale")]
    if tail.malformed:
        warnings.append(f"{tail.malformed} malformed ledger line(s) near the end")
    if last and last.get("error_class") == "limit":
        warnings.append(f"rate limited at cycle {last.get('cycle')}; the next fire retries")
    health = HALTED if halt else DEGRADED if degraded else HEALTHY
    reasons = ([f"{halt['reason']}: {halt['detail']}"] if halt else []) + degraded

    return {
        "repo": str(paths.repo),
        "health": health,
        "exit_code": EXIT_FOR[health],
        "reasons": reasons,
        "halt": halt,
        "running": running,
        "pid": (fire or {}).get("pid") if running else None,
        "current": current,
        "fire": fire_rec,
        "active_cycle": cycle_state,
        "claimed_work": claimed_work,
        "last_logged_cycle": ledger.last_cycle(),
        "last_result": st.last_result,
        "context_streak": st.context_streak,
        "context_streak_limit": cfg.context.streak_limit,
        "parked_work": st.parked_work,
        "idle_streak": st.idle_streak,
        "consecutive_failures": st.consecutive_failures,
        "breaker_open_until": st.breaker_open_until,
        "breaker": breaker,
        "agent_session": session,
        "markers": markers,
        "next_fire": next_fire(paths, now) if probe_schedule else None,
        "cycles_today": scan["cycles_today"],
        "cost_today_usd": scan["cost_today_usd"],
        "cost_today_partial": scan["cost_today_partial"],
        "autocompact": autocompact_preflight(paths.repo, env),
        "recent": recent_entries,
        "malformed_lines_seen": tail.malformed,
        "warnings": warnings,
        "config_error": config_error,
        "generated_at": utc_iso(now),
    }


# -- rendering -------------------------------------------------------------------------------

# Control, bidi-override and zero-width characters: ledger text is written by agents, and an operator
# reads these views on a terminal. They are shown as visible escapes (``\x1b``, ``\u202e``).
_TERM_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _esc(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def term_safe(text: str) -> str:
    """``text`` with every control/invisible character except newline shown as an escape."""
    return _TERM_UNSAFE.sub(_esc, text)


def _notes(e: dict[str, Any], *, disposition: bool = False) -> str:
    """The annotations a ledger row carries on a terminal (shared by status and history)."""
    extra = ""
    if e.get("context_heavy"):
        extra += f" heavy({e.get('context_signal')})"
    if e.get("error_class"):
        extra += f" [{e['error_class']}]"
    if disposition and e.get("disposition"):
        extra += f" ({e['disposition']})"
    if e.get("milestone"):
        extra += f" — {e['milestone']}"
    return extra


def _short(e: dict[str, Any]) -> str:
    return (
        f"  #{e.get('cycle')} {e.get('timestamp', '')} {e.get('result', '?')!s:<16} {e.get('target', '')}{_notes(e)}\n"
    )


def render_status(info: dict[str, Any]) -> str:
    out = [f"repo       {info['repo']}\n"]
    health = info.get("health", HEALTHY)
    line = f"health     {health.upper()} (exit {info.get('exit_code', 0)})"
    out.append(line + ("" if not info.get("reasons") else ": " + "; ".join(info["reasons"])) + "\n")
    cur = info.get("current")
    if info["running"]:
        cur = cur or {}
        text = f"running    yes, pid {cur.get('pid')}, fire {human_s(cur.get('fire_elapsed_s'))}"
        if cur.get("cycle") is not None:
            text += f", cycle {cur['cycle']}"
        if cur.get("phase"):
            text += f" ({cur['phase']}"
            if cur.get("agent_elapsed_s") is not None:
                text += f" {human_s(cur['agent_elapsed_s'])}"
            text += ")"
        if cur.get("title") or cur.get("work_ref"):
            text += f": {cur.get('title') or ''} [{cur.get('work_ref') or ''}]"
        out.append(text + "\n")
    else:
        out.append("running    no\n")
    nf = info.get("next_fire")
    if nf and nf.get("at"):
        who = f"daemon pid {nf.get('pid')}" if nf["source"] == "daemon" else f"systemd {nf.get('unit')}"
        out.append(f"next fire  {nf['at']} (in {human_s(nf.get('in_s'))}, {who})\n")
    elif nf:
        out.append(f"next fire  unknown ({nf['source']} running, no time published)\n")
    else:
        out.append("next fire  unknown (no daemon or systemd timer found)\n")
    cost = f"${info.get('cost_today_usd', 0):.2f}" + ("+" if info.get("cost_today_partial") else "")
    out.append(
        f"ledger     last cycle {info['last_logged_cycle']}, last result {info['last_result']};"
        f" today {info.get('cycles_today', 0)} cycle(s), {cost}\n"
    )
    out.append(
        f"context    streak {info['context_streak']}/{info['context_streak_limit']}"
        f", parked {orjson.dumps(info['parked_work']).decode()}\n"
    )
    b = info.get("breaker") or {}
    fails = f"{b.get('consecutive_failures', 0)}/{b.get('max_consecutive_failures', '?')} failures"
    if b.get("state") == "open":
        out.append(f"breaker    OPEN until {b.get('open_until')} (ETA {human_s(b.get('eta_s'))}), {fails}\n")
    elif b.get("state") == "half-open":
        out.append(f"breaker    half-open (the next fire runs one probe cycle), {fails}\n")
    else:
        out.append(f"breaker    closed, {fails}\n")
    s = info.get("agent_session")
    if s:
        age = f", age {human_s(s.get('age_s'))}" if s.get("age_s") is not None else ""
        heavy = ", ended heavy (next cycle starts fresh)" if s.get("ended_heavy") else ""
        out.append(
            f"session    {s.get('id')} ({s.get('runner')}, last mode {s.get('last_mode') or '?'},"
            f" cycles {s.get('started_cycle')}-{s.get('last_cycle')}{age}{heavy})\n"
        )
    else:
        out.append("session    none\n")
    if info["markers"]:
        for name, m in info["markers"].items():
            first = m["content"].splitlines()[0] if m["content"] else ""
            kind = "sticky" if m.get("sticky") else "non-sticky"
            ttl = ""
            if m.get("sticky"):
                ttl = ", STALE" if m.get("stale") else f", TTL left {human_s(m.get('ttl_left_s'))}"
            out.append(f"marker     {name} ({kind}, {human_s(m['age_s'])} old{ttl}) {first}\n")
            out.append(f"           {m.get('effect', '')}\n")
    else:
        out.append("markers    none\n")
    ac = info.get("autocompact") or {}
    detail = " ".join(str(ac[k]) for k in ("value", "source", "detail") if ac.get(k))
    out.append(f"autocompact {ac.get('state', 'unknown')}{' (' + detail + ')' if detail else ''}\n")
    for w in info.get("warnings") or []:
        out.append(f"warning    {w}\n")
    if info["recent"]:
        out.append("recent\n")
        out.extend(_short(e) for e in info["recent"])
    return term_safe("".join(out))


# -- history ---------------------------------------------------------------------------------

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
    ledger: Ledger, *, limit: int, since: float | None = None, results: Sequence[str] = ()
) -> tuple[list[tuple[bytes, dict[str, Any]]], int]:
    """Matching entries oldest first, each with its raw ledger line; and the malformed lines skipped.

    Reads backwards and stops after ``limit`` matches or at the first entry older than ``since``.
    """
    wanted = set(results)
    out: list[tuple[bytes, dict[str, Any]]] = []
    malformed = 0
    for raw in _raw_lines_backwards(ledger):
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
        out.append((raw, obj))
        if len(out) >= limit:
            break
    out.reverse()
    return out, malformed


def _raw_lines_backwards(ledger: Ledger) -> Iterator[bytes]:
    for line in ledger._lines_backwards():
        if line is not None:
            yield line


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], lo: float | None = None, hi: float | None = None) -> str:
    """One character per value (a space for a missing one), scaled between ``lo`` and ``hi``."""
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    lo = min(present) if lo is None else lo
    hi = max(present) if hi is None else hi
    span = hi - lo
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif span <= 0:
            out.append(SPARKS[0] if v <= 0 else SPARKS[-1] if hi > 0 else SPARKS[0])
        else:
            i = int((min(max(v, lo), hi) - lo) / span * (len(SPARKS) - 1) + 0.5)
            out.append(SPARKS[i])
    return "".join(out)


def _goals_ratio(e: dict[str, Any]) -> float | None:
    p, t = _num(e.get("goals_passing")), _num(e.get("goals_total"))
    return None if p is None or not t else p / t


def _row(e: dict[str, Any]) -> str:
    ts = str(e.get("timestamp", ""))[:16].replace("T", " ")
    cost = _num(e.get("cost_usd"))
    pct = _num(e.get("context_pct"))
    goals = f"{e['goals_passing']}/{e['goals_total']}" if _num(e.get("goals_passing")) is not None else ""
    extra = _notes(e, disposition=True)
    return (
        f"  #{e.get('cycle', '?')!s:<5} {ts:<16} {e.get('result', '?')!s:<16}"
        f" {'' if cost is None else f'${cost:.2f}':>7} {'' if pct is None else f'{pct:.0f}%':>5} {goals:>7}"
        f"  {e.get('target', '')}{extra}\n"
    )


def render_history(entries: list[dict[str, Any]], malformed: int) -> str:
    if not entries:
        lines = ["  (no cycles match)\n" if malformed else "  (no cycles yet)\n"]
    else:
        costs = [_num(e.get("cost_usd")) for e in entries]
        pcts = [_num(e.get("context_pct")) for e in entries]
        goals = [_goals_ratio(e) for e in entries]
        total = sum(c for c in costs if c is not None)
        known_pcts = [p for p in pcts if p is not None]
        last_goals = next((e for e in reversed(entries) if _goals_ratio(e) is not None), None)
        lines = [f"  {len(entries)} cycle(s), #{entries[0].get('cycle')}..#{entries[-1].get('cycle')}\n"]
        lines.append(
            f"  goals     {sparkline(goals, 0.0, 1.0)}  "
            + (f"{last_goals['goals_passing']}/{last_goals['goals_total']} now\n" if last_goals else "no goals data\n")
        )
        lines.append(f"  cost      {sparkline(costs, 0.0)}  ${total:.2f} total\n")
        lines.append(
            f"  context % {sparkline(pcts, 0.0, 100.0)}  "
            + (f"max {max(known_pcts):.0f}%\n" if known_pcts else "no context data\n")
        )
        lines.append(f"  {'cycle':<6} {'time (UTC)':<16} {'result':<16} {'cost':>7} {'ctx':>5} {'goals':>7}  target\n")
        lines.extend(_row(e) for e in entries)
    if malformed:
        lines.append(f"  ({malformed} malformed line(s) skipped)\n")
    return term_safe("".join(lines))
