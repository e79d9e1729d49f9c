"""`evolve install` and the deploy templates: systemd-analyze verify and calendar, a crontab line run as
cron runs it, and the Kubernetes manifest (docs/DESIGN.md §9, issue 6)."""

from __future__ import annotations

import datetime as dt
import getpass
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml
from support import Env, entry, git, results

from evolve import cronexpr, deploy
from evolve.procgroup import group_alive
from evolve.store.lock import FireLock

ROOT = Path(__file__).parents[1]
EVOLVE = str(Path(sys.executable).parent / "evolve")


def systemd_tool(name: str = "systemd-analyze") -> str:
    """The tool's path; in CI its absence fails (.ci/run installs it), locally it skips."""
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing: .ci/run installs it (apt-get install systemd)")
    pytest.skip(f"{name} is not installed")


def split_printed(text: str, names: list[str]) -> dict[str, str]:
    """The files of `evolve install --print`: each after a line `# <file name>`."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines(keepends=True):
        if line.startswith("# ") and line[2:].strip() in names:
            current = line[2:].strip()
            out[current] = ""
        elif current is not None:
            out[current] += line
    return {k: v.rstrip("\n") + "\n" for k, v in out.items()}


def verify(units_dir: Path, unit: str, *, user: bool) -> None:
    """`systemd-analyze [--user] verify`: exit 0 and not one complaint about our units."""
    tool = systemd_tool()
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "notice"}
    args = [tool]
    if user:
        runtime = units_dir / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        args.append("--user")
    out = subprocess.run([*args, "verify", str(units_dir / unit)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, f"{unit}: {out.stdout}{out.stderr}"
    ours = [ln for ln in (out.stdout + out.stderr).splitlines() if "evolve" in ln]
    assert ours == [], f"{unit}: {ours}"


# -- cron -> OnCalendar, checked against systemd's own calendar ---------------------------------------

BASE = dt.datetime(2026, 3, 6, 22, 0, 0, tzinfo=dt.UTC)  # a Friday, two days before the US DST change
AUTUMN = dt.datetime(2026, 10, 23, 12, 0, 0, tzinfo=dt.UTC)  # two days before Europe's clocks go back
CALENDAR_TABLE = [
    ("*/30 * * * *", "UTC", 6),
    ("*/2 * * * * *", "UTC", 8),
    ("0 9 * * 1-5", "UTC", 6),
    ("0 9 * * mon-fri", "America/New_York", 6),  # crosses the 2026-03-08 DST change
    ("15 2 1,15 * *", "UTC", 4),
    ("0 0 * * 0", "UTC", 3),
    ("0 0 * * 7", "UTC", 3),
    ("30 4 1 * mon", "UTC", 8),  # both day fields restricted: day 1 OR Monday
    ("5-40/10 */3 * jan,jul *", "UTC", 10),  # a stepped range systemd cannot spell: listed
    ("0 0 */2 * *", "UTC", 5),
    ("0 12 */2 * sat", "UTC", 5),  # day field starts with '*': day AND weekday, as in Vixie cron
    ("0 22 * * fri-sun", "UTC", 6),
    ("@hourly", "UTC", 4),
    ("@weekly", "UTC", 3),
    ("@monthly", "Europe/Berlin", 3),
    ("0 0 29 2 *", "UTC", 2),
    ("7 6 5 4 *", "Asia/Kolkata", 2),
    ("*/15 8-17 * * 1-5", "UTC", 12),
    # Across Europe's spring-forward (2026-03-29): 02:30 does not exist that day; midnight the next day does.
    ("30 2 * * *", "Europe/Berlin", 30),
    ("0 0 * * *", "Europe/Berlin", 30),
    # Across the fall-back (2026-10-25): 02:30 happens twice and fires once.
    ("30 2 * * *", "Europe/Berlin", 4, AUTUMN),
]


def systemd_calendar(exprs: list[str], base: dt.datetime, n: int) -> list[dt.datetime]:
    tool = systemd_tool()
    out = subprocess.run(
        [tool, "calendar", f"--iterations={n}", f"--base-time={base.strftime('%Y-%m-%d %H:%M:%S')} UTC", *exprs],
        capture_output=True, text=True, env={**os.environ, "TZ": "UTC"}, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    times = []
    for line in out.stdout.splitlines():
        key, _, value = line.strip().partition(": ")
        if key == "Next elapse" or key.startswith("Iter. #"):
            stamp = dt.datetime.strptime(value.strip(), "%a %Y-%m-%d %H:%M:%S UTC")
            times.append(stamp.replace(tzinfo=dt.UTC))
    return sorted(set(times))[:n]


def apscheduler_times(expr: str, tz: str, base: dt.datetime, n: int) -> list[dt.datetime]:
    from evolve.paths import Paths
    from evolve.scheduler import RepoJob

    trigger = RepoJob("t", Paths.for_repo(ROOT), cronexpr.parse(expr), tz, 0).trigger()
    out, prev = [], None
    now = base + dt.timedelta(microseconds=1)
    while len(out) < n:
        t = trigger.get_next_fire_time(prev, now)
        out.append(t.astimezone(dt.UTC))
        prev, now = t, t + dt.timedelta(microseconds=1)
    return out


@pytest.mark.parametrize("row", CALENDAR_TABLE, ids=lambda r: f"{r[0]} {r[1]}")
def test_cron_to_oncalendar_agrees_with_systemd_calendar_and_apscheduler(row: tuple) -> None:
    expr, tz, n, base = (*row, BASE)[:4]
    spec = cronexpr.parse(expr)
    oncalendar = cronexpr.to_oncalendar(spec, tz)
    assert len(oncalendar) == (2 if spec.either_day else 1)
    ours = [t.astimezone(dt.UTC) for t in
            cronexpr.next_times(spec, base.astimezone(cronexpr.ZoneInfo(tz)), n, max_days=366 * 10)]
    assert len(ours) == n
    # systemd computes the union of the OnCalendar= lines a timer would carry.
    assert systemd_calendar(oncalendar, base, n) == ours, oncalendar
    # The daemon's trigger (an APScheduler 3.x trigger on the same calendar, in every zone).
    assert apscheduler_times(expr, tz, base, n) == ours


def test_daemon_trigger_keeps_every_day_across_dst_in_every_zone() -> None:
    """One trigger for every zone, on cron's own calendar: no day skipped around a DST change.

    APScheduler 3.x's CronTrigger skips Berlin midnight on 2026-03-30 (APScheduler #606).
    """
    from evolve.paths import Paths
    from evolve.scheduler import RepoJob, SpecTrigger

    def trigger(expr: str, tz: str, jitter_s: int = 0) -> SpecTrigger:
        t = RepoJob("t", Paths.for_repo(ROOT), cronexpr.parse(expr), tz, jitter_s).trigger()
        assert isinstance(t, SpecTrigger)  # the same engine with or without DST
        return t

    def run(trig: SpecTrigger, base: dt.datetime, n: int = 4) -> list[dt.datetime]:
        out, prev, now = [], None, base
        for _ in range(n):
            prev = trig.get_next_fire_time(prev, now)
            now = prev + dt.timedelta(microseconds=1)
            out.append(prev)
        return out

    base = dt.datetime(2026, 3, 27, 12, tzinfo=dt.UTC)
    berlin = cronexpr.ZoneInfo("Europe/Berlin")
    spring = [dt.datetime(2026, 3, d, 0, tzinfo=berlin) for d in (28, 29, 30, 31)]
    assert run(trigger("0 0 * * *", "Europe/Berlin"), base) == spring
    utc = [dt.datetime(2026, 3, d, 0, tzinfo=dt.UTC) for d in (28, 29, 30, 31)]
    assert run(trigger("0 0 * * *", "UTC"), base) == utc
    # A monthly job on the first keeps April too.
    monthly = run(trigger("0 0 1 * *", "Europe/Berlin"), base, 2)
    assert monthly == [dt.datetime(2026, 4, 1, tzinfo=berlin), dt.datetime(2026, 5, 1, tzinfo=berlin)]
    # Jitter (schedule.jitter_s) delays each fire by up to that many seconds, never earlier.
    for got, want in zip(run(trigger("0 0 * * *", "Europe/Berlin", 30), base), spring, strict=True):
        assert want <= got <= want + dt.timedelta(seconds=30)


def test_oncalendar_renderings_read_well() -> None:
    def one(expr: str) -> list[str]:
        return cronexpr.to_oncalendar(cronexpr.parse(expr), "UTC")

    assert one("*/30 * * * *") == ["*-*-* *:00/30:00 UTC"]
    assert one("0 9 * * 1-5") == ["Mon..Fri *-*-* 09:00:00 UTC"]
    assert one("0 0 * * 0,6") == ["Sat,Sun *-*-* 00:00:00 UTC"]
    assert one("*/2 * * * * *") == ["*-*-* *:*:00/2 UTC"]
    assert one("30 4 1 * mon") == ["Mon *-*-* 04:30:00 UTC", "*-*-01 04:30:00 UTC"]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", "expected 5 fields"),
        ("60 * * * *", "minute field: 60 is outside 0-59"),
        ("* * * * 8", "weekday field: 8 is outside 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "step must be at least 1"),
        ("0 0 30 2 *", "never fires"),
        ("@reboot", "unknown macro"),
        ("0 0 L * *", "day field"),
    ],
)
def test_bad_cron_expressions_say_which_field(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cronexpr.parse(expr)


def test_crontab_schedule_has_minute_resolution() -> None:
    assert cronexpr.crontab_schedule(cronexpr.parse("0 */5 * * * *")) == "*/5 * * * *"
    assert cronexpr.crontab_schedule(cronexpr.parse("@daily")) == "0 0 * * *"
    with pytest.raises(ValueError, match="minute resolution"):
        cronexpr.crontab_schedule(cronexpr.parse("*/2 * * * * *"))


# -- systemd units ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        ((), ["evolve@repo.service", "evolve@repo.timer"]),
        (("--user",), ["evolve@repo.service", "evolve@repo.timer"]),
        (("--daemon",), ["evolve-daemon@repo.service"]),
        (("--user", "--daemon", "--schedule", "*/2 * * * * *"), ["evolve-daemon@repo.service"]),
        (("--schedule", "30 4 1 * mon"), ["evolve@repo.service", "evolve@repo.timer"]),
        (("--user", "--schedule", "*/2 * * * * *"), ["evolve@repo.service", "evolve@repo.timer"]),
    ],
)
def test_rendered_units_pass_systemd_analyze_verify(env: Env, cli, tmp_path: Path, flags: tuple[str, ...],
                                                     names: list[str]) -> None:
    r = cli("install", "systemd", "--print", *flags)
    assert r.code == 0, r.stderr
    files = split_printed(r.stdout, names)
    assert sorted(files) == sorted(names)
    units = tmp_path / "units"
    units.mkdir()
    for name, text in files.items():
        (units / name).write_text(text, encoding="utf-8")
        assert str(env.repo) in text and "{{" not in text
    for name in names:
        verify(units, name, user="--user" in flags)
    text = "".join(files.values())
    # Absolute paths, this environment's evolve, and the sandbox the issue asks for.
    assert f"ExecStart={EVOLVE} --repo {env.repo} " in text
    for key in ("SuccessExitStatus=75", "TimeoutStartSec=", "KillMode=control-group", "NoNewPrivileges=yes",
                "ProtectSystem=strict", f"ReadWritePaths={env.repo} "):
        assert key in text, key
    # A private /tmp would hide a repository under /tmp (systemd: 226/NAMESPACE), as this test's is.
    in_tmp = str(env.repo).startswith(("/tmp/", "/var/tmp/"))
    assert ("PrivateTmp=no" if in_tmp else "PrivateTmp=yes") in text
    assert ("User=" in text) is ("--user" not in flags)
    if "--daemon" in flags:
        for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "RestartPreventExitStatus=75 78"):
            assert key in text, key
        if "--schedule" in flags:
            assert 'Environment="EVOLVE_SCHEDULE_CRON=*/2 * * * * *"' in text
    else:
        timer = files["evolve@repo.timer"]
        assert "Persistent=true" in timer and "RandomizedDelaySec=" in timer
        schedule = flags[flags.index("--schedule") + 1] if "--schedule" in flags else "*/30 * * * *"
        for value in cronexpr.to_oncalendar(cronexpr.parse(schedule), "UTC"):
            assert f"OnCalendar={value}\n" in timer
        assert ("AccuracySec=1s" in timer) is schedule.startswith("*/2 * * * * *")
    assert "(write to " in r.stderr and "enable: " in r.stderr


def test_deploy_directory_is_the_generic_rendering() -> None:
    files = deploy.generic_files()
    on_disk = {str(p.relative_to(ROOT / "deploy")): p.read_text(encoding="utf-8")
               for p in (ROOT / "deploy").rglob("*") if p.is_file() and p.name != "README.md"}
    assert sorted(on_disk) == sorted(files), "run `python -m evolve.deploy deploy`"
    for rel, text in files.items():
        assert on_disk[rel] == text, f"deploy/{rel} is stale: run `python -m evolve.deploy deploy`"


@pytest.mark.parametrize("variant", ["systemd", "systemd/user"])
def test_deploy_templates_verify_for_an_escaped_repo_path(tmp_path: Path, variant: str) -> None:
    repo = tmp_path / "srv" / "my-repo"
    repo.mkdir(parents=True)
    escaped = subprocess.run([systemd_tool("systemd-escape"), "--path", str(repo)], capture_output=True, text=True,
                             check=True).stdout.strip()
    units = tmp_path / "units"
    units.mkdir()
    for template in ("evolve@.service", "evolve@.timer", "evolve-daemon@.service"):
        shutil.copy(ROOT / "deploy" / variant / template, units / template)
    for template in ("evolve@.service", "evolve@.timer", "evolve-daemon@.service"):
        verify(units, template.replace("@.", f"@{escaped}."), user=variant.endswith("user"))


def test_install_writes_units_where_they_belong_and_says_how_to_enable(env: Env, cli, tmp_path: Path) -> None:
    xdg = tmp_path / "config"
    r = cli("install", "systemd", "--user", extra_env={"XDG_CONFIG_HOME": str(xdg)})
    assert r.code == 0, r.stderr
    unit_dir = xdg / "systemd" / "user"
    assert sorted(p.name for p in unit_dir.iterdir()) == ["evolve@repo.service", "evolve@repo.timer"]
    assert "enable: systemctl --user daemon-reload && systemctl --user enable --now evolve@repo.timer" in r.stdout
    printed = cli("install", "systemd", "--user", "--print")
    assert split_printed(printed.stdout, ["evolve@repo.service", "evolve@repo.timer"]) == {
        p.name: p.read_text() for p in unit_dir.iterdir()}

    r = cli("install", "systemd", "--daemon", "--name", "fleet1", "--dest", str(tmp_path / "d"))
    assert r.code == 0, r.stderr
    assert (tmp_path / "d" / "evolve-daemon@fleet1.service").is_file()
    assert "systemctl link " in r.stdout and "enable --now evolve-daemon@fleet1.service" in r.stdout

    r = cli("install", "kubernetes", "--image", "registry.example.com/evolve:1",
            extra_env={"XDG_CONFIG_HOME": str(xdg)})
    assert r.code == 0, r.stderr
    manifest = xdg / "evolve" / "kubernetes" / "evolve-repo.yaml"
    assert manifest.is_file() and f"enable: kubectl apply -f {manifest}" in r.stdout


def test_install_usage_errors(env: Env, cli) -> None:
    r = cli("install", "systemd", "--print", "--schedule", "61 * * * *")
    assert r.code == 2 and "minute field: 61" in r.stderr
    r = cli("install", "cron", "--print", "--schedule", "*/2 * * * * *")
    assert r.code == 2 and "minute resolution" in r.stderr
    r = cli("install", "cron", "--daemon", "--print")
    assert r.code == 2 and "--daemon" in r.stderr
    env.write_config(schedule={"cron": "not a cron"})
    r = cli("install", "systemd", "--print")
    assert r.code == 78 and "schedule.cron" in r.stderr


# -- cron ---------------------------------------------------------------------------------------------


def cron_command(crontab_text: str) -> str:
    """The command of the one job line, as cron hands it to /bin/sh (``\\%`` is a literal %)."""
    (line,) = [ln for ln in crontab_text.splitlines() if ln and not ln.startswith("#")]
    command = line.split(None, 5)[5]
    assert "%" not in command.replace("\\%", "")
    return command.replace("\\%", "%")


def run_like_cron(command: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """What cron does: /bin/sh -c with a bare environment (HOME, LOGNAME, SHELL, a minimal PATH), cwd HOME.

    In a development checkout PYTHONPATH comes along too (a crontab line above the job would carry it),
    so the evolve that runs is the tree under test; nothing the gate sees depends on it.
    """
    dev = [f"PYTHONPATH={os.environ['PYTHONPATH']}"] if "PYTHONPATH" in os.environ else []
    return subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}", "LOGNAME=cron", "SHELL=/bin/sh", *dev,
         "sh", "-c", command],
        cwd=home, capture_output=True, text=True, timeout=timeout,
    )


# -- the gate's environment under a scheduled fire is the one a hand-run fire has (issue 22, item 1) ---

# The gate command: records the interpreter it got and its environment, then imports a module only the
# operator's own toolchain has (as a project's tests import its dependencies).
GATE_PROBE = (
    "import json, os, sys\n"
    "import tempfile\n"
    "json.dump({'prefix': sys.prefix, 'executable': sys.executable, 'env': dict(os.environ),"
    " 'tmp': tempfile.gettempdir()},"
    " open(sys.argv[1], 'w'))\n"
    "import projdep\n"
)


def operator_toolchain(root: Path) -> Path:
    """The operator's own interpreter, not evolve's: a virtualenv whose site-packages alone holds ``projdep``.
    Its ``bin`` goes first on the PATH `evolve install` and a hand-run fire see, as an activated venv's does."""
    venv = root / "toolchain"
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "projdep.py").write_text("WHERE = __file__\n")
    return venv


