"""Issue 16 (items 5, 6 and 8): status, notifications, metrics, logs and errors say what actually happened.

Real fires, real git repositories, real subprocesses (a pty where a terminal matters); the few places
that need another user are run as root without its capabilities (``setpriv``), so the kernel refuses
exactly as it would refuse an ordinary operator.
"""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry, git, improved_step

from evolve import metrics
from evolve.notify import halt_edge
from evolve.status.schedule import cron_next
from evolve.tty import colourize, fire_summary

NOPRIV = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
needs_nopriv = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                  reason="needs root and setpriv (root without capabilities: DAC is enforced)")


def evolve_argv(env: Env, *args: str) -> list[str]:
    return [sys.executable, "-m", "evolve", "--repo", str(env.repo), *args]


def on_pty(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
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
    code = p.wait(timeout=timeout)
    os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def assert_git_clean(env: Env) -> None:
    """No stray index lock; every improved entry's commit exists."""
    assert not (env.repo / ".git" / "index.lock").exists()
    for e in env.ledger() if env.paths.ledger.exists() else []:
        if e["result"] == "improved":
            git(env.repo, "cat-file", "-e", e["sha"] + "^{commit}")


# -- item 5: machine-readable stdout, journald priorities ------------------------------------------


def test_machine_readable_stdout_is_exactly_the_answer(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    dry = cli("fire", "--dry-run")
    assert dry.code == 0, dry.stderr
    plan = orjson.loads(dry.stdout)  # the whole of stdout is one JSON document
    assert plan["selection"]["ref"] == "source_epic=e1:item=a"
    assert dry.events(), "the logs are still there, on stderr"
    fire = cli("fire", "--cycles", "1")
    assert fire.code == 0 and fire.stdout == ""  # not a terminal: no summary line, no log
    status = cli("status", "--json")
    assert orjson.loads(status.stdout)["last_logged_cycle"] == 1
    hist = cli("history", "--json")
    rows = [orjson.loads(x) for x in hist.stdout.splitlines()]
    assert [r["cycle"] for r in rows] == [1] and "event" not in rows[0]
    assert_git_clean(env)


def test_logs_carry_journald_priorities_when_stderr_is_the_journal(env: Env) -> None:
    env.queue(entry("a"))
    env.write_config(agent={"runner": "command", "argv": [sys.executable, "-m", "evolve.agent.scripted", "--script",
                                                          str(env.script)], "pass_env": ["PYTHONPATH"]},
                     notify={"command": [str(env.root / "no-such-notifier")]})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.stop.write_text("lunch\n")  # a halt: notified, and the missing notifier is a warning
    err = env.root / "journal-stand-in"
    with open(err, "wb") as fh:
        st = os.fstat(fh.fileno())
        stream = f"{st.st_dev}:{st.st_ino}"
        code = subprocess.run(evolve_argv(env, "fire"), stdout=subprocess.PIPE, stderr=fh, timeout=120,
                              env=env.env(JOURNAL_STREAM=stream)).returncode
    assert code == 0
    lines = err.read_text().splitlines()
    assert lines and all(re.match(r"<[0-7]>\{", ln) for ln in lines), lines
    prio = {orjson.loads(ln[3:])["event"]: ln[:3] for ln in lines}
    assert prio["fire.start"] == "<6>" and prio["notify.failed"] == "<4>"
    # The variable inherited by a process whose stderr is elsewhere: no prefixes.
    other = subprocess.run(evolve_argv(env, "fire"), capture_output=True, timeout=120,
                           env=env.env(JOURNAL_STREAM=stream))
    assert other.returncode == 0 and other.stderr.startswith(b"{")


# -- item 5: DORMANT, idle polls, notifications on edges ---------------------------------------------


def test_idle_polls_are_counted_apart_and_dormant_is_its_own_state(env: Env, cli, tmp_path: Path) -> None:
    env.queue(entry("a"))
    assert cli("fire", "--cycles", "1").code == 0  # one real cycle
    for _ in range(3):  # then nothing to do: three idle passes write DORMANT (burst mode)
        assert cli("fire", "--cycles", "1").code == 0
    assert env.paths.dormant.exists()
    assert [e["result"] for e in env.ledger()] == ["improved", "unchanged", "unchanged", "unchanged"]
    info = orjson.loads(cli("status", "--json").stdout)
    assert (info["health"], info["exit_code"]) == ("dormant", 0)
    assert (info["cycles_today"], info["idle_polls_today"]) == (1, 3)
    text = cli("status")
    assert text.code == 0 and "DORMANT (exit 0)" in text.stdout and "today 1 cycle(s)" in text.stdout
    assert "3 idle poll(s)" in text.stdout
    hist = cli("history")
    assert "1 cycle(s)" in hist.stdout and "(3 idle poll(s) hidden; --all shows them)" in hist.stdout
    assert len([ln for ln in cli("history", "--all").stdout.splitlines() if ln.lstrip().startswith("#")]) == 4
    r = cli("metrics", "--no-beads", "--textfile", str(tmp_path / "prom"))
    assert r.code == 0, r.stderr
    prom = (tmp_path / "prom" / metrics.textfile_name(env.repo.resolve())).read_text()
    assert f'evolve_cycles_total{{repo="{env.repo.resolve()}",result="unchanged"}} 0' in prom
    assert re.search(r"^evolve_idle_polls_total\{[^}]*\} 3$", prom, re.M)
    assert re.search(r"^evolve_status_health\{[^}]*\} 2$", prom, re.M)  # dormant: not 75 (halted)
    assert re.search(r"^evolve_dormant\{[^}]*\} 1$", prom, re.M) and 'marker="DORMANT"' not in prom
    report = env.root / "r.html"
    assert cli("report", "-o", str(report)).code == 0
    html = report.read_text()
    assert re.search(r"<b>1</b><span>cycles</span>", html) and re.search(r"<b>3</b><span>idle polls</span>", html)
    assert_git_clean(env)


@pytest.mark.parametrize(("announced", "event", "payload", "want"), [
    (None, "halt", {"reason": "user_halt"}, ("halt", "user_halt")),  # a halt starts
    ("user_halt", "halt", {"reason": "user_halt"}, (None, "user_halt")),  # the same halt, next tick
    ("user_halt", "halt", {"reason": "kill"}, ("halt", "kill")),  # it changed
    ("user_halt", "fire.end", {"reason": "halt:user_halt"}, (None, "user_halt")),
    ("user_halt", "fire.end", {"reason": "max_cycles"}, ("halt.end", None)),  # past Step 1 again
    (None, "fire.end", {"reason": "idle"}, (None, None)),
    (None, "breaker.open", {}, ("breaker.open", None)),
    ("kill", "regression", {}, ("regression", "kill")),
    (None, "cycle.end", {}, (None, None)),
])
def test_halt_edge_table(announced: str | None, event: str, payload: dict[str, Any],
                         want: tuple[str | None, str | None]) -> None:
    assert halt_edge(announced, event, payload) == want


def test_a_standing_halt_is_notified_when_it_starts_and_ends_only(env: Env, cli) -> None:
    got = env.root / "notified.jsonl"
    hook = env.root / "notify.py"
    hook.write_text(f"import sys\nopen({str(got)!r}, 'ab').write(sys.stdin.buffer.read())\n")
    env.write_config(notify={"command": [sys.executable, str(hook)]})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.stop.write_text("lunch\n")
    for _ in range(3):
        r = cli("fire")
        assert r.code == 0, r.stderr
    events = [orjson.loads(x) for x in got.read_bytes().splitlines()]
    assert [(e["event"], e["reason"]) for e in events] == [("halt", "user_halt")]
    assert cli("resume").code == 0
    env.queue(entry("a"))
    assert cli("fire", "--cycles", "1").code == 0
    assert cli("fire", "--cycles", "1").code == 0  # nothing standing: nothing more to say
    events = [orjson.loads(x) for x in got.read_bytes().splitlines()]
    assert [e["event"] for e in events] == ["halt", "halt.end"]
    assert events[1]["ended_halt"] == "user_halt"
    assert_git_clean(env)


# -- item 6: errors name the real cause -----------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the repository to another user")
def test_a_repository_owned_by_another_user_is_named_as_such(env: Env, cli) -> None:
    os.chown(env.repo, 1234, 1234)
    try:
        r = cli("status")
        assert r.code == 78, r.stderr
        (line,) = r.error_lines()
        assert "git refuses the repository" in line and "safe.directory" in line and "uid 1234" in line
        assert f"git config --global --add safe.directory {env.repo}" in line
        assert "not inside a git repository" not in line
    finally:
        os.chown(env.repo, 0, 0)
    assert cli("status").code == 0
    assert_git_clean(env)


@needs_nopriv
def test_permission_errors_name_the_directory_its_owner_and_the_fix(env: Env) -> None:
    env.queue(entry("a"))
    state = env.paths.evolve_dir
    state.mkdir(parents=True, exist_ok=True)
    (state / "cycle-history.jsonl").write_bytes(orjson.dumps({"cycle": 1, "result": "harvested", "target": "t",
                                                              "timestamp": "2026-01-01T00:00:00Z"}) + b"\n")
    for p in (state, *state.iterdir()):
        os.chown(p, 1234, 1234)
    state.chmod(0o755)
    before = sorted(p.name for p in state.iterdir())

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*NOPRIV, *evolve_argv(env, *args)], capture_output=True, text=True, timeout=120,
                              env=env.env())

    fix = f"`sudo chown -R root {state}`"
    for args in (("stop", "--reason", "x"), ("fire", "--cycles", "1")):
        r = run(*args)
        assert r.returncode == 78, r.stderr
        (line,) = [ln for ln in r.stderr.splitlines() if not ln.startswith("{")]
        assert f"cannot create or read files in {state} (owned by uid 1234, mode 0755)" in line, line
        assert fix in line and ".tmp" not in line and "Traceback" not in r.stderr
    assert not env.paths.stop.exists() and sorted(p.name for p in state.iterdir()) == before  # no temp left
    (state / "cycle-history.jsonl").chmod(0o600)
    r = run("status")
    assert r.returncode == 78
    assert f"cannot read or write {state / 'cycle-history.jsonl'} (owned by uid 1234, mode 0600)" in r.stderr
    assert fix in r.stderr
    assert_git_clean(env)


