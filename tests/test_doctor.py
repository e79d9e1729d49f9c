"""``evolve doctor`` on a deliberately broken setup and on a good one: OK / WARN / FAIL lines with fixes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import orjson
from support import Env

from evolve import doctor

MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
35 22 0:31 / /srv/nfs rw,relatime shared:20 - nfs4 fileserver:/export rw,vers=4.2
36 22 0:32 / /srv/nfs/local\\040disk rw,relatime shared:21 - xfs /dev/sdb1 rw
"""


def findings(cli, *args: str, **env: str) -> tuple[int, dict[str, list[dict[str, str]]]]:
    r = cli("doctor", "--json", *args, extra_env=env or None)
    out: dict[str, list[dict[str, str]]] = {}
    for f in orjson.loads(r.stdout):
        out.setdefault(f["check"], []).append(f)
    return r.code, out


def level(found: dict[str, list[dict[str, str]]], check: str) -> str:
    return found[check][0]["level"]


def fake_bin(dirpath: Path, name: str, body: str) -> Path:
    dirpath.mkdir(parents=True, exist_ok=True)
    p = dirpath / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


def test_broken_setup(env: Env, cli) -> None:
    # config: an unknown key; agent: a binary that does not exist; tracker: .beads/ but no bd;
    # CLAUDECODE set; then the state dir under a regular file.
    env.paths.config.write_text('[agent]\nargv = ["/nonexistent/claude"]\nbogus = 1\n')
    (env.repo / ".beads").mkdir()
    blocker = env.root / "not-a-dir"
    blocker.write_text("x")
    code, found = findings(cli, CLAUDECODE="1", PATH="/usr/bin:/bin")
    assert code == 1
    assert level(found, "git") == "OK"
    cfg = found["config"][0]
    assert cfg["level"] == "FAIL" and "agent.bogus" in cfg["message"] and "78" in cfg["fix"]
    # The config is invalid, so the defaults are checked: claude is not on this PATH.
    agent = found["agent"][0]
    assert agent["level"] == "FAIL" and "not found" in agent["message"] and "npm install" in agent["fix"]
    assert level(found, "CLAUDECODE") == "WARN" and "plain shell" in found["CLAUDECODE"][0]["fix"]
    tracker = found["tracker"][0]
    assert tracker["level"] == "FAIL" and ".beads" in tracker["message"]
    assert level(found, "state dir") == "OK"
    code, found = findings(cli, EVOLVE_DIR=str(blocker / "evolve"), PATH="/usr/bin:/bin")
    sd = found["state dir"][0]
    assert code == 1 and sd["level"] == "FAIL" and "not a directory" in sd["message"] and sd["fix"]
    assert level(found, "schedule") == "WARN" and "evolve install" in found["schedule"][0]["fix"]
    assert level(found, "autocompact") in ("WARN",)

    r = cli("doctor", extra_env={"CLAUDECODE": "1", "PATH": "/usr/bin:/bin"})
    lines = r.stdout.splitlines()
    assert r.code == 1
    assert any(ln.startswith("FAIL  config") for ln in lines)
    assert any(ln.startswith("WARN  CLAUDECODE") for ln in lines)
    assert any(ln.strip().startswith("fix: ") for ln in lines)
    assert "FAIL," in lines[-1] and "WARN," in lines[-1]


def test_broken_agent_binary_and_markers(env: Env, cli) -> None:
    bindir = env.root / "bin"
    fake_bin(bindir, "claude", "echo 'boom: node not found' >&2; exit 127")
    env.write_config(agent={"runner": "claude", "argv": ["claude"]})
    env.paths.stop.write_text("lunch\n")
    old = time.time() - 9 * 86400
    os.utime(env.paths.stop, (old, old))
    env.paths.kill.write_text("now\n")
    code, found = findings(cli, PATH=f"{bindir}:/usr/bin:/bin", HOME=str(env.root))
    assert code == 1
    agent = found["agent"][0]
    assert agent["level"] == "FAIL" and "--version" in agent["message"] and "boom" in agent["message"]
    assert level(found, "agent auth") == "WARN"
    markers = {m["message"].split()[0]: m for m in found["marker"]}
    assert "TTL" in markers["STOP"]["message"] and markers["STOP"]["fix"] == "evolve resume"
    assert "fires halt" in markers["KILL"]["message"] and "resume --kill" in markers["KILL"]["fix"]