def probe_gate(env: Env, record: Path) -> None:
    """The gate runs the probe with a bare ``python``: whichever PATH gives it."""
    env.write_config(gate={"commands": [["python", "-c", GATE_PROBE, str(record)]]})


def probed(record: Path) -> dict:
    assert record.exists(), "the gate never ran"
    out = orjson.loads(record.read_bytes())
    record.unlink()
    return out


def test_crontab_line_works_under_a_bare_cron_environment(env: Env, cli, tmp_path: Path) -> None:
    env.queue(entry("a", "b", "c"))
    env.write_config(fire={"max_cycles": 1})
    r = cli("install", "cron", "--user", "--print")
    assert r.code == 0, r.stderr
    files = split_printed(r.stdout, ["evolve-repo.crontab"])
    text = files["evolve-repo.crontab"]
    assert text.splitlines()[-1].startswith("*/30 * * * * cd ")
    command = cron_command(text)
    assert "flock -n -E 75" in command and f"{EVOLVE} fire" in command
    home = tmp_path / "home"
    home.mkdir()
    # The user's real git identity lives in ~/.gitconfig; cron passes nothing else.
    (home / ".gitconfig").write_text("[user]\n\tname = cron\n\temail = cron@localhost\n")

    done = run_like_cron(command, home)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert results(env.ledger()) == ["improved"]
    log = env.paths.evolve_dir / "cron.log"
    events = [orjson.loads(ln)["event"] for ln in log.read_bytes().splitlines() if ln.startswith(b"{")]
    assert "fire.start" in events and "fire.end" in events

    # Defence in depth: the outer flock alone turns a tick away with 75, before evolve even starts.
    cron_lock = str(env.paths.evolve_dir / "cron.lock")
    # The holder keeps the lock until it is killed below; wait until it really holds it (no speed assumption).
    holder = subprocess.Popen(["flock", "-x", cron_lock, "sleep", "3600"], start_new_session=True)
    try:
        deadline = time.time() + 300
        while subprocess.run(["flock", "-n", cron_lock, "true"]).returncode == 0:
            assert time.time() < deadline and holder.poll() is None, "the holder never took the lock"
            time.sleep(0.05)
        busy = run_like_cron(command, home)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock's child (sleep) holds the lock too
        holder.wait()
    assert busy.returncode == 75
    # evolve's own lock (what every other trigger takes) also turns it away with 75.
    lock = FireLock(env.paths.lock)
    assert lock.acquire()
    try:
        busy = run_like_cron(command, home)
    finally:
        lock.release()
    assert busy.returncode == 75
    assert results(env.ledger()) == ["improved"]
    assert run_like_cron(command, home).returncode == 0
    assert results(env.ledger()) == ["improved", "improved"]