def _doctor(cli: Any) -> dict[str, list[dict[str, str]]]:
    r = cli("doctor", "--json")
    found: dict[str, list[dict[str, str]]] = {}
    for f in orjson.loads(r.stdout):
        found.setdefault(f["check"], []).append(f)
    return found


def test_doctor_checks_the_schedule_and_only_what_the_runner_needs(env: Env, cli) -> None:
    env.write_config(schedule={"cron": "61 * * * *", "timezone": "Mars/Olympus_Mons"})
    found = _doctor(cli)
    assert found["schedule.cron"][0]["level"] == "FAIL" and "minute" in found["schedule.cron"][0]["message"]
    assert found["schedule.tz"][0]["level"] == "FAIL" and "Mars/Olympus_Mons" in found["schedule.tz"][0]["message"]
    # The command runner: Claude Code's CLAUDECODE and autocompact checks do not apply.
    assert "CLAUDECODE" not in found and "autocompact" not in found
    env.write_config(schedule={"cron": "*/30 * * * *", "timezone": "Europe/Berlin"},
                     agent={"runner": "claude", "argv": ["no-such-claude"]})
    found = _doctor(cli)
    assert found["schedule.cron"][0]["level"] == "OK" and found["schedule.tz"][0]["level"] == "OK"
    assert "CLAUDECODE" in found and "autocompact" in found


