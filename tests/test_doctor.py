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
