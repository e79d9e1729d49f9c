"""The terminal views of ``evolve status`` and ``evolve history``.

``render_status`` renders the JSON form of the snapshot (what ``status --json`` prints), so the text
and the JSON cannot disagree. Ledger text is written by agents and read on a terminal: every view
goes through :func:`term_safe`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from evolve.status.snapshot import HEALTHY
from evolve.timeutil import human_s

# Control, bidi-override and zero-width characters: ledger text is written by agents, and an operator
# reads these views on a terminal. They are shown as visible escapes (``\x1b``, ``\u202e``).
_TERM_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _esc(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def term_safe(text: str) -> str:
    """``text`` with every control/invisible character except newline shown as an escape."""
    return _TERM_UNSAFE.sub(_esc, text)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _notes(e: Mapping[str, Any], *, disposition: bool = False) -> str:
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
    if e.get("gate_detail"):
        extra += f" gate: {e['gate_detail']}"
    elif e.get("error") and e.get("result") in ("failed", "crashed"):
        extra += f" {' '.join(str(e['error']).split())[:160]}"
    if e.get("selected_source") == "metronome-gate-blocked":
        extra += " [metronome block: write .agents/evolve/RESCOPE with the new direction]"
    return extra


def _output_lines(e: Mapping[str, Any], indent: str, n: int = 3) -> list[str]:
    """The last lines of a red cycle's gate output (``gate_output``), indented under its row."""
    lines = [ln for ln in str(e.get("gate_output") or "").splitlines() if ln.strip()][-n:]
    return [f"{indent}| {ln[:160]}\n" for ln in lines]


# -- status ----------------------------------------------------------------------------------


def _short(e: Mapping[str, Any]) -> str:
    return (
        f"  #{e.get('cycle')} {e.get('timestamp', '')} {e.get('result', '?')!s:<16} {e.get('target', '')}{_notes(e)}\n"
    )


def _running_line(info: Mapping[str, Any]) -> str:
    if not info["running"]:
        return "running    no\n"
    cur = info.get("current") or {}
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
    return text + "\n"


def _next_fire_line(nf: Mapping[str, Any] | None) -> str:
    if nf and nf.get("at"):
        who = (f"daemon pid {nf.get('pid')}" if nf["source"] == "daemon" else "crontab line" if nf["source"] == "cron"
               else f"systemd {nf.get('unit')}")
        return f"next fire  {nf['at']} (in {human_s(nf.get('in_s'))}, {who})\n"
    if nf:
        return f"next fire  unknown ({nf['source']} running, no time published)\n"
    return "next fire  unknown (no daemon, systemd timer or crontab line found)\n"


def _breaker_line(b: Mapping[str, Any]) -> str:
    fails = f"{b.get('consecutive_failures', 0)}/{b.get('max_consecutive_failures', '?')} failures"
    if b.get("state") == "open":
        return f"breaker    OPEN until {b.get('open_until')} (ETA {human_s(b.get('eta_s'))}), {fails}\n"
    if b.get("state") == "half-open":
        return f"breaker    half-open (the next fire runs one probe cycle), {fails}\n"
    return f"breaker    closed, {fails}\n"


def _session_line(s: Mapping[str, Any] | None) -> str:
    if not s:
        return "session    none\n"
    age = f", age {human_s(s.get('age_s'))}" if s.get("age_s") is not None else ""
    heavy = ", ended heavy (next cycle starts fresh)" if s.get("ended_heavy") else ""
    return (
        f"session    {s.get('id')} ({s.get('runner')}, last mode {s.get('last_mode') or '?'},"
        f" cycles {s.get('started_cycle')}-{s.get('last_cycle')}{age}{heavy})\n"
    )


def _sticky_note(m: Mapping[str, Any]) -> str:
    """How long a KILL/STOP holds: its own expiry, until resumed (written by evolve), or the TTL."""
    if m.get("stale"):
        return ", STALE"
    if m.get("expires_in_s") is not None:
        return f", expires in {human_s(m.get('expires_in_s'))}"
    if m.get("written_by"):
        return f", {m['written_by']}, until resumed"
    return f", TTL left {human_s(m.get('ttl_left_s'))}"