def test_scheduled_gate_gets_the_interpreter_a_hand_run_fire_gets(env: Env, cli, tmp_path: Path) -> None:
    """The operator's python (a venv with the project's dependency) first on their PATH, evolve run by its
    absolute path: by hand the gate imports the dependency; the rendered crontab line, run as cron runs it,
    gives the gate the same interpreter and the same PATH, not evolve's own virtualenv."""
    venv = operator_toolchain(tmp_path)
    shell_path = f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"
    # The operator's shell: their python first, a locale and a time zone cron would not give the gate.
    shell = {"PATH": shell_path, "LANG": "C.UTF-8", "LC_COLLATE": "C", "TZ": "Europe/Berlin"}
    record = tmp_path / "gate-probe.json"  # outside the checkout: the sandboxed gate cannot write there
    probe_gate(env, record)
    env.write_config(fire={"max_cycles": 1})
    env.queue(entry("a", "b"))

    by_hand = cli("fire", extra_env=shell)
    assert by_hand.code == 0, by_hand.stderr
    assert results(env.ledger()) == ["improved"]
    hand = probed(record)
    assert hand["prefix"] == str(venv) and hand["env"]["PATH"] == shell_path

    r = cli("install", "cron", "--user", "--print", extra_env=shell)
    assert r.code == 0, r.stderr
    command = cron_command(split_printed(r.stdout, ["evolve-repo.crontab"])["evolve-repo.crontab"])
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = cron\n\temail = cron@localhost\n")
    done = run_like_cron(command, home)
    assert done.returncode == 0, (done.stdout, done.stderr)
    ledger = env.ledger()
    assert results(ledger) == ["improved", "improved"], (env.paths.evolve_dir / "cron.log").read_text()[-3000:]
    scheduled = probed(record)
    assert scheduled["prefix"] == hand["prefix"] == str(venv)
    for key in shell:
        assert scheduled["env"].get(key) == hand["env"][key] == shell[key], key
    # Both landed on the branch; nothing left half-done.
    log = git(env.repo, "log", "--format=%H", "main").split()
    assert [e["sha"] for e in ledger] == log[:2][::-1]
    assert not (env.repo / ".git" / "index.lock").exists()
    assert git(env.repo, "status", "--porcelain").strip() == ""


