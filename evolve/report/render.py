"""The report as one HTML file: inline CSS and inline SVG, no scripts, no external references.

A Content-Security-Policy meta tag (``default-src 'none'``) makes sure that nothing the page shows —
work item titles, agent summaries — can make the browser fetch anything, even if it tried.
"""

from __future__ import annotations

import html
import math
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve import redact
from evolve.report.data import Cycle, FireSpan, ReportData
from evolve.store.ledger import entry_title
from evolve.timeutil import human_s

COLORS = {
    "improved": "#2e9e44",
    "pending": "#8fbf4a",
    "harvested": "#1f77b4",
    "unchanged": "#a0a0a0",
    "scout": "#ff9f1c",
    "context-handoff": "#8e44ad",
    "quarantined": "#b8860b",
    "regressed": "#e03131",
    "failed": "#a61e1e",
    "interrupted": "#6c757d",
    "crashed": "#111111",
}
OTHER = "#cccccc"
HALT = "#e03131"
RESULT_ORDER = tuple(COLORS)

W = 1100  # drawing width of every chart
LEFT = 70
RIGHT = 20


def t(value: Any) -> str:
    """Escaped, secret-free text for element content and attribute values.

    Redacted before escaping: an escaped secret (``&amp;`` in a URL) would no longer match.
    """
    text = "" if value is None else str(value)
    text = redact.current().text(text)
    return html.escape(text, quote=True)


def _utc(ts: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return time.strftime(fmt, time.gmtime(ts))


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _num(v: object) -> float | None:
    """A plottable number: finite and of a sane size (hostile ledgers carry 1e308), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v) if abs(v) < 1e15 else math.inf
    return f if math.isfinite(f) else None


def color(result: str) -> str:
    return COLORS.get(result, OTHER)


# -- axes ------------------------------------------------------------------------------------

_TICKS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
          2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400)


def time_ticks(t0: float, t1: float, want: int = 8) -> list[float]:
    span = max(t1 - t0, 1.0)
    step = next((s for s in _TICKS if span / s <= want), _TICKS[-1])
    first = math.ceil(t0 / step) * step
    out = []
    x = first
    while x <= t1:
        out.append(float(x))
        x += step
    return out


MIN_SPAN_S = 600  # a fitted timeline shows at least ten minutes: one short cycle is not a full-width bar


def fit_window(since: float, now: float, spans: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The timeline's range: the data's (every fire and cycle), padded by 4 % a side, inside [since, now].

    A 24-hour window with one hour of fires would otherwise draw them as a sliver at one edge. With
    no data it is the whole window, which the empty chart then says.
    """
    if not spans:
        return since, now
    lo = max(since, min(a for a, _ in spans))
    hi = min(now, max(b for _, b in spans))
    pad = max(hi - lo, MIN_SPAN_S) * 0.04
    t0, t1 = max(since, lo - pad), min(now, hi + pad)
    if t1 - t0 < MIN_SPAN_S:  # widen around the data, as far as the window allows
        extra = MIN_SPAN_S - (t1 - t0)
        t1 = min(now, t1 + extra / 2)
        t0 = max(since, t1 - MIN_SPAN_S)
        t1 = min(now, t0 + MIN_SPAN_S)
    return t0, t1


def nice_ticks(vmax: float, *, integer: bool = False, want: int = 4) -> tuple[list[float], int]:
    """Axis ticks from 0 that cover ``vmax`` in at most ``want`` nice steps (1, 2, 2.5 or 5 times a power
    of ten; whole numbers only when ``integer``), and the decimals that show every tick exactly.

    ``$0.06, $0.12, $0.19`` (a quarter of a nice maximum) becomes ``$0.05, $0.10, $0.15, $0.20``, and a
    goals axis of 2 reads ``0, 1, 2``, not ``0, 0, 1, 2, 2``.
    """
    if not vmax > 0 or not math.isfinite(vmax):
        vmax = 1.0
    raw = vmax / want
    exp = math.floor(math.log10(raw))
    mantissas = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * 10.0**exp for m in mantissas if m * 10.0**exp >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, round(step))
    n = max(1, math.ceil(vmax / step - 1e-9))
    ticks = [round(i * step, 12) for i in range(n + 1)]
    decimals = 0 if integer else max(0, -math.floor(math.log10(step) + 1e-9))
    if not integer and not all(abs(v * 10**decimals - round(v * 10**decimals)) < 1e-6 for v in ticks):
        decimals += 1  # a 2.5 step: 0.025, 0.05, 0.075
    return ticks, decimals


