"""What the morning report shows, gathered from the ledger, the fire journal, the queue and the state.

The ledger and the fire journal are read backwards and only as far as the window reaches.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.paths import Paths
from evolve.results import is_idle_poll
from evolve.status.snapshot import StatusSnapshot, load_config, read_snapshot
from evolve.store.ledger import Ledger, entry_title
from evolve.timeutil import parse_iso

MAX_ENTRIES = 5_000  # cycles in one report; older ones in the window are counted, not drawn


@dataclass
class Cycle:
    entry: dict[str, Any]
    end: float
    start: float

    @property
    def result(self) -> str:
        r = self.entry.get("result")
        return r if isinstance(r, str) else "unknown"


@dataclass
class FireSpan:
    fire_id: str
    start: float
    end: float
    reason: str = ""
    halt: str | None = None
    halt_detail: str | None = None
    cycles: int = 0
    exit_code: int | None = None
    cost_usd: float = 0.0
    journaled: bool = False


@dataclass
class ReportData:
    repo: str
    since: float
    now: float
    status: StatusSnapshot
    cycles: list[Cycle] = field(default_factory=list)
    truncated: int = 0
    fires: list[FireSpan] = field(default_factory=list)
    parked: list[dict[str, Any]] = field(default_factory=list)
    blocked: list[dict[str, Any]] = field(default_factory=list)
    heavy_pct: float = 40.0
    idle_polls: int = 0  # passes that found no work: counted, not drawn or listed as cycles
    run_logs: dict[int, Path] = field(default_factory=dict)  # cycle -> its agent run log, when still kept
    stranded: list[dict[str, Any]] = field(default_factory=list)  # claims and cycles no running fire owns
    set_aside: list[dict[str, Any]] = field(default_factory=list)  # refs/evolve/<kind>/...: one row each
    pending: list[str] = field(default_factory=list)  # hand-offs waiting for the next fire

    @property
    def done(self) -> list[Cycle]:
        return [c for c in self.cycles if c.result in ("improved", "harvested")]

    @property
    def handoffs(self) -> list[Cycle]:
        return [c for c in self.cycles if c.result == "context-handoff"]

    @property
    def halts(self) -> list[FireSpan]:
        return [f for f in self.fires if f.halt]

    def counts(self) -> Counter[str]:
        return Counter(c.result for c in self.cycles)

    def cost(self) -> float:
        return sum(_num(c.entry.get("cost_usd")) or 0.0 for c in self.cycles)


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not abs(v) < 1e15:
        return None
    return float(v)


def _window_entries(ledger: Ledger, since: float) -> tuple[list[dict[str, Any]], int]:
    out: list[dict[str, Any]] = []
    skipped = 0
    for e in ledger.scan_back():
        ts = parse_iso(e.get("timestamp"))
        if ts is None:
            continue
        if ts < since:
            break
        if len(out) >= MAX_ENTRIES:
            skipped += 1
            continue
        out.append(e)
    out.reverse()
    return out, skipped


def _journal(paths: Paths, since: float) -> list[dict[str, Any]]:
    out = []
    for rec in Ledger(paths.fires).scan_back():
        ts = parse_iso(rec.get("ended_at"))
        if ts is None:
            continue
        if ts < since:
            break
        out.append(rec)
        if len(out) >= MAX_ENTRIES:
            break
    out.reverse()
    return out


def _fires(cycles: list[Cycle], journal: list[dict[str, Any]]) -> list[FireSpan]:
    by_id: dict[str, list[Cycle]] = {}
    for c in cycles:
        fid = c.entry.get("fire_id")
        if isinstance(fid, str) and fid:
            by_id.setdefault(fid, []).append(c)
    spans: list[FireSpan] = []
    seen = set()
    for rec in journal:
        fid = str(rec.get("fire_id") or "")
        end = parse_iso(rec.get("ended_at")) or 0.0
        mine = by_id.get(fid, [])
        start = min([c.start for c in mine] + [end])
        cost = _num(rec.get("cost_usd")) or 0.0
        code = rec.get("exit_code")
        spans.append(FireSpan(
            fire_id=fid, start=start, end=end, reason=str(rec.get("reason") or ""),
            halt=rec.get("halt") if isinstance(rec.get("halt"), str) else None,
            halt_detail=str(rec["halt_detail"]) if rec.get("halt_detail") else None,
            cycles=rec.get("cycles") if isinstance(rec.get("cycles"), int) else len(mine),
            exit_code=code if isinstance(code, int) else None, cost_usd=cost, journaled=True,
        ))
        seen.add(fid)
    for fid, mine in by_id.items():
        if fid in seen:
            continue  # fires from before the journal existed, or run without observers
        last = mine[-1]
        spans.append(FireSpan(
            fire_id=fid, start=min(c.start for c in mine), end=max(c.end for c in mine),
            reason="context-handoff" if last.result == "context-handoff" else "",
            cycles=len(mine), cost_usd=sum(_num(c.entry.get("cost_usd")) or 0.0 for c in mine),
        ))
    spans.sort(key=lambda f: (f.start, f.end))
    return spans


def _parked(paths: Paths, cycles: list[Cycle], parked_refs: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ref in parked_refs:
        out.append({"ref": str(ref), "why": "context hand-off (resumes in a fresh session)", "source": "session"})
    for c in cycles:
        disp = c.entry.get("disposition")
        if c.result == "scout" and isinstance(disp, str):
            out.append({"ref": str(c.entry.get("work_ref") or ""), "title": entry_title(c.entry),
                        "why": f"scout: {disp}", "source": str(c.entry.get("selected_source") or ""),
                        "cycle": c.entry.get("cycle")})
        scouted = c.entry.get("scouted")
        for s in scouted if isinstance(scouted, list) else []:
            if isinstance(s, dict):
                out.append({"ref": str(s.get("ref") or ""), "why": f"scout: {s.get('disposition')}",
                            "cycle": c.entry.get("cycle"), "source": "scout"})
        if c.result == "quarantined":
            out.append({"ref": str(c.entry.get("work_ref") or ""), "title": entry_title(c.entry),
                        "why": f"quarantined goal ({c.entry.get('oscillations')} flips)", "cycle": c.entry.get("cycle"),
                        "source": "goal"})
    try:
        from evolve.work.harvested import entry_items, item_ref, read_entries

        for obj in read_entries(paths.nextwork):
            for it in entry_items(obj):
                disp = it.get("disposition")
                if it.get("status") == "blocked" or (isinstance(disp, str) and disp.startswith("defer:")):
                    out.append({"ref": item_ref(obj, it), "title": str(it.get("title") or ""),
                                "why": str(it.get("note") or it.get("park_note") or disp or "blocked"),
                                "source": "harvested"})
    except (OSError, ImportError):
        pass
    seen = set()
    unique = []
    for p in out:
        key = (p["ref"], p["why"])
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique[:500]


def _blocked(paths: Paths, since: float) -> list[dict[str, Any]]:
    out = []
    for rec in Ledger(paths.blocked).scan_back():
        ts = parse_iso(rec.get("timestamp"))
        if ts is None:
            continue
        if ts < since or len(out) >= 200:
            break
        out.append(rec)
    out.reverse()
    return out


def _run_logs(paths: Paths, cycles: list[Cycle]) -> dict[int, Path]:
    """Each window cycle's run log (``runs/cycle-N.log``) that retention has not pruned yet."""
    out: dict[int, Path] = {}
    for c in cycles:
        n = c.entry.get("cycle")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            log = paths.runs_dir / f"cycle-{n}.log"
            if log.is_file():
                out[n] = log
    return out