OWN, REL = deploy.OWN_VENV, deploy.RELATIVE
LINKS = {"/home/u/evolve-link/bin": "/opt/evolve/bin"}  # a symlinked venv: compared by where it leads
SCHEDULED_PATH_TABLE = [
    # (shell PATH, evolve's own venv bins, repo) -> (rendered PATH, left out)
    (("/srv/tc/bin:/usr/local/bin:/usr/bin:/bin", ["/opt/evolve/bin"], "/srv/repo"),
     ("/srv/tc/bin:/usr/local/bin:/usr/bin:/bin", [])),
    # evolve's venv activated: left out wherever it is; the operator's own python is what stays
    (("/opt/evolve/bin:/home/u/.local/bin:/usr/bin:/bin", ["/opt/evolve/bin"], "/srv/repo"),
     ("/home/u/.local/bin:/usr/bin:/bin:/usr/local/bin", [("/opt/evolve/bin", OWN)])),
    (("/srv/tc/bin:/opt/evolve/bin:/usr/bin", ["/opt/evolve/bin"], "/srv/repo"),
     ("/srv/tc/bin:/usr/bin:/usr/local/bin:/bin", [("/opt/evolve/bin", OWN)])),
    (("/home/u/evolve-link/bin:/usr/local/bin:/usr/bin:/bin", ["/opt/evolve/bin"], "/srv/repo"),
     ("/usr/local/bin:/usr/bin:/bin", [("/home/u/evolve-link/bin", OWN)])),
    # evolve installed into the project's own venv in the checkout: that venv is the project's toolchain
    (("/srv/repo/.venv/bin:/usr/bin:/bin", ["/srv/repo/.venv/bin"], "/srv/repo"),
     ("/srv/repo/.venv/bin:/usr/bin:/bin:/usr/local/bin", [])),
    # relative and empty entries (the current directory): never under cron or systemd
    ((".:node_modules/.bin::/usr/bin:/bin", [], "/srv/repo"),
     ("/usr/bin:/bin:/usr/local/bin", [(".", REL), ("node_modules/.bin", REL)])),
    # duplicates: the first stays (what a lookup finds is unchanged)
    (("/usr/bin:/bin:/usr/bin:/usr/local/bin:/bin", [], "/srv/repo"), ("/usr/bin:/bin:/usr/local/bin", [])),
    (("", [], "/srv/repo"), ("/usr/local/bin:/usr/bin:/bin", [])),
]