@pytest.mark.parametrize(("lines", "want_minutes"), [
    (["*/30 * * * * cd {repo} && evolve fire"], (0, 30)),
    (["CRON_TZ=UTC", "15 * * * * cd {repo} && evolve fire  # evolve:repo"], (15,)),
    (["@hourly cd {repo} && evolve fire"], (0,)),
    (["*/5 * * * * cd /elsewhere && evolve fire"], None),  # another repository's line
    (["61 * * * * cd {repo} && evolve fire"], None),  # never parses: no time rather than a wrong one
])
def test_cron_next_table(lines: list[str], want_minutes: tuple[int, ...] | None) -> None:
    import datetime as dt

    now = time.time()
    got = cron_next([ln.format(repo="/srv/repo") for ln in lines], "/srv/repo", now)
    if want_minutes is None:
        assert got is None
        return
    assert got is not None and 0 < got[1] - now <= 3600
    assert dt.datetime.fromtimestamp(got[1], dt.UTC).minute in want_minutes


def test_status_finds_the_crontab_lines_next_fire(env: Env, cli) -> None:
    bindir = env.root / "bin"
    bindir.mkdir()
    fake = bindir / "crontab"  # `crontab -l` as a user with this line installed would print it
    fake.write_text(f"#!/bin/sh\necho '# a comment'\necho '*/30 * * * * cd {env.repo.resolve()} && evolve fire'\n")
    fake.chmod(0o755)
    path = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    info = orjson.loads(cli("status", "--json", extra_env=path).stdout)
    nf = info["next_fire"]
    assert nf["source"] == "cron" and "evolve fire" in nf["line"] and 0 < nf["in_s"] <= 1800
    assert nf["at"][14:16] in ("00", "30")
    assert "crontab line" in cli("status", extra_env=path).stdout
    found = _doctor(lambda *a: cli(*a, extra_env=path))
    assert found["schedule"][0]["level"] == "OK" and "next fire" in found["schedule"][0]["message"]


