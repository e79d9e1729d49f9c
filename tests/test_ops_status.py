"""``evolve status`` and ``evolve history`` on a repository with every kind of ledger entry: the JSON
schemas, the exit codes (0 healthy, 1 degraded, 75 halted), the text views, and tail-only reading."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from ops_fixture import every_kind, write_every_kind
from support import Env, entry

from evolve import status as statusmod
from evolve.store.ledger import Ledger
from evolve.timeutil import parse_iso, utc_iso

NUM = (int, float)
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))
OPT_DICT = (dict, type(None))

STATUS_SCHEMA: dict[str, Any] = {
    "repo": str, "health": str, "exit_code": int, "reasons": list, "halt": OPT_DICT, "running": bool,
    "pid": OPT_INT, "current": OPT_DICT, "fire": OPT_DICT, "active_cycle": OPT_DICT, "claimed_work": OPT_DICT,
    "last_logged_cycle": int, "last_result": OPT_STR, "context_streak": int, "context_streak_limit": int,
    "parked_work": list, "idle_streak": int, "consecutive_failures": int, "breaker_open_until": OPT_STR,
    "breaker": dict, "agent_session": OPT_DICT, "markers": dict, "next_fire": OPT_DICT, "cycles_today": int,
    "cost_today_usd": NUM, "cost_today_partial": bool, "autocompact": dict, "recent": list,
    "malformed_lines_seen": int, "warnings": list, "config_error": OPT_STR, "generated_at": str,
    "last_red": OPT_DICT, "parked_items": list, "metronome_blocked": OPT_DICT,  # issue 16
}
BREAKER_SCHEMA = {"state": str, "open_until": OPT_STR, "eta_s": OPT_INT, "consecutive_failures": int,
                  "max_consecutive_failures": int, "cooldown_minutes": NUM}
MARKER_SCHEMA = {"path": str, "age_s": int, "content": str, "sticky": bool, "effect": str}
STICKY_SCHEMA = {**MARKER_SCHEMA, "ttl_s": int, "ttl_left_s": int, "stale": bool}
SESSION_SCHEMA = {"id": str, "runner": str, "started_cycle": int, "last_cycle": int, "last_mode": OPT_STR,
                  "started_at": OPT_STR, "age_s": OPT_INT}
CURRENT_SCHEMA = {"pid": OPT_INT, "fire_id": OPT_STR, "fire_started_at": OPT_STR, "fire_elapsed_s": OPT_INT,
                  "cycle": OPT_INT, "work_ref": OPT_STR, "title": OPT_STR, "phase": OPT_STR,
                  "agent_elapsed_s": OPT_INT}
# docs/DESIGN.md §3: every entry has these; the passthrough must keep each line byte for byte.
ENTRY_KEYS = ("cycle", "result", "timestamp", "target", "selected_source", "work_ref", "mode", "session_id",
              "fire_id")


def check_schema(obj: dict[str, Any], schema: dict[str, Any], where: str = "") -> None:
    missing = set(schema) - set(obj)
    assert not missing, f"{where} missing keys {sorted(missing)}"
    for key, tp in schema.items():
        value = obj[key]
        assert isinstance(value, tp) and not (isinstance(value, bool) and tp in (int, NUM, OPT_INT)), (
            f"{where}{key} = {value!r} is not {tp}")


def status_json(cli) -> tuple[int, dict[str, Any]]:
    r = cli("status", "--json")
    return r.code, orjson.loads(r.stdout)


# -- the schema on a repo with every kind of entry -------------------------------------------------


def test_status_json_schema_every_kind_of_entry(env: Env, cli) -> None:
    entries = write_every_kind(env)
    code, info = status_json(cli)
    assert code == 0, info["reasons"]
    check_schema(info, STATUS_SCHEMA)
    check_schema(info["breaker"], BREAKER_SCHEMA, "breaker.")
    check_schema(info["agent_session"], SESSION_SCHEMA, "agent_session.")
    assert info["health"] == "healthy" and info["exit_code"] == 0 and info["reasons"] == []
    assert info["last_logged_cycle"] == 16 and info["running"] is False and info["current"] is None
    assert [e["cycle"] for e in info["recent"]] == [12, 13, 14, 15, 16]
    assert info["recent"] == entries[-5:]
    # today's cost: the fixture spans 20 hours, so count only entries since 00:00 UTC
    midnight = time.time() - time.time() % 86400
    today = [e for e in entries if parse_iso(e["timestamp"]) >= midnight]
    # Idle polls are counted apart; which of them fall after midnight depends on the time of day.
    polls = [e for e in today if e.get("target") == "idle" and e.get("result") == "unchanged"]
    assert info["cycles_today"] == len(today) - len(polls)
    assert info["idle_polls_today"] == len(polls)
    assert info["cost_today_usd"] == pytest.approx(sum(e.get("cost_usd", 0) for e in today))
    s = info["agent_session"]
    assert s["id"] == "sess-d" and s["last_mode"] == "continuation"
    assert s["started_at"] == entries[14]["timestamp"] and 4 * 3600 < s["age_s"] < 6 * 3600
    assert info["breaker"]["state"] == "closed" and info["breaker"]["max_consecutive_failures"] == 3
    assert info["autocompact"]["state"] in ("ABSENT", "unknown")
    assert info["next_fire"] is None and info["markers"] == {}


def test_status_markers_sticky_ttl_and_halted_exit_75(env: Env, cli) -> None:
    write_every_kind(env)
    p = env.paths
    p.stop.write_text("2026-11-29T00:00:00Z\nlunch\n")
    p.handoff.write_text("2026-11-29T00:00:00Z\ncontext_streak=2 (x)\nparked_work: []\nnext-action: y\n")
    p.rescope.write_text("do the small thing\n")
    code, info = status_json(cli)
    assert code == 75 and info["health"] == "halted" and info["halt"]["reason"] == "user_halt"
    assert "lunch" in info["halt"]["detail"]
    for name in ("STOP",):
        check_schema(info["markers"][name], STICKY_SCHEMA, f"markers.{name}.")
    for name in ("HANDOFF", "RESCOPE"):
        check_schema(info["markers"][name], MARKER_SCHEMA, f"markers.{name}.")
        assert info["markers"][name]["sticky"] is False and "ttl_s" not in info["markers"][name]
    stop = info["markers"]["STOP"]
    assert stop["sticky"] is True and stop["stale"] is False and stop["ttl_s"] == 7 * 86400
    assert 7 * 86400 - 60 < stop["ttl_left_s"] <= 7 * 86400
    text = cli("status").stdout
    assert "HALTED (exit 75)" in text and "STOP (sticky" in text and "HANDOFF (non-sticky" in text
    assert "TTL left 6d23h" in text or "TTL left 7d0h" in text

    # A STOP older than the TTL is ignored (and said so), not a halt.
    # (Both its mtime and its own first-line timestamp must be that old: docs/DESIGN.md §2.2.)
    old = time.time() - 8 * 86400
    p.stop.write_text(f"{utc_iso(old)}\nlunch\n")
    os.utime(p.stop, (old, old))
    code, info = status_json(cli)
    assert code == 0 and info["markers"]["STOP"]["stale"] is True
    assert any("STOP is older than its TTL" in w for w in info["warnings"])
    assert "STALE" in cli("status").stdout

    # KILL and the global KILL halt too.
    for marker, reason in ((p.kill, "kill"), (p.global_kill, "kill")):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("because\n")
        code, info = status_json(cli)
        assert (code, info["health"], info["halt"]["reason"]) == (75, "halted", reason), marker
        marker.unlink()
    # DORMANT is "caught up, nothing to do" (issue 16): its own state, exit 0, not an operator's halt.
    p.dormant.write_text("cycle 3\nstagnation\n")
    code, info = status_json(cli)
    assert (code, info["health"], info["halt"]["reason"]) == (0, "dormant", "dormant")
    assert "health     DORMANT (exit 0)" in cli("status").stdout
    p.stop.write_text("lunch\n")  # an operator's STOP on top still halts
    assert status_json(cli)[1]["health"] == "halted"
    p.stop.unlink()
    p.dormant.unlink()


def test_status_goal_regression_is_halted_until_acknowledged(env: Env, cli) -> None:
    write_every_kind(env)
    with open(env.paths.ledger, "ab") as fh:
        fh.write(orjson.dumps({"cycle": 17, "result": "improved", "timestamp": utc_iso(), "target": "t",
                               "goals_passing": 6, "goals_total": 8}, option=orjson.OPT_APPEND_NEWLINE))
    code, info = status_json(cli)
    assert code == 75 and info["halt"]["reason"] == "goal_regression" and "8 -> 6" in info["halt"]["detail"]
    env.paths.ack_regression.write_text("ok\n")
    assert status_json(cli)[0] == 0


def test_status_degraded_exit_1(env: Env, cli) -> None:
    write_every_kind(env)
    p = env.paths
    st = orjson.loads(p.state.read_bytes())
    # The breaker is open: degraded, with its ETA.
    until = utc_iso(time.time() + 1200)
    p.state.write_bytes(orjson.dumps({**st, "breaker_open_until": until, "consecutive_failures": 3}))
    code, info = status_json(cli)
    assert code == 1 and info["health"] == "degraded" and info["breaker"]["state"] == "open"
    assert 1100 < info["breaker"]["eta_s"] <= 1200 and info["breaker"]["open_until"] == until
    assert "OPEN until" in cli("status").stdout
    # Past the cooldown: half-open, healthy again.
    p.state.write_bytes(orjson.dumps({**st, "breaker_open_until": utc_iso(time.time() - 5)}))
    code, info = status_json(cli)
    assert code == 0 and info["breaker"]["state"] == "half-open"
    p.state.write_bytes(orjson.dumps(st))

    # The last cycle failed.
    with open(p.ledger, "ab") as fh:
        fh.write(orjson.dumps({"cycle": 17, "result": "failed", "timestamp": utc_iso(), "target": "t",
                               "error_class": "fatal"}, option=orjson.OPT_APPEND_NEWLINE))
    code, info = status_json(cli)
    assert code == 1 and info["reasons"] == ["last cycle 17 failed (fatal)"]
    with open(p.ledger, "ab") as fh:
        fh.write(orjson.dumps({"cycle": 18, "result": "improved", "timestamp": utc_iso(), "target": "t"},
                              option=orjson.OPT_APPEND_NEWLINE))
    assert status_json(cli)[0] == 0

    # A fire recorded in session-state whose process is gone (the next fire reconciles it).
    p.state.write_bytes(orjson.dumps({**st, "fire": {"pid": 999_999_99, "cycle": 19, "started_at": utc_iso()}}))
    code, info = status_json(cli)
    assert code == 1 and "died mid-fire" in info["reasons"][0]
    p.state.write_bytes(orjson.dumps(st))

    # An invalid config: every fire would exit 78.
    env.paths.config.write_text("[fire]\nmax_cycles = 'many'\n")
    code, info = status_json(cli)
    assert code == 1 and "config invalid" in info["reasons"][0] and "max_cycles" in info["config_error"]


def test_status_running_fire_shows_pid_cycle_item_and_agent_elapsed(env: Env, cli) -> None:
    env.queue(entry("slow item"))
    env.steps([{"sleep": 4, "report": {"result": "unchanged"}}])
    p = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env())
    try:
        deadline = time.time() + 20
        while not env.calls() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1.2)
        code, info = status_json(cli)
        assert code == 0 and info["running"] is True and info["pid"] == p.pid
        cur = info["current"]
        check_schema(cur, CURRENT_SCHEMA, "current.")
        assert cur["cycle"] == 1 and cur["title"] == "slow item" and cur["phase"] == "agent"
        assert cur["work_ref"] == "source_epic=e1:item=slow item"
        assert cur["agent_elapsed_s"] >= 1 and cur["fire_elapsed_s"] >= cur["agent_elapsed_s"]
        text = cli("status").stdout
        assert f"running    yes, pid {p.pid}" in text and "cycle 1 (agent" in text and "slow item" in text
    finally:
        p.wait(timeout=30)


def test_status_next_fire_from_the_daemon_record(env: Env, cli) -> None:
    write_every_kind(env)
    at = utc_iso(time.time() + 600)
    statusmod.publish_daemon(env.paths, next_fire_at=at, schedule="*/30 * * * *")  # this pid: alive
    code, info = status_json(cli)
    assert code == 0
    nf = info["next_fire"]
    assert nf["source"] == "daemon" and nf["at"] == at and nf["pid"] == os.getpid() and 500 < nf["in_s"] <= 600
    assert "next fire  " + at in cli("status").stdout
    rec = orjson.loads((env.paths.evolve_dir / "daemon.json").read_bytes())
    rec["pid"] = 999_999_99  # a daemon that is gone says nothing
    (env.paths.evolve_dir / "daemon.json").write_bytes(orjson.dumps(rec))
    assert status_json(cli)[1]["next_fire"] is None


def test_systemd_timer_output_parsing() -> None:
    listing = ("Sat 2026-11-29 20:30:00 UTC 4min left Sat 2026-11-29 20:00:00 UTC 25min ago "
               "evolve@srv-repo.timer evolve@srv-repo.service\n"
               "n/a n/a n/a n/a evolve-other.timer evolve-other.service\n")
    assert statusmod.parse_timer_units(listing) == ["evolve@srv-repo.timer", "evolve-other.timer"]
    show = ("Id=evolve@srv-repo.timer\nNextElapseUSecRealtime=@1795984200\n\n"
            "Id=evolve-other.timer\nNextElapseUSecRealtime=\n")
    assert statusmod.parse_next_elapse(show) == {"evolve@srv-repo.timer": 1795984200.0, "evolve-other.timer": None}


def test_autocompact_preflight(env: Env, cli) -> None:
    (env.repo / ".claude").mkdir()
    (env.repo / ".claude" / "settings.json").write_text('{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "40"}}')
    ac = status_json(cli)[1]["autocompact"]
    if ac["state"] == "unknown":
        pytest.skip("evolve.harness.autocompact is not installed")
    assert ac["state"] == "CONFIGURED" and ac["value"] == "40"
    (env.repo / ".claude" / "settings.json").write_text('{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "0"}}')
    assert status_json(cli)[1]["autocompact"]["state"] == "INVALID"
    # a lone surrogate escape in the file must not break status (or doctor)
    (env.repo / ".claude" / "settings.json").write_text('{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "\\ud800"}}')
    code, info = status_json(cli)
    assert code == 0 and info["autocompact"] == {**info["autocompact"], "state": "INVALID", "value": "\\ud800"}
    for args in (("status",), ("doctor",)):
        assert "unexpected error" not in cli(*args).stderr


def test_autocompact_detector_failure_is_unknown(monkeypatch, tmp_path: Path) -> None:
    from evolve.harness import autocompact

    def boom(project, env):
        raise RuntimeError("broken")

    monkeypatch.setattr(autocompact, "status_info", boom)
    got = statusmod.autocompact_info(tmp_path, {})
    assert got["state"] == "unknown" and "broken" in got["detail"]


def test_status_reads_only_the_ledger_tail(env: Env, monkeypatch) -> None:
    """30 MB of old entries before the fixture: status reads a few blocks, not the file."""
    p = env.paths
    p.evolve_dir.mkdir(parents=True, exist_ok=True)
    old = b"".join(
        orjson.dumps({"cycle": c, "result": "improved", "timestamp": "2025-01-01T00:00:00Z", "target": "x" * 100,
                      "cost_usd": 1.0}, option=orjson.OPT_APPEND_NEWLINE)
        for c in range(1, 200_001))
    p.ledger.write_bytes(old)
    with open(p.ledger, "ab") as fh:
        for e in every_kind(time.time()):
            fh.write(orjson.dumps({**e, "cycle": e["cycle"] + 200_000}, option=orjson.OPT_APPEND_NEWLINE))
    size = p.ledger.stat().st_size
    assert size > 25_000_000
    read = {"bytes": 0}
    real = os.pread

    def counting(fd: int, n: int, off: int) -> bytes:
        data = real(fd, n, off)
        read["bytes"] += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting)
    info = statusmod.status(p, env=env.env(), probe_schedule=False)
    assert info["last_logged_cycle"] == 200_016
    assert read["bytes"] < 1_000_000, f"status read {read['bytes']} of {size} bytes"


# -- history --------------------------------------------------------------------------------------


def test_history_json_is_a_byte_for_byte_passthrough_with_filters(env: Env, cli) -> None:
    entries = write_every_kind(env)
    raw_lines = env.paths.ledger.read_bytes().splitlines()
    r = cli("history", "--limit", "100", "--json", "--all")
    assert r.code == 0 and r.stdout.encode().splitlines() == raw_lines
    # Idle polls are hidden by default (issue 16): a night of "nothing to do" must not crowd out work.
    idle = [e["cycle"] for e in entries if e["target"] == "idle" and e["mode"] == "idle"]
    default = [orjson.loads(x)["cycle"] for x in cli("history", "--limit", "100", "--json").stdout.splitlines()]
    assert idle and default == [e["cycle"] for e in entries if e["cycle"] not in idle]
    text = cli("history", "--limit", "100").stdout
    assert f"({len(idle)} idle poll(s) hidden; --all shows them)" in text
    assert "idle poll" not in cli("history", "--limit", "100", "--all").stdout
    for line in r.stdout.splitlines():
        obj = orjson.loads(line)
        assert all(k in obj for k in ENTRY_KEYS), obj
    assert {orjson.loads(x)["result"] for x in r.stdout.splitlines()} == {
        "improved", "regressed", "harvested", "unchanged", "scout", "context-handoff", "quarantined", "failed",
        "interrupted", "crashed"}

    r = cli("history", "--json", "--limit", "3")
    assert [orjson.loads(x)["cycle"] for x in r.stdout.splitlines()] == [14, 15, 16]
    r = cli("history", "--json", "--result", "failed,crashed", "--result", "regressed")
    assert [orjson.loads(x)["cycle"] for x in r.stdout.splitlines()] == [9, 11, 12, 14]
    r = cli("history", "--json", "--result", "failed", "--limit", "1")
    assert [orjson.loads(x)["cycle"] for x in r.stdout.splitlines()] == [12]
    # --since: the fixture's entries are spread over 20 hours
    cutoff = time.time() - 6 * 3600
    want = [e["cycle"] for e in entries if parse_iso(e["timestamp"]) >= cutoff]
    r = cli("history", "--json", "--since", "6h", "--limit", "100")
    assert [orjson.loads(x)["cycle"] for x in r.stdout.splitlines()] == want and want
    r = cli("history", "--json", "--since", utc_iso(cutoff), "--limit", "100")
    assert [orjson.loads(x)["cycle"] for x in r.stdout.splitlines()] == want


def test_history_terminal_view_rows_and_sparklines(env: Env, cli) -> None:
    write_every_kind(env)
    with open(env.paths.ledger, "ab") as fh:
        fh.write(b"not json\n")
    out = cli("history", "--limit", "100", "--all").stdout  # every row, the idle poll too
    lines = out.splitlines()
    assert lines[0].strip() == "16 cycle(s), #1..#16"
    goals, cost, ctx = lines[1], lines[2], lines[3]
    assert goals.split()[0] == "goals" and "8/8 now" in goals
    assert cost.split()[0] == "cost" and "$3.57 total" in cost
    assert ctx.startswith("  context %") and "max 52%" in ctx
    spark = cost[len("  cost      "):len("  cost      ") + 16]
    assert len(spark) == 16 and set(spark) <= set(statusmod.SPARKS + " ")
    assert spark[8] == "█"  # cycle 9 cost the most
    assert spark[3] == " "  # the hand-off ran no agent
    rows = [ln for ln in lines if ln.lstrip().startswith("#")]
    assert len(rows) == 16
    assert "regressed" in rows[8] and "$0.91" in rows[8] and "38%" in rows[8] and "6/8" in rows[8]
    assert "[timeout]" in rows[11] and "Context-handoff after 2 heavy cycles" in rows[3]
    assert "(1 malformed line(s) skipped)" in out


def test_sparkline_scaling() -> None:
    assert statusmod.sparkline([0, 0.5, 1], 0, 1) == "▁▅█"
    assert statusmod.sparkline([None, 2, None]) == " █ "
    assert statusmod.sparkline([]) == ""
    assert statusmod.sparkline([3, 3]) == "██"


def test_history_usage_errors(env: Env, cli) -> None:
    assert cli("history", "--since", "yesterday-ish").code == 2
    assert cli("history", "--limit", "0").code == 2
    r = cli("history", "--result", "failed")
    assert r.code == 0 and "no cycles" in r.stdout


def test_parse_since() -> None:
    now = 1_800_000_000.0
    assert statusmod.parse_since("90m", now) == now - 5400
    assert statusmod.parse_since("24h", now) == now - 86400
    assert statusmod.parse_since("2w", now) == now - 14 * 86400
    assert statusmod.parse_since("2026-11-29", now) == parse_iso("2026-11-29T00:00:00Z")
    with pytest.raises(ValueError):
        statusmod.parse_since("soon", now)


def test_status_cost_today_is_bounded(env: Env) -> None:
    """All of a huge ledger written today: status still stops at its cap and says so."""
    p = env.paths
    p.evolve_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    ts = utc_iso(now - 60)
    with open(p.ledger, "wb") as fh:
        for c in range(1, statusmod.TODAY_SCAN_CAP + 50):
            fh.write(orjson.dumps({"cycle": c, "result": "improved", "timestamp": ts, "cost_usd": 0.01},
                                  option=orjson.OPT_APPEND_NEWLINE))
    info = statusmod.status(p, env=env.env(), now=now, probe_schedule=False)
    assert info["cost_today_partial"] is True and info["cycles_today"] == statusmod.TODAY_SCAN_CAP
    assert Ledger(p.ledger).last_cycle() == statusmod.TODAY_SCAN_CAP + 49


def test_init_writes_gitignore_commented_config_and_next_steps(tmp_path: Path) -> None:
    from support import git

    from evolve import config
    from evolve.config_template import TEMPLATE

    repo = tmp_path / "fresh"
    repo.mkdir()
    git(repo, "init", "-q")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")}
    r = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(repo), "init"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert (repo / ".agents" / ".gitignore").read_text() == "*\n"
    cfg_path = repo / ".agents" / "evolve" / "config.toml"
    assert cfg_path.read_text() == TEMPLATE
    assert "[notify]" in TEMPLATE and "# command = []" in TEMPLATE and "# textfile_dir" in TEMPLATE
    assert config.load(cfg_path, {}) == config.Config()  # every key commented: the defaults
    out = r.stdout
    assert "next steps:" in out and "evolve doctor" in out and "evolve fire --dry-run" in out
    assert "evolve report" in out and "install systemd" in out
    assert git(repo, "status", "--porcelain") == ""  # .agents/ is local-only


def test_terminal_views_show_control_characters_as_escapes(env: Env, cli) -> None:
    import re

    hostile = "t \x1b]0;PWNED\x07 \x1b[2J \x9b2J \r over\x08 bidi \u202egnp\u202c zw\u200b\ufeff"
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    with open(env.paths.ledger, "wb") as fh:
        fh.write(orjson.dumps({"cycle": 1, "result": "scout", "timestamp": utc_iso(), "target": hostile,
                               "disposition": hostile, "milestone": hostile, "error_class": hostile},
                              option=orjson.OPT_APPEND_NEWLINE))
    env.paths.stop.write_text(hostile + "\n")
    unsafe = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
    for args in (("history",), ("status",)):
        out = cli(*args).stdout
        assert not unsafe.findall(out), (args, out)
        assert "\\x1b]0;PWNED\\x07" in out and "\\u202egnp" in out


def test_hostile_ledger_and_state_never_crash_the_views(env: Env, cli, tmp_path: Path) -> None:
    weird: list[Any] = [None, True, -1, 1e308, "x", [], {}, [1, {"a": None}], {"k": [None]}, "\x00\x1b"]
    keys = ("cycle", "result", "timestamp", "target", "selected_source", "work_ref", "mode", "session_id",
            "fire_id", "cost_usd", "duration_s", "context_pct", "context_heavy", "context_signal", "goals_passing",
            "goals_total", "error_class", "disposition", "milestone", "agent_mode", "sha", "summary", "scouted",
            "oscillations", "usage")
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    with open(env.paths.ledger, "wb") as fh:
        for i, value in enumerate(weird):
            fh.write(orjson.dumps({k: value for k in keys}, option=orjson.OPT_APPEND_NEWLINE))
            fh.write(orjson.dumps({"cycle": i + 1, "result": "improved", "timestamp": utc_iso(), **{
                k: value for k in keys if k not in ("cycle", "result", "timestamp")}},
                option=orjson.OPT_APPEND_NEWLINE))
        fh.write(b"[1, 2]\n\"str\"\nnull\n")
    with open(env.paths.evolve_dir / "fires.jsonl", "wb") as fh:
        for value in weird:
            fh.write(orjson.dumps({"fire_id": value, "ended_at": utc_iso(), "reason": value, "halt": value,
                                   "halt_detail": value, "cycles": value, "exit_code": value, "cost_usd": value},
                                  option=orjson.OPT_APPEND_NEWLINE))
    env.paths.state.write_bytes(orjson.dumps({"agent_session": {"id": [], "started_cycle": "x", "last_cycle": {}},
                                              "fire": {"pid": "x", "started_at": 5, "cycle": []},
                                              "claimed_work": {"ref": {}, "title": []}}))
    for args in (("status",), ("status", "--json"), ("history", "--limit", "100"), ("history", "--json"),
                 ("history", "--result", "improved"), ("report", "-o", str(tmp_path / "r.html")),
                 ("metrics", "--no-beads"), ("doctor",)):
        r = cli(*args)
        assert r.code in (0, 1, 75), (args, r.stderr)
        assert "unexpected error" not in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