def test_good_setup(env: Env, cli) -> None:
    bindir = env.root / "bin"
    fake_bin(bindir, "claude", "echo '2.1.332 (Claude Code)'")
    fake_bin(bindir, "bd", "echo '[]'")
    fake_bin(bindir, "crontab", f"echo '*/30 * * * * cd {env.repo} && evolve fire'")
    home = env.root / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / ".credentials.json").write_text("{}")
    (env.repo / ".claude").mkdir()
    (env.repo / ".claude" / "settings.json").write_text('{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "40"}}')
    env.write_config(agent={"runner": "claude", "argv": ["claude"]})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    code, found = findings(cli, PATH=f"{bindir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin", HOME=str(home))
    assert code == 0, found
    for check in ("git", "config", "agent", "agent auth", "CLAUDECODE", "tracker", "state dir", "filesystem",
                  "schedule"):
        assert level(found, check) == "OK", found[check]
    assert "2.1.332" in found["agent"][0]["message"]
    assert "crontab" in found["schedule"][0]["message"]
    assert level(found, "autocompact") in ("OK", "WARN")  # OK once the harness detector is installed


def test_not_a_git_repo(tmp_path: Path) -> None:
    import subprocess

    plain = tmp_path / "plain"
    plain.mkdir()
    r = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(plain), "doctor"], capture_output=True,
                       text=True, env={k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")})
    assert r.returncode == 1
    assert r.stdout.startswith("FAIL  git") and "git init" in r.stdout


def test_network_filesystem_is_a_warning(tmp_path: Path) -> None:
    assert doctor.fs_type(Path("/home/me/repo"), MOUNTINFO) == "ext4"
    assert doctor.fs_type(Path("/srv/nfs/team/repo"), MOUNTINFO) == "nfs4"
    assert doctor.fs_type(Path("/srv/nfs/local disk/repo"), MOUNTINFO) == "xfs"
    assert doctor.fs_type(Path("/srv/nfsother"), MOUNTINFO) == "ext4"
    d = tmp_path / "evolve"
    d.mkdir()
    fake = MOUNTINFO.replace(" /srv/nfs ", f" {tmp_path} ")
    found = {f.check: f for f in doctor.check_state_dir(d, fake)}
    assert found["state dir"].level == "OK"
    fs = found["filesystem"]
    assert fs.level == "WARN" and "nfs4" in fs.message and "local disk" in fs.fix


def test_missing_state_dir_is_a_warning_with_init_as_the_fix(tmp_path: Path) -> None:
    found = doctor.check_state_dir(tmp_path / ".agents" / "evolve")
    assert found[0].level == "WARN" and "evolve init" in found[0].fix


def test_http_runner_checks(env: Env, cli) -> None:
    env.write_config(agent={"runner": "http", "base_url": "", "api_key_env": "MY_KEY"})
    code, found = findings(cli)
    assert code == 1
    assert level(found, "agent") == "FAIL" and "base_url" in found["agent"][0]["message"]
    assert level(found, "agent auth") == "WARN" and "MY_KEY" in found["agent auth"][0]["message"]


def test_notify_and_metrics_settings_are_checked(env: Env, cli) -> None:
    env.write_config(notify={"command": ["/no/such/notifier"]}, metrics={"textfile_dir": "/proc/no-such-dir"})
    code, found = findings(cli)
    assert code == 1
    assert level(found, "notify") == "FAIL" and level(found, "metrics") == "FAIL"


# -- the PATH a scheduled fire gets (issue 22, item 1) ------------------------------------------------


def toolchain(root: Path) -> Path:
    """A python that is not evolve's: a venv (its python3 a link to the system one, told apart by its bin)."""
    import subprocess

    venv = root / "toolchain"
    subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", "--without-pip", str(venv)],
                   check=True, capture_output=True)
    return venv


def sched(found: dict[str, list[dict[str, str]]]) -> list[dict[str, str]]:
    return found["sched PATH"]


def test_doctor_compares_the_installed_units_path_with_the_shells(env: Env, cli, tmp_path: Path) -> None:
    """Installed from a shell without the operator's venv, doctored from one with it: the gate's python3
    resolves to two programs, both named, with the unit file the scheduled PATH comes from."""
    venv = toolchain(tmp_path)
    env.write_config(gate={"commands": [["python3", "-m", "pytest", "-q"]]})
    plain = "/usr/local/bin:/usr/bin:/bin"
    r = cli("install", "systemd", "--user", extra_env={"PATH": plain})  # into $XDG_CONFIG_HOME/systemd/user
    assert r.code == 0, r.stderr
    unit = env.xdg / "systemd" / "user" / "evolve@repo.service"
    system_python = doctor._program("python3", plain)
    code, found = findings(cli, PATH=f"{venv}/bin:{plain}")
    (f,) = sched(found)
    assert f["level"] == "WARN" and code == 0  # a warning: the operator decides which python is right
    assert f"gate program 'python3': a scheduled fire runs {system_python}, this shell {venv}/bin/python3" in f[
        "message"]
    assert f"PATH from {unit}: {plain}" in f["message"] and "--path" in f["fix"]

    # Rendered again from the venv's shell: the same python under both.
    r = cli("install", "systemd", "--user", extra_env={"PATH": f"{venv}/bin:{plain}"})
    assert r.code == 0, r.stderr
    code, found = findings(cli, PATH=f"{venv}/bin:{plain}")
    (f,) = sched(found)
    assert f["level"] == "OK" and f"'python3' ({venv}/bin/python3)" in f["message"] and str(unit) in f["message"]