def test_did_you_mean_for_config_keys_and_the_command_line(env: Env, cli, tmp_path: Path) -> None:
    env.write_config(fire={"max_cycle": 3})
    r = cli("fire")
    assert r.code == 78 and "unknown key fire.max_cycle; did you mean fire.max_cycles?" in r.stderr
    del env.config["fire"]["max_cycle"]
    env.write_config(fire={"max_cycles": 3})
    r = cli("stauts")
    assert r.code == 2 and "did you mean 'status'?" in r.stderr
    r = cli("status", "--jsno")
    assert r.code == 2 and "--jsno -> --json" in r.stderr
    # --repo after the subcommand, from a directory outside any repository.
    out = subprocess.run([sys.executable, "-m", "evolve", "status", "--json", "--repo", str(env.repo)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env=env.env(PYTHONPATH=str(Path(__file__).resolve().parents[1])))  # this tree's evolve
    assert out.returncode == 0, out.stderr
    assert orjson.loads(out.stdout)["repo"] == str(env.repo.resolve())
    nested = subprocess.run([sys.executable, "-m", "evolve", "handoff", "continue", "--repo", str(env.repo)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env=env.env(PYTHONPATH=str(Path(__file__).resolve().parents[1])))  # this tree's evolve
    assert nested.returncode == 0, nested.stderr
    assert env.paths.handoff_pending.exists()


# -- item 8: the first hour ----------------------------------------------------------------------------


def test_a_fire_on_a_terminal_ends_with_one_summary_line(env: Env) -> None:
    env.queue(entry("a", "b"))
    code, shown = on_pty(evolve_argv(env, "fire", "--cycles", "1"), env.env(TERM="xterm"))
    assert code == 0, shown
    last = [ln for ln in shown.splitlines() if ln.strip()][-1]
    sha = env.ledger()[-1]["sha"][:10]
    assert re.fullmatch(rf"evolve: cycle 1: 1 improved; commit {sha}; \$0\.\d\d; \d+s; ended: max_cycles \(exit 0\)",
                        last.strip()), last
    assert "\x1b[" not in last  # a clean run has nothing to colour
    assert_git_clean(env)


def test_fire_summary_and_colour_are_pure() -> None:
    entries = [{"cycle": 4, "result": "improved", "sha": "0123456789abcdef", "cost_usd": 0.5},
               {"cycle": 5, "result": "failed", "cost_usd": 0.25}]
    line = fire_summary(entries, reason="breaker_open", exit_code=0, cost_usd=0.0, elapsed_s=125)
    assert line == ("evolve: cycles 4-5: 1 improved, 1 failed; commit 0123456789; $0.75; 2m05s; "
                    "ended: breaker_open (exit 0)")
    assert fire_summary([], reason="halt:user_halt", exit_code=0, cost_usd=0, elapsed_s=0).startswith(
        "evolve: 0 cycles: no cycle; commit none")
    assert fire_summary([], reason="", exit_code=1, cost_usd=0, elapsed_s=0).startswith("FAIL evolve:")
    text = "health     HALTED (exit 75): x\nFAIL  agent  not found\nrecent: HALTED by an agent's text\n"
    painted = colourize(text, True)
    assert painted.count("\x1b[31;1m") == 2 and "recent: HALTED" in painted  # line starts only
    assert colourize(text, False) == text


def test_status_and_doctor_colour_on_a_terminal_only(env: Env, cli) -> None:
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.stop.write_text("lunch\n")
    code, shown = on_pty(evolve_argv(env, "status"), env.env(TERM="xterm"))
    assert code == 75 and "\x1b[31;1mHALTED\x1b[0m" in shown
    code, shown = on_pty(evolve_argv(env, "status"), env.env(TERM="xterm", NO_COLOR="1"))
    assert code == 75 and "\x1b[" not in shown and "HALTED" in shown
    piped = cli("status")
    assert piped.code == 75 and "\x1b[" not in piped.stdout
    env.write_config(schedule={"cron": "61 * * * *"})
    _, shown = on_pty(evolve_argv(env, "doctor"), env.env(TERM="xterm"))
    assert "\x1b[31;1mFAIL\x1b[0m  schedule.cron" in shown
    assert "\x1b[" not in cli("doctor").stdout


def test_evolve_logs_shows_a_cycles_run_log(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    env.steps([{**improved_step(), "stdout": "first agent says hello"},
               {**improved_step("src/two.txt"), "stdout": "second agent says bye"}])
    assert cli("fire", "--cycles", "2").code == 0
    one = cli("logs", "1")
    assert one.code == 0 and "first agent says hello" in one.stdout and "bye" not in one.stdout
    newest = cli("logs")
    assert newest.code == 0 and "second agent says bye" in newest.stdout
    assert cli("logs", "2", "--path").stdout.strip() == str(env.paths.runs_dir / "cycle-2.log")
    missing = cli("logs", "9")
    assert missing.code == 1 and "no run log for cycle 9" in missing.stderr
    assert cli("logs", "0").code == 2
    assert_git_clean(env)


def test_the_daemon_logs_when_the_first_fire_will_be(env: Env) -> None:
    env.write_config(schedule={"cron": "0 0 1 1 *", "timezone": "UTC"})
    err = env.root / "daemon.err"
    with open(err, "wb") as fh:
        proc = subprocess.Popen(evolve_argv(env, "daemon"), stdout=subprocess.DEVNULL, stderr=fh, env=env.env())
    try:
        deadline = time.time() + 60
        first = None
        while first is None and time.time() < deadline:
            for line in err.read_bytes().splitlines():
                obj = orjson.loads(line) if line.startswith(b"{") else {}
                if obj.get("event") == "daemon.first_fire":
                    first = obj
            assert proc.poll() is None, err.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert first is not None, err.read_text()[-2000:]
    assert first["next_fire_at"][5:19] == "01-01T00:00:00" and first["in_s"] > 0
    assert first["repo"] == str(env.repo.resolve())