# -- the timeline ------------------------------------------------------------------------------


def timeline_svg(d: ReportData) -> str:
    h = 190
    spans = [(f.start, f.end) for f in d.fires] + [(c.start, c.end) for c in d.cycles]
    t0, t1 = fit_window(d.since, d.now, spans)
    span = max(t1 - t0, 1.0)
    inner = W - LEFT - RIGHT

    def x(ts: float) -> float:
        return LEFT + (min(max(ts, t0), t1) - t0) / span * inner

    lane_fire, lane_cycle, lane_event, axis_y = 22, 62, 112, 150
    out = [f'<svg id="timeline" class="chart" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" '
           f'aria-label="timeline of fires and cycles">']
    for label, y in (("fires", lane_fire + 9), ("cycles", lane_cycle + 14), ("events", lane_event + 4)):
        out.append(f'<text class="lane" x="{LEFT - 8}" y="{y + 4}" text-anchor="end">{label}</text>')
        out.append(f'<line class="lanebg" x1="{LEFT}" x2="{W - RIGHT}" y1="{y}" y2="{y}"/>')
    for tick in time_ticks(t0, t1):
        xx = x(tick)
        fmt = "%m-%d" if (t1 - t0) > 3 * 86400 else "%H:%M"
        if fmt == "%H:%M" and tick % 86400 == 0:
            fmt = "%m-%d"
        out.append(f'<line class="grid" x1="{xx:.1f}" x2="{xx:.1f}" y1="10" y2="{axis_y}"/>')
        out.append(f'<text class="tick" x="{xx:.1f}" y="{axis_y + 16}" text-anchor="middle">'
                   f'{_utc(tick, fmt)}</text>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{axis_y}" y2="{axis_y}"/>')
    shown = f"{_utc(t0)} – {_utc(t1, '%H:%M' if t1 - t0 < 86400 else '%Y-%m-%d %H:%M')} UTC"
    if (t0, t1) != (d.since, d.now):
        shown += f" (fitted to the data; the window is {_utc(d.since)} – {_utc(d.now)})"
    out.append(f'<text class="tick range" x="{W - RIGHT}" y="{axis_y + 34}" text-anchor="end">{t(shown)}</text>')
    for f in d.fires:
        x0, x1 = x(f.start), x(f.end)
        cls = "fire f-halt" if f.halt else "fire f-handoff" if f.reason == "context-handoff" else "fire"
        tip = (f"fire {f.fire_id}: {_utc(f.start)}–{_utc(f.end, '%H:%M')} UTC, {f.cycles} cycle(s), "
               f"end: {f.reason or '?'}" + (f" ({f.halt_detail})" if f.halt_detail else "")
               + (f", ${f.cost_usd:.2f}" if f.cost_usd else ""))
        out.append(f'<rect class="{cls}" data-fire="{t(f.fire_id)}" x="{x0:.1f}" y="{lane_fire}" '
                   f'width="{max(x1 - x0, 4):.1f}" height="18" rx="3"><title>{t(tip)}</title></rect>')
    for c in d.cycles:
        x0, x1 = x(c.start), x(c.end)
        e = c.entry
        bits = [f"cycle {e.get('cycle')} {c.result}", entry_title(e) or str(e.get("target") or "")]
        if _num(e.get("duration_s")) is not None:
            bits.append(_dur(_num(e.get("duration_s"))))
        if _num(e.get("cost_usd")) is not None:
            bits.append(f"${_num(e.get('cost_usd')):.2f}")
        if _num(e.get("context_pct")) is not None:
            bits.append(f"context {_num(e.get('context_pct')):.0f}%")
        if e.get("error_class"):
            bits.append(f"error {e['error_class']}")
        if e.get("gate_detail"):
            bits.append(f"gate: {e['gate_detail']}")
        out.append(f'<rect class="cycle r-{t(c.result)}" data-cycle="{t(e.get("cycle"))}" data-result="{t(c.result)}" '
                   f'x="{x0:.1f}" y="{lane_cycle}" width="{max(x1 - x0, 3):.1f}" height="28" '
                   f'fill="{color(c.result)}"><title>{t(" · ".join(b for b in bits if b))}</title></rect>')
    for c in d.handoffs:
        xx = x(c.end)
        tip = f"context hand-off at cycle {c.entry.get('cycle')}: {c.entry.get('milestone') or ''}"
        out.append(f'<path class="marker handoff" d="M{xx - 7:.1f},{lane_event - 8} L{xx + 7:.1f},{lane_event - 8} '
                   f'L{xx:.1f},{lane_event + 6} Z" fill="{COLORS["context-handoff"]}"><title>{t(tip)}</title></path>')
    for f in d.halts:
        xx = x(f.end)
        out.append(f'<rect class="marker halt" x="{xx - 6:.1f}" y="{lane_event - 7}" width="12" height="12" '
                   f'fill="{HALT}" transform="rotate(45 {xx:.1f} {lane_event - 1})"><title>'
                   f'{t("halt: " + (f.halt or "") + (" — " + f.halt_detail if f.halt_detail else ""))}</title></rect>')
    if not d.cycles and not d.fires:
        out.append(f'<text class="empty" x="{W / 2:.0f}" y="{lane_cycle + 18}" text-anchor="middle">'
                   f'no fires or cycles in this window</text>')
    out.append("</svg>")
    return "".join(out)