@pytest.mark.parametrize(("given", "want"), SCHEDULED_PATH_TABLE, ids=lambda v: repr(v)[:60])
def test_scheduled_path_is_the_shells_less_evolves_own_venv(given: tuple, want: tuple) -> None:
    shell, bins, repo = given
    plan = deploy.scheduled_path(shell, bins, repo, real=lambda p: LINKS.get(p, p))
    assert (plan.value, list(plan.dropped)) == want
    assert plan.added == tuple(d for d in deploy.SYSTEM_PATH if d not in shell.split(":"))


WRITABLE_TABLE = [
    # (repo, state dir, configured dirs) -> ReadWritePaths= words
    (("/srv/repo", "/srv/repo/.agents/evolve", ("/var/lib/node_exporter", "/srv/repo/.agents/rpi")),
     ["/srv/repo", "-/var/lib/node_exporter"]),
    (("/srv/repo", "/var/lib/evolve/repo", ("/var/lib/evolve/repo/cache", "/srv/wt", "/srv/wt/sub", "/srv/wt")),
     ["/srv/repo", "/var/lib/evolve/repo", "-/srv/wt"]),
    # a repository under /tmp: PrivateTmp off, and then the real /tmp and /var/tmp must stay writable
    (("/tmp/repo", "/tmp/repo/.agents/evolve", ()), ["/tmp/repo", "-/tmp", "-/var/tmp"]),
    (("/srv/repo", "/srv/repo/.agents/evolve", ("/var/tmp/metrics",)),
     ["/srv/repo", "-/var/tmp/metrics", "-/tmp", "-/var/tmp"]),
    (("/srv/repo", "/srv/repo/.agents/evolve", ("/srv/repo-metrics",)), ["/srv/repo", "-/srv/repo-metrics"]),
]