def test_doctor_reads_the_crontab_lines_path(env: Env, cli, tmp_path: Path) -> None:
    venv = toolchain(tmp_path)
    env.write_config(gate={"commands": [["python3", "-c", "pass"]]})
    r = cli("install", "cron", "--user", "--print", "--path", "/usr/bin:/bin")
    (line,) = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")]
    bindir = tmp_path / "bin"
    listing = tmp_path / "crontab.txt"
    listing.write_text(f"MAILTO=me\n{line}\n")
    fake_bin(bindir, "crontab", f"cat {listing}")
    _, found = findings(cli, PATH=f"{venv}/bin:{bindir}:/usr/bin:/bin")
    (f,) = sched(found)
    assert f["level"] == "WARN" and "PATH from your crontab: /usr/bin:/bin" in f["message"]
    assert f"this shell {venv}/bin/python3" in f["message"]
    # A hand-written line without PATH runs on the crontab's PATH= setting, else cron's default.
    listing.write_text(f"PATH={venv}/bin:/usr/bin:/bin\n*/30 * * * * cd {env.repo} && evolve fire\n")
    _, found = findings(cli, PATH=f"{venv}/bin:{bindir}:/usr/bin:/bin")
    assert [f["level"] for f in sched(found)] == ["OK"]


def test_doctor_without_an_installed_trigger_compares_what_install_would_render(env: Env, cli,
                                                                               tmp_path: Path) -> None:
    """Nothing installed: the PATH install would render from this shell. With evolve's own venv activated
    first, a hand-run gate's python3 is evolve's, a scheduled one's the operator's next one: said."""
    venv = toolchain(tmp_path)
    env.write_config(gate={"commands": [["python3", "-c", "pass"], ["no-such-gate-tool", "x"]]})
    own = Path(sys.prefix) / "bin"  # the venv doctor (evolve) runs from
    _, found = findings(cli, PATH=f"{own}:{venv}/bin:/usr/bin:/bin")
    by_name = {f["message"].split("'")[1]: f for f in sched(found)}
    python = by_name["python3"]
    assert python["level"] == "WARN" and "what `evolve install systemd|cron` would render" in python["message"]
    assert f"a scheduled fire runs {venv}/bin/python3, this shell {doctor._program('python3', str(own))}" in \
        python["message"]
    missing = by_name["no-such-gate-tool"]
    assert missing["level"] == "WARN" and "on neither" in missing["message"] and "[gate] commands" in missing["fix"]
    # The same shell without evolve's venv: nothing to say about python3.
    _, found = findings(cli, PATH=f"{venv}/bin:/usr/bin:/bin")
    assert [f["message"].split("'")[1] for f in sched(found)] == ["no-such-gate-tool"]


def test_scheduled_path_check_reads_only_this_repositorys_units(env: Env, tmp_path: Path) -> None:
    """Another repository's unit, and a unit without a PATH, are not this one's schedule."""
    from evolve.config import load
    from evolve.paths import Paths

    units = tmp_path / "units"
    units.mkdir()
    (units / "evolve@other.service").write_text("[Service]\nWorkingDirectory=/srv/other\n"
                                                "Environment=PATH=/nowhere\n")
    (units / "evolve@bare.service").write_text(f"[Service]\nWorkingDirectory={env.repo}\n")
    (units / "evolve@repo.service").write_text(f'[Service]\nWorkingDirectory={env.repo}\n'
                                               'Environment="PATH=/opt/50%% off/bin:/usr/bin:/bin"\n')
    paths = Paths.for_repo(env.repo, env=env.env())
    got = doctor._scheduled_paths(paths, env.env(PATH="/usr/bin:/bin"), unit_dirs=(units,), cron_d=tmp_path)
    assert got == [(str(units / "evolve@repo.service"), "/opt/50% off/bin:/usr/bin:/bin")]
    # A drop-in (`systemctl edit evolve@repo.service`) sets PATH last: that is what the fire gets.
    (units / "evolve@repo.service.d").mkdir()
    (units / "evolve@repo.service.d" / "override.conf").write_text("[Service]\nEnvironment=\n"
                                                                   "Environment=PATH=/srv/tc/bin:/usr/bin\n")
    got = doctor._scheduled_paths(paths, env.env(PATH="/usr/bin:/bin"), unit_dirs=(units,), cron_d=tmp_path)
    assert got == [(str(units / "evolve@repo.service"), "/srv/tc/bin:/usr/bin")]
    env.write_config(gate={"commands": [["sh", "-c", "true"]]})
    (f,) = doctor.check_scheduled_path(load(paths.config, env.env()), paths, env.env(PATH="/usr/bin:/bin"),
                                       unit_dirs=(units,), cron_d=tmp_path)
    assert f.level == "OK" and "'sh'" in f.message
