"""The CLI surface: status, history, stop/kill/resume, init, usage errors, and the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
from support import Env, entry, heavy_step


def test_status_json_and_text(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    env.steps([heavy_step()])
    assert cli("fire", "--cycles", "1").code == 0
    r = cli("status", "--json")
    assert r.code == 0
    info = orjson.loads(r.stdout)
    assert info["running"] is False and info["last_logged_cycle"] == 1
    assert info["context_streak"] == 1 and info["context_streak_limit"] == 2
    assert info["parked_work"] == ["source_epic=e1:item=a"]
    assert info["recent"][-1]["result"] == "scout"
    text = cli("status").stdout
    assert "streak 1/2" in text and "scout" in text


def test_status_reports_a_running_fire(env: Env, cli) -> None:
    import time

    env.queue(entry("a"))
    env.steps([{"sleep": 3, "report": {"result": "unchanged"}}])
    p = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env())
    try:
        deadline = time.time() + 20
        while not env.calls() and time.time() < deadline:
            time.sleep(0.05)
        info = orjson.loads(cli("status", "--json").stdout)
        assert info["running"] is True
        assert info["fire"]["pid"] == p.pid and info["fire"]["cycle"] == 1
        assert info["active_cycle"]["title"] == "a"
        assert info["claimed_work"]["ref"] == "source_epic=e1:item=a"
    finally:
        p.wait(timeout=30)


def test_history_limits_and_json(env: Env, cli) -> None:
    env.queue(entry("a", "b", "c"))
    assert cli("fire", "--cycles", "3").code == 0
    r = cli("history", "--limit", "2", "--json")
    rows = [orjson.loads(x) for x in r.stdout.splitlines()]
    assert [x["cycle"] for x in rows] == [2, 3]
    assert "#3" in cli("history").stdout


def test_stop_kill_resume(env: Env, cli) -> None:
    assert cli("stop", "--reason", "lunch").code == 0
    assert "lunch" in env.paths.stop.read_text()
    assert cli("kill").code == 0 and env.paths.kill.exists()
    r = cli("resume")
    assert not env.paths.stop.exists() and env.paths.kill.exists()
    assert "resume --kill" in r.stdout
    cli("resume", "--kill")
    assert not env.paths.kill.exists()


def test_init_is_idempotent_and_keeps_config(env: Env, cli) -> None:
    env.paths.config.unlink()
    assert cli("init").code == 0
    text = env.paths.config.read_text()
    assert "[context]" in text and "streak_limit" in text
    env.paths.config.write_text("[fire]\nmax_cycles = 2\n")
    r = cli("init")
    assert "kept" in r.stdout and env.paths.config.read_text() == "[fire]\nmax_cycles = 2\n"


def test_usage_errors_exit_2(env: Env, cli, tmp_path) -> None:
    assert cli("fire", "--cycles", "0").code == 2
    assert cli("bogus").code == 2
    r = cli("status", repo=tmp_path / "nowhere")
    assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1
    notrepo = tmp_path / "plain"
    notrepo.mkdir()
    r = cli("status", repo=notrepo)
    assert r.code == 2 and "not inside a git repository" in r.stderr


def test_repo_defaults_to_git_toplevel(env: Env) -> None:
    sub = env.repo / "deep" / "dir"
    sub.mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "evolve", "status", "--json"], cwd=sub, capture_output=True,
                       env=env.env())
    assert r.returncode == 0, r.stderr
    assert orjson.loads(r.stdout)["repo"] == str(env.repo.resolve())


def test_demo_runs_end_to_end(tmp_path) -> None:
    target = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "evolve", "demo", "--dir", str(target)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "handoff.written" in out and "handoff.cleared" in out
    assert "context_streak=2 (this session's context grew too heavy)" in out
    assert "demo ok" in out
    ledger = [orjson.loads(x) for x in (target / "repo/.agents/evolve/cycle-history.jsonl").read_bytes().splitlines()]
    results = [e["result"] for e in ledger]
    assert results[:4] == ["improved", "scout", "harvested", "context-handoff"]
    assert "improved" in results[4:]


def test_demo_keeps_the_directory_it_points_at(tmp_path) -> None:
    """Issue 16: without --dir the demo deleted the temp directory whose files it had just listed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-m", "evolve", "demo"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    shown = [ln.split()[0] for ln in lines[lines.index("Look at:") + 1:] if ln.startswith("  /")]
    assert len(shown) >= 4 and all(Path(x).exists() for x in shown), shown
    (root,) = list(tmp.iterdir())
    assert f"remove it with `rm -rf {root}`" in r.stdout
    assert (root / "fire-logs.jsonl").read_bytes().count(b'"event":"fire.start"') == 2
    # --rm deletes it, and then names no file inside it.
    gone = subprocess.run([sys.executable, "-m", "evolve", "demo", "--rm"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(tmp)})
    assert gone.returncode == 0 and "Look at:" not in gone.stdout and "as --rm asked" in gone.stdout
    assert list(tmp.iterdir()) == [root]


def test_logs_are_console_text_on_a_tty_and_json_otherwise(env: Env, cli) -> None:
    import os
    import pty

    env.queue(entry("a", "b"))
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                         stdout=slave, stderr=slave, env=env.env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=60)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "fire.start" in text and "cycle.end" in text
    assert not any(line.lstrip().startswith("{") for line in text.splitlines() if line.strip())
    piped = cli("fire", "--cycles", "1")
    assert piped.events() and all(line.startswith("{") for line in piped.stderr.splitlines())
    ends = [e for e in piped.events() if e["event"] == "cycle.end"]
    assert ends[0]["fire_id"] and ends[0]["cycle"] == 2


def test_version() -> None:
    from evolve import __version__

    r = subprocess.run([sys.executable, "-m", "evolve", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"evolve {__version__}"