@pytest.mark.parametrize(("given", "want"), WRITABLE_TABLE, ids=lambda v: repr(v)[:60])
def test_readwritepaths_cover_every_directory_the_config_writes(given: tuple, want: list[str]) -> None:
    repo, state, written = given
    t = deploy.Target(name="r", repo=repo, state_dir=state, evolve=("/usr/bin/evolve",), path="/usr/bin",
                      home="/home/u", cron="*/30 * * * *", rw_paths=written)
    assert deploy.writable(t) == [*want, "-/home/u/.claude", "-/home/u/.claude.json", "-/home/u/.local/state/evolve"]


def test_install_drops_evolves_venv_and_says_what_scheduled_fires_get(env: Env, cli, tmp_path: Path) -> None:
    venv = tmp_path / "toolchain"
    (venv / "bin").mkdir(parents=True)
    own = str(Path(sys.prefix) / "bin")  # the venv `evolve install` runs from (this interpreter's)
    shell = f"{own}:{venv}/bin:/usr/bin:/bin"
    scheduled = f"{venv}/bin:/usr/bin:/bin:/usr/local/bin"
    r = cli("install", "systemd", "--user", "--print", extra_env={"PATH": shell})
    assert r.code == 0, r.stderr
    assert f"\nEnvironment=PATH={scheduled}\n" in r.stdout
    assert f"\nExecStart={EVOLVE} --repo {env.repo} fire\n" in r.stdout  # evolve by its absolute path
    assert f"PATH: left out {own!r}: evolve's own virtualenv" in r.stderr
    assert f"PATH for scheduled fires (their gate and agent): {scheduled} (change it with --path)" in r.stderr
    assert "note: `evolve` is not on that PATH" in r.stderr
    r = cli("install", "cron", "--user", "--print", extra_env={"PATH": shell})
    assert f" PATH={scheduled} " in cron_command(split_printed(r.stdout, ["evolve-repo.crontab"])[
        "evolve-repo.crontab"])
    # --path: exactly what it says, in every kind, evolve still by its absolute path.
    chosen = f"{venv}/bin:/opt/tools/bin:/usr/bin:/bin"
    r = cli("install", "systemd", "--print", "--daemon", "--path", chosen, extra_env={"PATH": shell})
    assert f"\nEnvironment=PATH={chosen}\n" in r.stdout and "left out" not in r.stderr
    r = cli("install", "cron", "--print", "--path", chosen)
    assert f" PATH={chosen} " in r.stdout
    r = cli("install", "kubernetes", "--print", "--image", "r/evolve:1", "--path", chosen)
    assert f'value: "{chosen}"' in r.stdout