def _stranded(paths: Paths, snap: StatusSnapshot) -> list[dict[str, Any]]:
    """Work that no running fire owns: what a dead fire left claimed or mid-cycle, and queue claims.

    Nothing is stranded while a fire holds the lock (it owns them all); the next fire recovers the
    cycle and finalizes or releases its claim, and a queue claim of another tool is taken over once stale.
    """
    if snap.running:
        return []
    out: list[dict[str, Any]] = []
    if snap.active_cycle:
        a = snap.active_cycle
        out.append({"ref": str(a.get("work_ref") or ""), "title": str(a.get("title") or ""),
                    "what": f"cycle {a.get('cycle')} was cut off in its {a.get('phase') or '?'} phase; "
                            "the next fire recovers it", "since": str(a.get("written_at") or "")})
    if snap.claimed_work:
        w = snap.claimed_work
        out.append({"ref": str(w.get("ref") or ""), "title": str(w.get("title") or ""),
                    "what": f"claimed by a fire that ended without finishing it ({w.get('source') or '?'}); "
                            "the next fire finalizes or releases it", "since": str(w.get("claimed_at") or "")})
    try:
        from evolve.work.harvested import entry_items, item_ref, read_entries

        for obj in read_entries(paths.nextwork):
            for it in entry_items(obj):
                if it.get("claim_status") == "in_progress" and it.get("claim_held"):
                    continue  # held for green commits waiting to land: listed under what waits, not stranded
                if it.get("claim_status") == "in_progress" and len(out) < 200:
                    # Queue lines are untrusted: every text is cut short (the page escapes and redacts it).
                    out.append({"ref": item_ref(obj, it)[:300], "title": str(it.get("title") or "")[:200],
                                "what": f"claimed in the queue by {str(it.get('claimed_by') or '?')[:100]}, "
                                        "no fire running", "since": str(it.get("claimed_at") or "")[:40]})
    except (OSError, ImportError):
        pass
    return _by_ref(out)


