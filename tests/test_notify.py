"""Notifications: ``[notify] command`` runs (argv, no shell) on halt, breaker open, hand-off and regression
with the event as JSON on stdin; best effort with a timeout; it never changes a fire's outcome. Also the
fire journal the morning report reads."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson
from support import Env, entry, heavy_step, improved_step, jsonl

from evolve.notify import FireJournal, NotifyObserver, observers_for, run_notify
from evolve.paths import Paths

RECORDER = textwrap.dedent(
    """
    import json, os, sys
    data = sys.stdin.read()
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({"stdin": json.loads(data), "event_env": os.environ.get("EVOLVE_EVENT"),
                             "argv": sys.argv[2:], "cwd": os.getcwd()}) + "\\n")
    """
)


def recorder(env: Env) -> tuple[list[str], Path]:
    script = env.root / "notify.py"
    script.write_text(RECORDER)
    out = env.root / "notified.jsonl"
    return [sys.executable, str(script), str(out), "$HOME", "; rm -rf /"], out


def notified(out: Path) -> list[dict[str, Any]]:
    return jsonl(out) if out.exists() else []


def test_halt_notifies_with_the_event_on_stdin(env: Env, cli) -> None:
    argv, out = recorder(env)
    env.write_config(notify={"command": argv, "timeout_s": 10})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.stop.write_text("operator at lunch\n")
    r = cli("fire")
    assert r.code == 0, r.stderr
    (got,) = notified(out)
    ev = got["stdin"]
    assert ev["event"] == "halt" and ev["reason"] == "user_halt" and "lunch" in ev["detail"]
    assert ev["repo"] == str(env.repo) and ev["fire_id"] and ev["timestamp"].endswith("Z")
    assert got["event_env"] == "halt"
    assert got["argv"] == ["$HOME", "; rm -rf /"]  # argv, never a shell: nothing expanded
    assert Path(got["cwd"]).resolve() == env.repo.resolve()
    assert "notify.sent" in r.names()


def test_handoff_and_breaker_and_regression_notify(env: Env, cli) -> None:
    argv, out = recorder(env)
    env.write_config(notify={"command": argv}, breaker={"max_consecutive_failures": 2})
    env.queue(entry("a", "b", "c", "d", "e", "f"))
    env.steps([heavy_step(), heavy_step()])
    assert cli("fire", "--cycles", "3").code == 0
    events = [n["stdin"] for n in notified(out)]
    assert [e["event"] for e in events] == ["handoff.written"]
    assert events[0]["streak"] == 2 and events[0]["cycle"] == 3

    env.steps([{"exit": 1}])
    assert cli("fire", "--cycles", "3").code == 0
    events = [n["stdin"] for n in notified(out)]
    assert events[-1]["event"] == "breaker.open" and events[-1]["failures"] == 2 and events[-1]["until"]


def test_regression_notifies(env: Env, cli) -> None:
    argv, out = recorder(env)
    env.write_config(notify={"command": argv},
                     gate={"commands": [[sys.executable, "-c", "import sys; sys.exit(1)"]], "timeout_s": 30})
    env.queue(entry("a"))
    env.steps([improved_step()])
    assert cli("fire", "--cycles", "1").code == 0
    assert env.ledger()[-1]["result"] == "regressed"
    (got,) = notified(out)
    assert got["stdin"]["event"] == "regression" and got["stdin"]["cycle"] == 1
    assert got["stdin"]["work_ref"] == "source_epic=e1:item=a"


def test_slow_or_missing_notify_never_breaks_a_fire(env: Env, cli) -> None:
    hang = env.root / "hang.py"
    hang.write_text("import subprocess, sys, time\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    "time.sleep(60)\n")
    env.write_config(notify={"command": [sys.executable, str(hang)], "timeout_s": 0.5})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.stop.write_text("x\n")
    t0 = time.monotonic()
    r = cli("fire")
    assert r.code == 0 and time.monotonic() - t0 < 20
    failed = [e for e in r.events() if e["event"] == "notify.failed"]
    assert failed and failed[0]["timed_out"] is True

    env.write_config(notify={"command": [str(env.root / "no-such-notifier")]})
    r = cli("fire")
    assert r.code == 0
    assert any(e["event"] == "notify.failed" for e in r.events())


def test_run_notify_kills_the_whole_group_on_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "n.py"
    script.write_text("import os, subprocess, sys, time\n"
                      f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
                      "time.sleep(60)\n")
    r = run_notify([sys.executable, str(script)], {"event": "halt"}, timeout_s=1.0)
    assert r.timed_out and not r.ok
    import os

    pid = int(pidfile.read_text())
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        # reaped by init once killed; a zombie still answers kill(0) briefly
        time.sleep(0.05)
    else:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text()


def test_nonzero_exit_is_reported_not_raised(tmp_path: Path) -> None:
    r = run_notify([sys.executable, "-c", "import sys; sys.stderr.write('webhook 500'); sys.exit(3)"],
                   {"event": "halt"}, timeout_s=5)
    assert (r.ok, r.exit_code) == (False, 3) and "webhook 500" in r.error


def test_observer_ignores_other_events(tmp_path: Path) -> None:
    out = tmp_path / "o.txt"
    obs = NotifyObserver([sys.executable, "-c", f"open({str(out)!r}, 'a').write('x')"], 5,
                         Paths.for_repo(tmp_path, env={}))
    for ev in ("cycle.end", "fire.end", "fire.start"):
        obs(ev, {"event": ev})
    assert not out.exists()
    obs("breaker.open", {"event": "breaker.open"})
    assert out.read_text() == "x"


def test_observers_for_follows_the_config(env: Env) -> None:
    cfg = env.cfg()
    kinds = [type(o).__name__ for o in observers_for(cfg, env.paths)]
    assert kinds == ["FireJournal"]
    env.write_config(notify={"command": ["true"]}, metrics={"textfile_dir": "/tmp/x"})
    kinds = [type(o).__name__ for o in observers_for(env.cfg(), env.paths)]
    assert kinds == ["FireJournal", "NotifyObserver", "MetricsObserver"]


def test_fire_journal_records_every_fire(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    env.steps([improved_step(), heavy_step()])
    assert cli("fire", "--cycles", "2").code == 0
    env.paths.stop.write_text("lunch\n")
    assert cli("fire").code == 0
    fires = jsonl(env.paths.evolve_dir / "fires.jsonl")
    assert [f["reason"] for f in fires] == ["max_cycles", "halt:user_halt"]
    assert fires[0]["cycles"] == 2 and (fires[0]["first_cycle"], fires[0]["last_cycle"]) == (1, 2)
    assert fires[1]["halt"] == "user_halt" and "lunch" in fires[1]["halt_detail"] and fires[1]["cycles"] == 0
    ids = {e["fire_id"] for e in env.ledger()}
    assert fires[0]["fire_id"] in ids
    # --dry-run writes nothing, not even a journal line
    env.paths.stop.unlink()
    assert cli("fire", "--dry-run").code == 0
    assert len(jsonl(env.paths.evolve_dir / "fires.jsonl")) == 2


def test_journal_survives_interleaved_fires(tmp_path: Path) -> None:
    paths = Paths.for_repo(tmp_path, env={})
    j = FireJournal(paths)
    j("cycle.end", {"fire_id": "A", "entry": {"cycle": 1, "timestamp": "2026-11-29T00:00:00Z"}})
    j("cycle.end", {"fire_id": "B", "entry": {"cycle": 2, "timestamp": "2026-11-29T00:01:00Z"}})
    j("fire.end", {"fire_id": "B", "reason": "idle", "cycles": 1})
    j("fire.end", {"fire_id": "A", "reason": "max_cycles", "cycles": 1})
    rows = [orjson.loads(x) for x in (paths.evolve_dir / "fires.jsonl").read_bytes().splitlines()]
    assert [(r["fire_id"], r["first_cycle"]) for r in rows] == [("B", 2), ("A", 1)]


def test_journal_line_after_a_torn_one_is_whole(tmp_path: Path) -> None:
    paths = Paths.for_repo(tmp_path, env={})
    paths.evolve_dir.mkdir(parents=True)
    journal = paths.evolve_dir / "fires.jsonl"
    journal.write_bytes(b'{"fire_id": "old", "ended_at": "2026-11-29T00:00:00Z"}\n{"fire_id": "torn", "en')
    FireJournal(paths)("fire.end", {"fire_id": "new", "reason": "idle", "cycles": 0})
    lines = journal.read_bytes().splitlines()
    assert orjson.loads(lines[-1])["fire_id"] == "new" and lines[1] == b'{"fire_id": "torn", "en'