def test_install_carries_the_state_env_and_every_written_directory(env: Env, cli, tmp_path: Path) -> None:
    """EVOLVE_DIR and EVOLVE_NEXTWORK of the shell reach the scheduled fire, and every directory the config
    makes it write is in ReadWritePaths= (systemd-analyze verify accepts the units)."""
    state, queue, metrics, trees = (tmp_path / n for n in ("state", "queue", "metrics", "trees"))
    for d in (state, queue, metrics, trees):
        d.mkdir()
    env.write_config(metrics={"textfile_dir": str(metrics)}, git={"worktree_dir": str(trees / "repo")})
    shutil.copy(env.paths.config, state / "config.toml")  # the config lives in the state directory
    shell = {"EVOLVE_DIR": str(state), "EVOLVE_NEXTWORK": str(queue / "next-work.jsonl")}
    r = cli("install", "systemd", "--print", extra_env=shell)
    assert r.code == 0, r.stderr
    files = split_printed(r.stdout, ["evolve@repo.service", "evolve@repo.timer"])
    unit = files["evolve@repo.service"]
    assert f"\nEnvironment=EVOLVE_DIR={state}\n" in unit
    assert f"\nEnvironment=EVOLVE_NEXTWORK={queue}/next-work.jsonl\n" in unit
    (rw,) = [ln.removeprefix("ReadWritePaths=").split() for ln in unit.splitlines() if ln.startswith("ReadWrite")]
    # The worktree's parent: evolve removes and adds the worktree directory itself.
    assert rw[:5] == [str(env.repo), str(state), f"-{metrics}", f"-{queue}", f"-{trees}"]
    units = tmp_path / "units"
    units.mkdir()
    for name, text in files.items():
        (units / name).write_text(text)
    verify(units, "evolve@repo.service", user=False)
    daemon = cli("install", "systemd", "--daemon", "--print", extra_env=shell).stdout
    assert f"\nEnvironment=EVOLVE_DIR={state}\n" in daemon and " ".join(rw) in daemon
    line = cron_command(split_printed(cli("install", "cron", "--user", "--print", extra_env=shell).stdout,
                                      ["evolve-repo.crontab"])["evolve-repo.crontab"])
    assert f" EVOLVE_DIR={state} EVOLVE_NEXTWORK={queue}/next-work.jsonl " in line
    assert f"mkdir -p {state} " in line and f"{state}/cron.log" in line
    # Without them in the shell the units set neither (a fire finds .agents/evolve itself).
    plain = cli("install", "systemd", "--print").stdout
    assert "EVOLVE_DIR" not in plain and "EVOLVE_NEXTWORK" not in plain
    # The locale and TZ the shell has (what a hand-run gate runs under), each its own word; never a secret.
    r = cli("install", "systemd", "--print", extra_env={"LANG": "de_DE.UTF-8", "LC_ALL": "C.UTF-8",
                                                        "TZ": "Europe/Berlin", "ANTHROPIC_API_KEY": "sk-ant-x" * 4})
    unit = split_printed(r.stdout, ["evolve@repo.service"])["evolve@repo.service"]
    for setting in ("LANG=de_DE.UTF-8", "LC_ALL=C.UTF-8", "TZ=Europe/Berlin"):
        assert f"\nEnvironment={setting}\n" in unit
    assert "sk-ant" not in r.stdout + r.stderr