def legend() -> str:
    items = [f'<span class="key"><i style="background:{c}"></i>{t(r)}</span>' for r, c in COLORS.items()]
    items.append(f'<span class="key"><i class="tri" style="border-top-color:{COLORS["context-handoff"]}"></i>'
                 f'hand-off</span>')
    items.append(f'<span class="key"><i class="dia" style="background:{HALT}"></i>halt</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


# -- per-cycle charts --------------------------------------------------------------------------


def _frame(svg_id: str, label: str, h: int, ticks: Sequence[float], fmt: Callable[[float], str], n: int,
           cycles: Sequence[Cycle]) -> list[str]:
    """The chart's box, its value axis (``ticks`` from 0 to the top, each labelled by ``fmt``) and cycle labels."""
    out = [f'<svg id="{svg_id}" class="chart" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" '
           f'aria-label="{t(label)}">']
    top, bottom = 12, h - 28
    ymax = ticks[-1]
    for v in ticks:
        y = bottom - (bottom - top) * v / ymax
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick ytick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{t(fmt(v))}</text>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    if n:
        step = max(1, math.ceil(n / 12))
        for i in range(0, n, step):
            xx = _cx(i, n)
            out.append(f'<text class="tick" x="{xx:.1f}" y="{bottom + 16}" text-anchor="middle">'
                       f'#{t(cycles[i].entry.get("cycle"))}</text>')
    return out


def _cx(i: int, n: int) -> float:
    inner = W - LEFT - RIGHT
    return LEFT + inner * (i + 0.5) / max(n, 1)


def _empty(out: list[str], h: int, text: str) -> None:
    out.append(f'<text class="empty" x="{W / 2:.0f}" y="{h / 2:.0f}" text-anchor="middle">{t(text)}</text>')


def cost_svg(d: ReportData) -> str:
    h = 220
    top, bottom = 12, h - 28
    costs = [_num(c.entry.get("cost_usd")) for c in d.cycles]
    n = len(d.cycles)
    total = 0.0
    cum = []
    for v in costs:
        total += v or 0.0
        cum.append(total)
    ticks, dec = nice_ticks(max([*cum, 0.0]) or 0.0)
    ymax = ticks[-1]
    out = _frame("cost-chart", "agent cost per cycle (bars) and cumulative (line), USD", h, ticks,
                 lambda v: f"${v:.{max(dec, 2)}f}", n, d.cycles)
    inner = W - LEFT - RIGHT
    bw = max(1.0, min(24.0, inner / max(n, 1) * 0.7))
    for i, (c, v) in enumerate(zip(d.cycles, costs, strict=True)):
        if v is None or v <= 0:
            continue
        bh = (bottom - top) * v / ymax
        tip = f"cycle {c.entry.get('cycle')}: ${v:.4f}"
        out.append(f'<rect class="bar r-{t(c.result)}" x="{_cx(i, n) - bw / 2:.1f}" y="{bottom - bh:.1f}" '
                   f'width="{bw:.1f}" height="{bh:.1f}" fill="{color(c.result)}"><title>{t(tip)}</title></rect>')
    if n and total > 0:
        pts = " ".join(f"{_cx(i, n):.1f},{bottom - (bottom - top) * v / ymax:.1f}" for i, v in enumerate(cum))
        out.append(f'<polyline class="cum" points="{pts}"><title>{t(f"cumulative ${total:.2f}")}</title></polyline>')
    else:
        _empty(out, h, "no agent cost recorded in this window")
    out.append("</svg>")
    return "".join(out)


def context_svg(d: ReportData) -> str:
    h = 220
    top, bottom = 12, h - 28
    n = len(d.cycles)
    out = _frame("context-chart", "context occupancy per cycle, percent", h, nice_ticks(100)[0],
                 lambda v: f"{v:.0f}%", n, d.cycles)
    y_heavy = bottom - (bottom - top) * min(d.heavy_pct, 100) / 100
    out.append(f'<line class="threshold" x1="{LEFT}" x2="{W - RIGHT}" y1="{y_heavy:.1f}" y2="{y_heavy:.1f}">'
               f'<title>{t(f"heavy at {d.heavy_pct:g}%")}</title></line>')
    out.append(f'<text class="thr" x="{W - RIGHT - 4}" y="{y_heavy - 4:.1f}" text-anchor="end">'
               f'heavy {d.heavy_pct:g}%</text>')
    pts = []
    for i, c in enumerate(d.cycles):
        v = _num(c.entry.get("context_pct"))
        if v is None:
            continue
        y = bottom - (bottom - top) * min(max(v, 0), 100) / 100
        pts.append(f"{_cx(i, n):.1f},{y:.1f}")
        heavy = c.entry.get("context_heavy") is True
        sig = c.entry.get("context_signal")
        tip = f"cycle {c.entry.get('cycle')}: {v:.0f}%" + (f" heavy ({sig})" if heavy else "")
        out.append(f'<circle class="pt{" heavy" if heavy else ""}" cx="{_cx(i, n):.1f}" cy="{y:.1f}" '
                   f'r="{5 if heavy else 3.5}"><title>{t(tip)}</title></circle>')
    if pts:
        out.insert(len(out) - len(pts), f'<polyline class="ctx" points="{" ".join(pts)}"/>')
    else:
        _empty(out, h, "no context readings in this window")
    for c in d.handoffs:
        i = d.cycles.index(c)
        tip = f"hand-off at cycle {c.entry.get('cycle')}"
        out.append(f'<line class="handoffline" x1="{_cx(i, n):.1f}" x2="{_cx(i, n):.1f}" y1="{top}" y2="{bottom}">'
                   f'<title>{t(tip)}</title></line>')
    out.append("</svg>")
    return "".join(out)


def goals_svg(d: ReportData) -> str:
    h = 200
    top, bottom = 12, h - 28
    n = len(d.cycles)
    carrying = [(i, c) for i, c in enumerate(d.cycles)
                if _num(c.entry.get("goals_passing")) is not None and _num(c.entry.get("goals_total"))]
    ticks, _ = nice_ticks(max([_num(c.entry.get("goals_total")) or 0 for _, c in carrying] + [1.0]), integer=True)
    ymax = ticks[-1]
    out = _frame("goals-chart", "goals passing per cycle", h, ticks, lambda v: f"{v:.0f}", n, d.cycles)
    pts = []
    for i, c in carrying:
        p, tot = _num(c.entry.get("goals_passing")) or 0, _num(c.entry.get("goals_total")) or 0
        y = bottom - (bottom - top) * p / ymax
        yt = bottom - (bottom - top) * tot / ymax
        pts.append(f"{_cx(i, n):.1f},{y:.1f}")
        out.append(f'<line class="total" x1="{_cx(i, n) - 6:.1f}" x2="{_cx(i, n) + 6:.1f}" y1="{yt:.1f}" '
                   f'y2="{yt:.1f}"/>')
        tip = f"cycle {c.entry.get('cycle')}: {p:.0f}/{tot:.0f} passing"
        out.append(f'<circle class="goal r-{t(c.result)}" cx="{_cx(i, n):.1f}" cy="{y:.1f}" r="4" '
                   f'fill="{color(c.result)}"><title>{t(tip)}</title></circle>')
    if pts:
        out.insert(len(out) - 2 * len(pts), f'<polyline class="goals" points="{" ".join(pts)}"/>')
    else:
        _empty(out, h, "no goal measurements in this window")
    out.append("</svg>")
    return "".join(out)


# -- tables and the page -----------------------------------------------------------------------


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """A table in its own horizontally scrolling box: a narrow window scrolls the table, not the page."""
    if not rows:
        return '<p class="none">none</p>'
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="tw"><table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def _badge(result: str) -> str:
    return f'<span class="badge" style="background:{color(result)}">{t(result)}</span>'


def red_note(e: Mapping[str, Any]) -> str:
    """Why a cycle went red, in a cycle's note: the failing command and its output's last line."""
    if not e.get("gate_detail"):
        return ""
    last = next((ln for ln in reversed(str(e.get("gate_output") or "").splitlines()) if ln.strip()), "")
    return f"gate: {e['gate_detail']}" + (f" — {last.strip()[:120]}" if last else "")


WHY_CAP = 400  # characters of a cycle's gate detail or error in the table (the run log has the rest)


def why(e: Mapping[str, Any]) -> str:
    """Why a cycle went the way it did: the failing gate/goal command and its output's last line
    (:func:`red_note`), then the agent's error."""
    parts = [red_note(e)] if e.get("gate_detail") else []
    parts += [str(e["error"]).strip()] if isinstance(e.get("error"), str) and e["error"].strip() else []
    text = " · ".join(dict.fromkeys(parts))
    return text if len(text) <= WHY_CAP else text[: WHY_CAP - 1] + "…"


def log_link(log: Path | None, links_from: Path | None) -> str:
    """A relative link from the report's directory to a run log (no scheme, nothing the page fetches), or
    the log's path as text when the report has no place on disk (``-o -``)."""
    if log is None:
        return ""
    if links_from is None:
        return f'<span class="path">{t(log)}</span>'
    rel = os.path.relpath(log, links_from)
    href = urllib.parse.quote(rel.replace(os.sep, "/"), safe="/")
    return f'<a class="log" href="{t(href)}" title="{t(log)}">log</a>'


def _cycle_row(c: Cycle, log: Path | None = None, links_from: Path | None = None) -> list[str]:
    e = c.entry
    cost = _num(e.get("cost_usd"))
    pct = _num(e.get("context_pct"))
    goals = f"{e['goals_passing']}/{e['goals_total']}" if _num(e.get("goals_passing")) is not None else ""
    note = " ".join(str(x) for x in (e.get("error_class"), e.get("disposition"), e.get("milestone")) if x)
    reason = why(e)
    return [
        t(e.get("cycle")), t(_utc(c.end, "%m-%d %H:%M")), _badge(c.result), t(entry_title(e) or e.get("target")),
        t(e.get("selected_source")), t(_dur(_num(e.get("duration_s")))), "" if cost is None else t(f"${cost:.2f}"),
        "" if pct is None else t(f"{pct:.0f}%"), t(goals), t(note[:200]),
        f'<div class="why">{t(reason)}</div>' if reason else "", log_link(log, links_from),
    ]


def _fire_row(f: FireSpan) -> list[str]:
    end = f.reason or ("?" if f.journaled else "(not journaled)")
    return [t(_utc(f.start, "%m-%d %H:%M")), t(_dur(f.end - f.start)), t(f.fire_id), t(f.cycles),
            f'<span class="{"halt" if f.halt else ""}">{t(end)}</span>', t(f.halt_detail or ""),
            t("" if f.exit_code is None else f.exit_code), t(f"${f.cost_usd:.2f}" if f.cost_usd else "")]


CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;background:#f6f7f9;
color:#1d2330}
main{max-width:1160px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dde1e7;padding-bottom:4px}
.meta{color:#596274;margin:0}
.health{display:inline-block;padding:3px 10px;border-radius:4px;color:#fff;font-weight:600;margin-top:8px}
.healthy{background:#2e9e44}.degraded{background:#d98e04}.halted{background:#e03131}
.reasons{margin:6px 0 0;color:#3a4150}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:14px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:22px}.card span{color:#596274;font-size:12px}
.chart{background:#fff;border:1px solid #dde1e7;border-radius:6px;display:block;max-width:100%;height:auto}
.lane{font-size:12px;fill:#596274}.tick{font-size:11px;fill:#596274}.empty{font-size:14px;fill:#8a93a3}
.lanebg{stroke:#eef0f3;stroke-width:18}.grid{stroke:#eef0f3}.axis{stroke:#9aa3b2}
.fire{fill:#3d8fb3}.f-handoff{fill:#8e44ad}.f-halt{fill:#e03131}
.cum{fill:none;stroke:#1d2330;stroke-width:2}.ctx{fill:none;stroke:#3d8fb3;stroke-width:1.5}
.pt{fill:#3d8fb3}.pt.heavy{fill:#e03131}
.threshold{stroke:#e03131;stroke-dasharray:6 4}.thr{font-size:11px;fill:#e03131}
.handoffline{stroke:#8e44ad;stroke-dasharray:3 3}
.goals{fill:none;stroke:#2e9e44;stroke-width:2}.total{stroke:#596274;stroke-width:2}
.legend{margin:8px 0 0;display:flex;flex-wrap:wrap;gap:12px;font-size:12px;color:#3a4150}
.key i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.key i.tri{width:0;height:0;border-left:7px solid transparent;border-right:7px solid transparent;
border-top:12px solid;border-radius:0;background:none}
.key i.dia{transform:rotate(45deg) scale(.8)}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e7;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{background:#eef0f3;font-weight:600}
.badge{color:#fff;border-radius:3px;padding:1px 6px;font-size:12px;white-space:nowrap}
span.halt{color:#e03131;font-weight:600}.none{color:#8a93a3}
footer{margin-top:30px;color:#8a93a3;font-size:12px}
h3{font-size:15px;margin:14px 0 6px}
.pending{margin:8px 0 0;padding:8px 12px 8px 28px;background:#fff4e0;border:1px solid #f0c36d;border-radius:6px}
.tw,.cw{overflow-x:auto;max-width:100%}.tw table{min-width:640px}.cw .chart{min-width:720px}
.why{white-space:pre-wrap;word-break:break-word;max-width:420px;font-size:12px;color:#8a1f1f}
.path{font-size:11px;color:#596274;word-break:break-all}
@media (max-width:700px){main{padding:12px}h1{font-size:20px}.card{min-width:96px}.card b{font-size:18px}}
"""


def _header(d: ReportData) -> list[str]:
    """The morning question first: health and why, what waits for the next fire, what is stranded, the cards."""
    st = d.status
    counts = d.counts()
    window = f"{_utc(d.since)} – {_utc(d.now)} UTC"
    cards = [
        (len(d.fires), "fires"), (len(d.cycles), "cycles"), (counts.get("improved", 0), "improved"),
        (counts.get("regressed", 0) + counts.get("failed", 0) + counts.get("crashed", 0), "regressed / failed"),
        (len(d.handoffs), "hand-offs"), (len(d.halts), "halts"), (f"${d.cost():.2f}", "agent cost"),
        (d.idle_polls, "idle polls"),
    ]
    last_goal = next((c for c in reversed(d.cycles) if _num(c.entry.get("goals_passing")) is not None), None)
    if last_goal is not None:
        cards.append((f"{last_goal.entry['goals_passing']}/{last_goal.entry.get('goals_total')}", "goals passing"))
    if d.stranded:
        cards.append((len(d.stranded), "stranded"))
    if d.set_aside:
        cards.append((len(d.set_aside), "set aside"))
    card_html = "".join(f'<div class="card"><b>{t(v)}</b><span>{t(k)}</span></div>' for v, k in cards)
    by_result = ", ".join(f"{counts[r]} {r}" for r in [*RESULT_ORDER, *sorted(set(counts) - set(RESULT_ORDER))]
                          if counts.get(r))
    reasons = "".join(f"<li>{t(r)}</li>" for r in st.reasons)
    waiting = [*d.pending]
    for w in (st.landing or {}).get("waiting") or []:  # green work that has not landed yet (issue 22)
        cycles = ", ".join(str(c) for c in w.get("cycles") or [])
        waiting.append(f"green work of cycle(s) {cycles} waits at {w.get('ref')} to land on {w.get('branch')}: "
                       f"{w.get('reason') or 'the next fire tries again'}")
    if (st.landing or {}).get("operator_busy"):
        waiting.append(f"your checkout is busy ({st.landing['operator_busy']}): no cycle runs until it ends")
    if d.stranded:
        waiting.append(f"{len(d.stranded)} stranded work item(s): see Stranded, parked and deferred")
    need = sum(1 for r in d.set_aside if r.get("needs_operator"))
    if need:
        waiting.append(f"{need} set-aside ref(s) of green work that did not land need you: see Set aside")
    return [
        f'<header id="summary"><h1>evolve — the night in one page</h1><p class="meta">{t(d.repo)} · {t(window)}'
        f' · generated {t(_utc(d.now))} UTC</p>',
        f'<div class="health {t(st.health)}">{t(st.health.upper())}</div>'
        + (f'<ul class="reasons">{reasons}</ul>' if reasons else ""),
        (f'<ul id="pending" class="pending">{"".join(f"<li>{t(w)}</li>" for w in waiting)}</ul>' if waiting else ""),
        f'<div class="cards">{card_html}</div>',
        f'<p class="meta">{t(by_result or "no cycles in this window")}</p></header>',
    ]


def _work_sections(d: ReportData, links_from: Path | None) -> list[str]:
    st = d.status
    done_rows = [[t(c.entry.get("cycle")), _badge(c.result), t(entry_title(c.entry)), t(c.entry.get("work_ref")),
                  t(str(c.entry.get("sha") or c.entry.get("commit_sha") or "")[:12]),
                  t(str(c.entry.get("summary") or "")[:240])] for c in d.done]
    stranded_rows = [[t(s.get("ref")), t(s.get("title")), t(s.get("what")), t(s.get("since"))] for s in d.stranded]
    aside_rows = [[t(r["kind"]), t(r["ref"]), t(r["what"]), t(r["cycle"] if r["cycle"] is not None else ""),
                   t(r["item"]), t(human_s(r["age_s"])), t(r["superseded"]),
                   t(r["todo"])] for r in d.set_aside]
    parked_rows = [[t(p.get("ref")), t(p.get("title", "")), t(p.get("why")), t(p.get("source", "")),
                    t(p.get("cycle", ""))] for p in d.parked]
    blocked_rows = [[t(b.get("cycle")), t(b.get("timestamp")), t(b.get("reason")), t(b.get("needed_context", ""))]
                    for b in d.blocked]
    marker_rows = [[t(name), t("sticky" if m.sticky else "non-sticky"), t(_dur(m.age_s)), t(m.effect),
                    t(m.content.splitlines()[0] if m.content else "")]
                   for name, m in st.markers.items()]
    cycle_rows = [_cycle_row(c, d.run_logs.get(c.entry.get("cycle")), links_from)  # type: ignore[arg-type]
                  for c in d.cycles]
    return [
        '<section id="done"><h2>Work done</h2>',
        _table(["cycle", "result", "title", "work ref", "commit", "summary"], done_rows),
        "</section>",
        '<section id="parked"><h2>Stranded, parked and deferred</h2>',
        ('<h3 id="stranded">Stranded: no running fire owns these</h3>'
         + _table(["ref", "title", "what", "since"], stranded_rows)) if stranded_rows else "",
        ('<h3 id="set-aside">Set aside under refs/evolve/ (`evolve setaside` lists, shows, applies, drops)</h3>'
         + _table(["kind", "ref", "what", "cycle", "item", "age", "superseded", "what to do"], aside_rows))
        if aside_rows else "",
        _table(["ref", "title", "why", "source", "cycle"], parked_rows),
        "</section>",
        '<section id="state"><h2>Now</h2>',
        _table(["marker", "kind", "age", "effect", "content"], marker_rows),
        f'<p class="meta">context streak {t(st.context_streak)}/{t(st.context_streak_limit)} · '
        f'breaker {t(st.breaker.state)} · last cycle {t(st.last_logged_cycle)} ({t(st.last_result)})</p>',
        "</section>",
        '<section id="fires"><h2>Fires</h2>',
        _table(["start (UTC)", "length", "fire", "cycles", "ended", "halt detail", "exit", "cost"],
               [_fire_row(f) for f in d.fires]),
        "</section>",
        '<section id="cycles"><h2>Cycles</h2>',
        _table(["#", "time (UTC)", "result", "target", "source", "agent", "cost", "ctx", "goals", "note", "why",
                "run log"], cycle_rows, cls="cycles"),
        "</section>",
        ('<section id="blocked"><h2>Blocked</h2>'
         + _table(["cycle", "time", "reason", "needed"], blocked_rows) + "</section>") if blocked_rows else "",
    ]


def render_html(d: ReportData, *, links_from: Path | None = None) -> str:
    """The page. ``links_from``: the directory the report is written to, for relative links to run logs."""
    truncated = (f'<p class="meta">{d.truncated} older cycle(s) in the window are not drawn.</p>'
                 if d.truncated else "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data:; form-action 'none'; base-uri 'none'\">",
        '<meta name="referrer" content="no-referrer">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>evolve report — {t(d.repo)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        *_header(d),
        '<section id="timeline-section"><h2>Timeline</h2>',
        timeline_svg(d),  # whole at any width: the night at a glance matters more than its labels
        legend(),
        truncated,
        "</section>",
        # A phone scrolls each chart sideways rather than shrinking its labels past reading.
        f'<section id="cost-section"><h2>Agent cost</h2><div class="cw">{cost_svg(d)}</div></section>',
        f'<section id="context-section"><h2>Context occupancy</h2><div class="cw">{context_svg(d)}</div></section>',
        f'<section id="goals-section"><h2>Goals trajectory</h2><div class="cw">{goals_svg(d)}</div></section>',
        *_work_sections(d, links_from),
        "<footer>evolve report · self-contained: no scripts, no external assets, nothing fetched.</footer>",
        "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