def _marker_lines(markers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not markers:
        return ["markers    none\n"]
    out = []
    for name, m in markers.items():
        first = m["content"].splitlines()[0] if m["content"] else ""
        kind = "sticky" if m.get("sticky") else "non-sticky"
        ttl = ""
        if m.get("sticky"):
            ttl = _sticky_note(m)
        out.append(f"marker     {name} ({kind}, {human_s(m['age_s'])} old{ttl}) {first}\n")
        out.append(f"           {m.get('effect', '')}\n")
    return out


def _autocompact_line(ac: Mapping[str, Any]) -> str:
    detail = " ".join(str(ac[k]) for k in ("value", "source", "detail") if ac.get(k))
    return f"autocompact {ac.get('state', 'unknown')}{' (' + detail + ')' if detail else ''}\n"


def render_status(info: Mapping[str, Any]) -> str:
    """The text of ``evolve status`` from the snapshot's JSON form (:meth:`StatusSnapshot.as_json`)."""
    health = info.get("health", HEALTHY)
    line = f"health     {health.upper()} (exit {info.get('exit_code', 0)})"
    cost = f"${info.get('cost_today_usd', 0):.2f}" + ("+" if info.get("cost_today_partial") else "")
    out = [
        f"repo       {info['repo']}\n",
        line + ("" if not info.get("reasons") else ": " + "; ".join(info["reasons"])) + "\n",
        _running_line(info),
        _next_fire_line(info.get("next_fire")),
        f"ledger     last cycle {info['last_logged_cycle']}, last result {info['last_result']};"
        f" today {info.get('cycles_today', 0)} cycle(s), {cost}, {info.get('idle_polls_today', 0)} idle poll(s)\n",
        f"context    streak {info['context_streak']}/{info['context_streak_limit']}"
        f", parked {orjson.dumps(info['parked_work']).decode()}\n",
        _breaker_line(info.get("breaker") or {}),
        _session_line(info.get("agent_session")),
        *_marker_lines(info["markers"]),
        _autocompact_line(info.get("autocompact") or {}),
        f"sandbox    {term_safe(str((info.get('sandbox') or {}).get('label') or 'unknown'))}\n",
        *(f"warning    {w}\n" for w in info.get("warnings") or []),
    ]
    red = info.get("last_red")
    if red:
        out.append(f"last red   #{red.get('cycle')} {red.get('target') or ''}: {red.get('gate_detail')}\n")
        out.extend(_output_lines(red, "           "))
        if red.get("run_log"):
            out.append(f"           run log {red['run_log']}\n")
    if info["recent"]:
        out.append("recent\n")
        out.extend(_short(e) for e in info["recent"])
    return term_safe("".join(out))


# -- history ---------------------------------------------------------------------------------

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


def _goals_ratio(e: Mapping[str, Any]) -> float | None:
    p, t = _num(e.get("goals_passing")), _num(e.get("goals_total"))
    return None if p is None or not t else p / t


def _row(e: Mapping[str, Any]) -> str:
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


def _history_summary(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    costs = [_num(e.get("cost_usd")) for e in entries]
    pcts = [_num(e.get("context_pct")) for e in entries]
    goals = [_goals_ratio(e) for e in entries]
    total = sum(c for c in costs if c is not None)
    known_pcts = [p for p in pcts if p is not None]
    last_goals = next((e for e in reversed(entries) if _goals_ratio(e) is not None), None)
    return [
        f"  {len(entries)} cycle(s), #{entries[0].get('cycle')}..#{entries[-1].get('cycle')}\n",
        f"  goals     {sparkline(goals, 0.0, 1.0)}  "
        + (f"{last_goals['goals_passing']}/{last_goals['goals_total']} now\n" if last_goals else "no goals data\n"),
        f"  cost      {sparkline(costs, 0.0)}  ${total:.2f} total\n",
        f"  context % {sparkline(pcts, 0.0, 100.0)}  "
        + (f"max {max(known_pcts):.0f}%\n" if known_pcts else "no context data\n"),
        f"  {'cycle':<6} {'time (UTC)':<16} {'result':<16} {'cost':>7} {'ctx':>5} {'goals':>7}  target\n",
    ]


def render_history(entries: list[dict[str, Any]], malformed: int, *, idle_hidden: int = 0) -> str:
    if not entries:
        lines = ["  (no cycles match)\n" if malformed or idle_hidden else "  (no cycles yet)\n"]
    else:
        lines = [*_history_summary(entries)]
        for e in entries:
            lines.append(_row(e))
            lines.extend(_output_lines(e, "         "))
    if idle_hidden:
        lines.append(f"  ({idle_hidden} idle poll(s) hidden; --all shows them)\n")
    if malformed:
        lines.append(f"  ({malformed} malformed line(s) skipped)\n")
    return term_safe("".join(lines))