def test_system_crontab_has_a_user_field(env: Env, cli) -> None:
    r = cli("install", "cron", "--print")
    assert r.code == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")]
    fields = line.split(None, 6)
    assert fields[5] == getpass.getuser()
    assert fields[6].startswith("cd ")
    assert "(write to /etc/cron.d)" in r.stderr


# -- Kubernetes ---------------------------------------------------------------------------------------


def check_manifest(text: str, schedule: str) -> dict:
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "PersistentVolumeClaim", "CronJob"]
    configmap, pvc, cron = docs
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    spec = cron["spec"]
    assert spec["schedule"] == schedule
    assert spec["timeZone"] == "UTC"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] >= 10
    assert spec["suspend"] is False
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    assert job["activeDeadlineSeconds"] >= 3600
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    work, config = pod["volumes"]
    assert work["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert config["configMap"]["name"] == configmap["metadata"]["name"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/work"}  # repository and state (.agents/evolve) both on the claim
    script = container["args"][0]
    assert "--repo /work/repo fire" in script
    assert {"name": "HOME", "value": "/work/home"} in container["env"]
    assert pod["initContainers"][0]["volumeMounts"][0]["mountPath"] == "/work"
    return cron


def test_kubernetes_manifest_parses_with_the_fields(env: Env, cli) -> None:
    subprocess.run(["git", "remote", "add", "origin", "https://git.example.com/team/repo.git"], cwd=env.repo,
                   check=True)
    r = cli("install", "kubernetes", "--print", "--schedule", "0 */2 * * *", "--image", "registry/evolve:1")
    assert r.code == 0, r.stderr
    files = split_printed(r.stdout, ["evolve-repo.yaml"])
    cron = check_manifest(files["evolve-repo.yaml"], "0 */2 * * *")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry/evolve:1"
    assert pod["initContainers"][0]["env"] == [
        {"name": "EVOLVE_GIT_URL", "value": "https://git.example.com/team/repo.git"},
        {"name": "HOME", "value": "/work/home"}]
    check_manifest((ROOT / "deploy" / "kubernetes" / "cronjob.yaml").read_text(), "*/30 * * * *")


def test_kubernetes_container_script_maps_75_and_forwards_sigterm(env: Env, tmp_path: Path) -> None:
    """The container's shell (PID 1 in the pod) run here: busy is success, SIGTERM reaches evolve."""
    manifest = deploy.kubernetes(deploy.generic_targets()[1])["cronjob.yaml"]
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    script = docs[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    # The image's evolve is this environment's here (the pod starts it by that absolute path).
    script = script.replace("/work/repo", str(env.repo)).replace(deploy.IMAGE_EVOLVE, EVOLVE)
    path = "/usr/bin:/bin"

    lock = FireLock(env.paths.lock)
    assert lock.acquire()
    try:
        busy = subprocess.run(["sh", "-c", script], env=env.env(PATH=path), capture_output=True, timeout=60)
    finally:
        lock.release()
    assert busy.returncode == 0, busy.stderr

    env.queue(entry("alpha"))
    env.steps([{"write": [{"path": "half.txt", "content": "partial"}], "hang": True}])
    shell = subprocess.Popen(["sh", "-c", script], env=env.env(PATH=path), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while not env.calls() and time.time() < deadline:
        time.sleep(0.05)
    pgid = env.calls()[0]["pgid"]
    shell.send_signal(signal.SIGTERM)
    assert shell.wait(timeout=30) == 143
    assert results(env.ledger()) == ["interrupted"]
    assert not group_alive(pgid)
