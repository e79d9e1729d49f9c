"""A repository state with every kind of ledger entry, fires, hand-offs and halts (for status, history,
metrics and the morning report)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from support import Env

from evolve.timeutil import utc_iso

USAGE = {"input_tokens": 1200, "output_tokens": 300, "cache_read_input_tokens": 40000,
         "cache_creation_input_tokens": 2000}


def _agent(duration: float, cost: float, pct: float, heavy: bool = False, signal: str = "",
           mode: str = "first", turns: int = 7) -> dict[str, Any]:
    return {"duration_s": duration, "num_turns": turns, "cost_usd": cost, "usage": USAGE, "context_pct": pct,
            "context_heavy": heavy, "context_signal": signal if heavy else "", "agent_mode": mode}


def every_kind(now: float) -> list[dict[str, Any]]:
    """Sixteen entries over the last ~20 hours, oldest first; every result of docs/DESIGN.md §3."""
    t0 = now - 20 * 3600

    def base(cycle: int, minutes: float, result: str, target: str, source: str, ref: str | None, mode: str,
             fire: str, session: str | None = "sess-a") -> dict[str, Any]:
        return {"cycle": cycle, "result": result, "timestamp": utc_iso(t0 + minutes * 60), "target": target,
                "selected_source": source, "work_ref": ref, "mode": mode, "session_id": session, "fire_id": fire}

    e = []
    e.append({**base(1, 10, "improved", "fix the parser", "harvested", "h:parser", "harvested:bug", "fire-01"),
              **_agent(420, 0.42, 31.0), "sha": "a1b2c3d4e5f6a7b8", "goals_passing": 5, "goals_total": 8,
              "summary": "fixed the parser"})
    e.append({**base(2, 22, "scout", "split the big refactor", "harvested", "h:refactor", "harvested:task",
                     "fire-01"), **_agent(180, 0.20, 45.0, True, "scout:context-too-heavy", "continuation"),
              "disposition": "context-too-heavy"})
    e.append({**base(3, 35, "harvested", "write follow-ups", "beads", "bd-12", "beads:task", "fire-01"),
              **_agent(240, 0.31, 52.0, True, "occupancy", "returning")})
    e.append({**base(4, 36, "context-handoff", "write follow-ups", "beads", "bd-12", "context-handoff",
                     "fire-01"), "milestone": "Context-handoff after 2 heavy cycles. Parked: [\"h:refactor\"]. "
              "Next cron-fire (compacted/fresh) resumes.", "parked_work": ["h:refactor"], "context_streak": 2})
    e.append({**base(5, 65, "improved", "add the goal check", "goal", "goal:lint", "goal:lint", "fire-02",
                     "sess-b"), **_agent(600, 0.55, 22.0), "sha": "b2c3d4e5f6a7b8c9", "goals_passing": 6,
              "goals_total": 8})
    e.append({**base(6, 80, "unchanged", "idle", "idle", None, "idle", "fire-02", "sess-b")})
    e.append({**base(7, 125, "unchanged", "tidy docs", "harvested", "h:docs", "harvested:docs", "fire-03",
                     "sess-b"), **_agent(90, 0.08, 12.0, mode="returning"), "downgraded_from": "improved"})
    e.append({**base(8, 126, "unchanged", "tidy docs", "metronome-gate-blocked", "h:docs", "harvested:docs",
                     "fire-03", "sess-b"), "reason": "same mode five times"})
    e.append({**base(9, 185, "regressed", "speed up the cache", "harvested", "h:cache", "harvested:improvement",
                     "fire-04", "sess-b"), **_agent(900, 0.91, 38.0, mode="returning"), "gate": "FAIL",
              "goals_passing": 6, "goals_total": 8})
    e.append({**base(10, 200, "quarantined", "flaky goal", "goal", "goal:flaky", "goal:flaky", "fire-04",
                     "sess-b"), "oscillations": 3})
    e.append({**base(11, 245, "failed", "deploy docs", "harvested", "h:deploy", "harvested:chore", "fire-05",
                     "sess-c"), **_agent(30, 0.02, 5.0), "error_class": "transient", "error": "overloaded"})
    e.append({**base(12, 246, "failed", "deploy docs", "harvested", "h:deploy", "harvested:chore", "fire-05",
                     "sess-c"), **_agent(1800, 0.0, 0.0), "error_class": "timeout", "error": "hard timeout"})
    e.append({**base(13, 305, "interrupted", "deploy docs", "harvested", "h:deploy", "harvested:chore",
                     "fire-06", "sess-c"), **_agent(60, 0.05, 8.0), "error_class": "interrupted"})
    e.append({**base(14, 360, "crashed", "deploy docs", "harvested", "h:deploy", "crashed", "fire-06", "sess-c"),
              "error_class": "crashed", "crashed_fire_pid": 4242})
    e.append({**base(15, 900, "improved", "ship the cache", "harvested", "h:cache2", "harvested:improvement",
                     "fire-09", "sess-d"), **_agent(500, 0.66, 35.0), "sha": "c3d4e5f6a7b8c9d0",
              "goals_passing": 7, "goals_total": 8, "summary": "cache shipped"})
    e.append({**base(16, 1150, "improved", "close the loop", "beads", "bd-14", "beads:feature", "fire-10",
                     "sess-d"), **_agent(300, 0.37, 41.0, True, "occupancy", "continuation"),
              "sha": "d4e5f6a7b8c9d0e1", "goals_passing": 8, "goals_total": 8})
    return e


def journal(now: float) -> list[dict[str, Any]]:
    t0 = now - 20 * 3600

    def fire(fid: str, minutes: float, reason: str, cycles: int, cost: float = 0.0, halt: str | None = None,
             detail: str | None = None, code: int = 0) -> dict[str, Any]:
        return {"fire_id": fid, "ended_at": utc_iso(t0 + minutes * 60), "reason": reason, "halt": halt,
                "halt_detail": detail, "cycles": cycles, "exit_code": code, "cost_usd": cost}

    return [
        fire("fire-01", 36.5, "context-handoff", 3, 0.93),
        fire("fire-02", 81, "idle", 2, 0.55),
        fire("fire-03", 127, "metronome_blocked", 1, 0.08),
        fire("fire-04", 201, "max_cycles", 1, 0.91),
        fire("fire-05", 247, "breaker_open", 2, 0.02),
        fire("fire-06", 361, "interrupted", 1, 0.05, code=143),
        fire("fire-07", 480, "halt:user_halt", 0, halt="user_halt", detail="operator at lunch"),
        fire("fire-08", 600, "halt:breaker_open", 0, halt="breaker_open", detail="open for 600s more"),
        fire("fire-09", 901, "max_cycles", 1, 0.66),
        fire("fire-10", 1151, "max_cycles", 1, 0.37),
    ]


def write_every_kind(env: Env, now: float | None = None) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    p = env.paths
    p.evolve_dir.mkdir(parents=True, exist_ok=True)
    entries = every_kind(now)
    with open(p.ledger, "wb") as fh:
        for e in entries:
            fh.write(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE))
    with open(p.evolve_dir / "fires.jsonl", "wb") as fh:
        for r in journal(now):
            fh.write(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE))
    p.state.write_bytes(orjson.dumps({
        "context_streak": 1, "parked_work": ["h:refactor"], "last_result": "improved", "last_logged_cycle": 16,
        "consecutive_failures": 0, "breaker_open_until": None, "fire": None,
        "agent_session": {"id": "sess-d", "runner": "command", "started_cycle": 15, "last_cycle": 16,
                          "need_ref": "bd-14", "events_since": 0, "ended_heavy": False, "summary": "closing"},
        "someone_elses_key": {"kept": True},
    }))
    p.nextwork.parent.mkdir(parents=True, exist_ok=True)
    with open(p.nextwork, "wb") as fh:
        fh.write(orjson.dumps({"source_epic": "e9", "timestamp": utc_iso(now - 3600), "items": [
            {"title": "ready one", "type": "bug", "severity": "high", "source": "council-finding"},
            {"title": "ready two", "type": "task", "severity": "low", "source": "council-finding"},
            {"title": "too big", "type": "task", "severity": "low", "status": "blocked",
             "note": "scope too big; needs operator triage"},
            {"title": "later", "type": "task", "severity": "low", "disposition": "defer:waiting for upstream"},
        ]}, option=orjson.OPT_APPEND_NEWLINE))
    (p.evolve_dir / "fitness-latest.json").write_bytes(orjson.dumps(
        {"timestamp": utc_iso(now), "git_sha": "d4e5f6", "goals": [],
         "summary": {"total": 8, "passing": 6, "failing": 2, "skipped": 0, "score": 0.75}}))
    with open(p.blocked, "wb") as fh:
        fh.write(orjson.dumps({"cycle": 6, "timestamp": utc_iso(now - 18 * 3600), "reason": "queue empty",
                               "needed_context": "operator adds work"}, option=orjson.OPT_APPEND_NEWLINE))
    return entries