def set_aside_rows(snap: StatusSnapshot, commits: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
    """One row per ref evolve keeps under refs/evolve/ (pure): what it holds, its age, superseded, and the
    command that deals with it. ``commits``: :func:`evolve.status.setaside.commits` (the ages)."""
    from evolve.status.setaside import WHAT

    rows = []
    for a in snap.set_aside_refs:
        c = commits.get(a.ref)
        at = getattr(c, "committed_at", None)
        if a.kind == "pending":
            todo = "lands at the next fire once your checkout's changes are out of its paths"
        elif a.kind == "applied":
            todo = f"`evolve setaside drop {a.short}` once you kept what you want"
        elif a.superseded_by is not None:
            todo = f"`evolve setaside drop {a.short}` (no longer needed)"
        elif a.needs_operator:
            todo = (f"`evolve setaside apply {a.short}` to review it in your checkout, "
                    f"or `evolve setaside drop {a.short}`")
        else:
            todo = f"the item is retried; `evolve setaside show {a.short}`, then apply or drop"
        rows.append({"kind": a.kind, "ref": a.ref, "what": WHAT.get(a.kind, a.kind),
                     "cycle": a.origin_cycle if a.origin_cycle is not None else a.cycle, "item": a.work_ref or "",
                     "age_s": None if at is None else max(0.0, now - at),
                     "superseded": "" if a.superseded_by is None else f"by cycle {a.superseded_by}",
                     "needs_operator": a.needs_operator, "todo": todo})
    return rows


def _set_aside(paths: Paths, snap: StatusSnapshot, now: float) -> list[dict[str, Any]]:
    """The set-aside table, whether or not a fire runs; the ages take one ``git for-each-ref``."""
    if not snap.set_aside_refs:
        return []
    from evolve.status.setaside import commits

    return set_aside_rows(snap, commits(paths.repo), now)


def _by_ref(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per work item: a killed fire strands its cycle, its claim record and its queue claim at once."""
    merged: dict[str, dict[str, Any]] = {}
    for r in rows:
        m = merged.setdefault(r["ref"], {**r, "what": []})
        m["what"].append(r["what"])
        m["since"] = m["since"] or r["since"]
    return [{**m, "what": "; ".join(m["what"])} for m in merged.values()]


def _pending(paths: Paths, snap: StatusSnapshot) -> list[str]:
    out = []
    marker = snap.markers.get("HANDOFF")
    if marker is not None:
        action = next((ln for ln in marker.content.splitlines() if ln.startswith("next-action:")), "")
        out.append("context hand-off pending: the next fire starts a fresh session"
                   + (f" ({action})" if action else ""))
    from evolve.harness.handoff import pending

    req = pending(paths)
    if req is not None:
        what = f"evolve handoff {req.mode}" + (f" — {req.purpose}" if req.purpose else "")
        out.append(f"operator hand-off pending: {what}, requested {req.requested_at or '?'} "
                   f"({req.artifact.name}); the next cycle uses it")
    return out


def build(paths: Paths, *, since: float, now: float | None = None, env: Mapping[str, str] | None = None
          ) -> ReportData:
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    loaded = load_config(paths, env)  # once: the snapshot and the context threshold both need it
    snap = read_snapshot(paths, recent=5, env=env, now=now, probe_schedule=False, config=loaded)
    entries, skipped = _window_entries(Ledger(paths.ledger), since)
    cycles = []
    idle = 0
    for e in entries:
        if is_idle_poll(e):
            idle += 1
            continue
        end = parse_iso(e.get("timestamp")) or now
        dur = _num(e.get("duration_s")) or 0.0
        cycles.append(Cycle(entry=e, end=end, start=max(since, end - max(dur, 0.0))))
    return ReportData(
        repo=str(paths.repo),
        since=since,
        now=now,
        status=snap,
        cycles=cycles,
        truncated=skipped,
        fires=_fires(cycles, _journal(paths, since)),
        parked=_parked(paths, cycles, list(snap.parked_work or [])),
        blocked=_blocked(paths, since),
        heavy_pct=float(loaded[0].context.heavy_pct),
        idle_polls=idle,
        run_logs=_run_logs(paths, cycles),
        stranded=_stranded(paths, snap),
        set_aside=_set_aside(paths, snap, now),
        pending=_pending(paths, snap),
    )
