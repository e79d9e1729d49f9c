"""Issue 13 item 1: nothing interpolated into a rendered deploy file can start a line (or an entry) of its own.

Every value is refused when it holds a control character (exit 2, one line naming the field), and
everything legal but special is quoted for its format. The proofs: a real directory whose name holds
a crontab line; property tests over arbitrary text that parse each rendering back the way cron
(``%`` and ``/bin/sh``), systemd and YAML read it; real ``systemd-analyze verify`` (and its dump of the
parsed unit) and a real ``/bin/sh`` run of the crontab command on hostile-but-legal values; the fleet
file read as an editor shows it.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from support import Env
from test_install import run_like_cron, systemd_tool, verify

from evolve import deploy
from evolve.commands.daemon import read_fleet
from evolve.errors import UsageError

HOSTILE_NAME = "repo\n* * * * * root touch /tmp/pwned"
# One of each kind the renderers must refuse: C0 (newline, CR, tab, NUL, ESC), DEL, C1 (NEL, CSI),
# the Unicode line and paragraph separators, and a lone surrogate (a path of undecodable bytes).
CONTROLS = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\x9b", "\u2028", "\u2029", "\udcff"]
# Legal but special somewhere: quotes, backslashes (a final one joins lines in a unit file), %
# (a specifier in systemd, a newline in cron), $ (a variable on Exec lines), ;, #, spaces, brackets.
HOSTILE_LEGAL = [
    "plain",
    "two  spaces and a trailing space ",
    "it's \"quoted\" \\ back\\slash ; echo pwned > pwned #",
    "50% off \\%d %% %n %i $HOME $$ ${PATH}",
    "[Service] ExecStart=/bin/touch pwned",
    "`touch pwned` $(touch pwned2)",
    "ends with a backslash\\",
    "Ünïcødé ✓ \u00a0nbsp \U0001f600",
    "ends with a no-break space\u00a0",
]


def hostile_repo(tmp_path: Path, name: str = HOSTILE_NAME) -> Path:
    # The slashes make it nested directories; the full path still holds the crontab line.
    repo = tmp_path / "hostile" / name
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


def one_error_line(r) -> str:
    assert r.code == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    return line


# -- the CLI: exit 2 and one line naming the field ---------------------------------------------------


@pytest.mark.parametrize("kind", [("cron",), ("cron", "--user"), ("systemd",), ("systemd", "--daemon"),
                                  ("systemd", "--user"), ("kubernetes",)])
def test_a_newline_in_the_repository_path_is_refused(env: Env, cli, tmp_path: Path, kind: tuple[str, ...]) -> None:
    repo = hostile_repo(tmp_path)
    line = one_error_line(cli("install", *kind, "--print", repo=repo))
    assert line.startswith("evolve: repository path contains a control character (U+000A)")
    assert "repo\\n* * * * * root touch" in line  # the value, escaped, around the offending character


@pytest.mark.parametrize("char", ["\u2028", "\x85", "\r", "\x1b"])
def test_other_line_breakers_in_the_path_are_refused(env: Env, cli, tmp_path: Path, char: str) -> None:
    repo = hostile_repo(tmp_path, f"repo{char}x")
    line = one_error_line(cli("install", "cron", "--print", repo=repo))
    assert f"repository path contains a control character (U+{ord(char):04X})" in line


def test_every_other_interpolated_value_is_checked_by_the_cli(env: Env, cli) -> None:
    line = one_error_line(cli("install", "cron", "--print", "--schedule", "*/5 * * * *\n* * * * * root id"))
    assert line.startswith("evolve: --schedule contains a control character (U+000A)")
    line = one_error_line(cli("install", "kubernetes", "--print", "--image", "evolve:1\nkind: Pod"))
    assert line.startswith("evolve: --image contains a control character (U+000A)")
    # --path: every kind, refused like any value; and every entry absolute (a relative one would be read
    # against the repository or the agent's worktree).
    for kind in ("cron", "systemd", "kubernetes"):
        line = one_error_line(cli("install", kind, "--print", "--image", "i:1", "--path", "/usr/bin\n* * * * * id"))
        assert line.startswith("evolve: --path contains a control character (U+000A)")
        line = one_error_line(cli("install", kind, "--print", "--image", "i:1", "--path", "/usr/bin:.venv/bin"))
        assert line == "evolve: --path '/usr/bin:.venv/bin': entry '.venv/bin' is not an absolute directory"
    # The shell's PATH is rendered now: a control character in it is refused the same way.
    line = one_error_line(cli("install", "cron", "--print", extra_env={"PATH": "/usr/bin:/b\x1bin:/bin"}))
    assert line.startswith("evolve: PATH contains a control character (U+001B)")
    # A value from the config file: schedule.timezone goes into the crontab's comment block.
    env.write_config(schedule={"timezone": "UTC\n* * * * * root touch /tmp/pwned"})
    line = one_error_line(cli("install", "cron", "--print"))
    assert "schedule.timezone contains a control character (U+000A)" in line
    env.write_config(schedule={"timezone": "Mars/Olympus_Mons"})
    r = cli("install", "cron", "--print")
    assert r.code == 78 and "schedule.timezone 'Mars/Olympus_Mons': unknown time zone" in r.stderr
    env.write_config(schedule={"timezone": "UTC"})
    # The origin URL may carry a token: named, never shown.
    subprocess.run(["git", "remote", "add", "origin", "https://user:s3cret@example.com/r.git\n- x"], cwd=env.repo,
                   check=True)
    line = one_error_line(cli("install", "kubernetes", "--print"))
    assert "git remote origin URL contains a control character" in line and "s3cret" not in line


def test_a_hostile_user_name_is_refused(env: Env, cli) -> None:
    # getpass reads LOGNAME first: a name with a space would shift a cron.d line's fields.
    line = one_error_line(cli("install", "cron", "--print", extra_env={"LOGNAME": "root touch /tmp/pwned"}))
    assert line.startswith("evolve: user 'root touch /tmp/pwned': use letters")


# -- Target: every field, every kind of control character --------------------------------------------


def target(**over) -> deploy.Target:
    base = dict(name="r", repo="/srv/repo", state_dir="/srv/repo/.agents/evolve", evolve=("/usr/bin/evolve",),
                path="/usr/bin:/bin", home="/home/u", cron="*/30 * * * *", user="u", image="evolve:1",
                git_url="https://example.com/r.git")
    base.update(over)
    return deploy.Target(**base)


FIELDS = {
    "name": lambda c: {"name": f"r{c}"},
    "repository path": lambda c: {"repo": f"/srv/re{c}po"},
    "state directory": lambda c: {"state_dir": f"/srv/st{c}ate"},
    "PATH": lambda c: {"path": f"/usr/bin:/b{c}in"},
    "home directory": lambda c: {"home": f"/home/u{c}"},
    "schedule": lambda c: {"cron": f"*/30 * * * *{c}"},
    "schedule.timezone": lambda c: {"timezone": f"UTC{c}"},
    "user": lambda c: {"user": f"u{c}"},
    "--image": lambda c: {"image": f"evolve:1{c}"},
    "evolve command word 1": lambda c: {"evolve": ("/usr/bin/python3", f"-m{c}")},
    "environment 'EVOLVE_SCHEDULE_CRON'": lambda c: {"extra_env": {"EVOLVE_SCHEDULE_CRON": f"* * * * *{c}"}},
    "git remote origin URL": lambda c: {"git_url": f"https://example.com/r.git{c}"},
    "writable directory": lambda c: {"rw_paths": ("/srv/metrics", f"/srv/me{c}trics")},
    "environment 'EVOLVE_DIR'": lambda c: {"extra_env": {"EVOLVE_DIR": f"/srv/st{c}ate"}},
}


@pytest.mark.parametrize("label", sorted(FIELDS))
@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_target_refuses_a_control_character_in_every_field(label: str, char: str) -> None:
    with pytest.raises(UsageError) as err:
        target(**FIELDS[label](char))
    message = str(err.value)
    assert message.startswith(label + " ") and "\n" not in message
    assert ("not valid UTF-8" if char == "\udcff" else f"(U+{ord(char):04X})") in message


# -- models of how each format reads a rendering back --------------------------------------------------


def cron_percent(command: str) -> tuple[str, str]:
    """Vixie cron's and cronie's reading of the command field: ``\\%`` is ``%``, a bare ``%`` ends the
    command (the rest is stdin), and a ``\\`` before any other character stays (it escapes only ``%``)."""
    out: list[str] = []
    escaped = False
    for i, ch in enumerate(command):
        if escaped:
            if ch == "%":
                out[-1] = "%"
            else:
                out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
            out.append(ch)
        elif ch == "%":
            return "".join(out), command[i + 1:]
        else:
            out.append(ch)
    return "".join(out), ""


def cron_jobs(text: str) -> list[str]:
    """The lines cron runs: not blank, not a comment, not a ``NAME=value`` setting."""
    return [ln for ln in text.split("\n") if ln.strip(" \t") and not ln.lstrip(" \t").startswith("#")
            and not re.match(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=", ln)]


def check_crontab(t: deploy.Target, text: str, system: bool) -> None:
    assert not deploy.CONTROL.search(text.replace("\n", ""))
    (job,) = cron_jobs(text)
    fields = job.split(None, 6 if system else 5)
    command = fields[-1]
    if system:
        assert fields[5] == t.user
    shell, stdin = cron_percent(command)
    assert stdin == "", "an unescaped % ends the command"
    assert deploy.cron_fire_path(job) == t.path  # what `evolve doctor` reads back from an installed line
    state = t.state_dir
    assigns = [f"{k}={v}" for k, v in {"PATH": t.path, **t.extra_env}.items()]
    assert shlex.split(shell, comments=True) == [
        "cd", t.repo, "&&", "mkdir", "-p", state, "&&", *assigns, "flock", "-n", "-E", "75",
        f"{state}/cron.lock", *t.evolve, "fire", ">>", f"{state}/cron.log", "2>&1"]


def sd_specifiers(value: str) -> str:
    """systemd's specifier pass: ``%%`` is ``%``; no other specifier may survive our escaping."""
    assert re.fullmatch(r"(?:[^%]|%%)*", value), value
    return value.replace("%%", "%")


def sd_words(value: str) -> list[str]:
    """systemd's ``extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE)`` for the escapes we write."""
    words, i = [], 0
    while i < len(value):
        if value[i] in " \t":
            i += 1
            continue
        word, quote = [], None
        while i < len(value) and (quote or value[i] not in " \t"):
            ch = value[i]
            if ch == "\\":
                assert value[i + 1] in "\\\"'", f"an escape we never write: {value[i:i + 2]!r}"
                word.append(value[i + 1])
                i += 2
                continue
            if quote and ch == quote:
                quote = None
            elif not quote and ch in "\"'":
                quote = ch
            else:
                word.append(ch)
            i += 1
        assert quote is None, f"unbalanced quotes: {value!r}"
        words.append("".join(word))
    return words


def unit_settings(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) as systemd's line parser sees them; no line may continue onto the next."""
    out, section = [], ""
    for line in text.split("\n"):
        assert not line.endswith("\\"), f"a continuation line: {line!r}"
        line = line.strip(" \t")  # ASCII whitespace only: a final no-break space is part of the value
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(" \t"), value.strip(" \t")))
    return out


def check_units(t: deploy.Target, files: dict[str, str], baseline: dict[str, str]) -> None:
    """The same settings, in the same sections, as a rendering with tame values; each value read back."""
    for name, text in files.items():
        if name.endswith(".service"):  # what `evolve doctor` reads back from an installed unit
            workdir, path = deploy.unit_fire_path(text)
            assert path == t.path and workdir is not None and os.path.normpath(workdir) == os.path.normpath(t.repo)
        got = unit_settings(text)
        assert [(s, k) for s, k, _ in got] == [(s, k) for s, k, _ in unit_settings(baseline[name])]
        for _, key, value in got:
            if key == "ExecStart":
                argv0, *args = sd_words(sd_specifiers(value))
                verb = "daemon" if "daemon@" in name else "fire"
                assert [argv0, *(a.replace("$$", "$") for a in args)] == [*t.evolve, "--repo", t.repo, verb]
            elif key == "Environment":
                (assignment,) = sd_words(value)
                assert sd_specifiers(assignment) in {f"PATH={t.path}", *(f"{k}={v}" for k, v in t.extra_env.items())}
            elif key == "ReadWritePaths":
                # Each path reads back as itself (which ones: test_install's table for deploy.writable).
                assert [sd_specifiers(w) for w in sd_words(value)] == deploy.writable(t)
            elif key == "WorkingDirectory":
                # A final "/" keeps a final backslash or space from being read as a continuation or stripped.
                directory = sd_specifiers(value)
                assert directory == t.repo or (directory == t.repo + "/" and t.repo.endswith(("\\", " ")))
            elif key == "Description":
                assert t.repo in sd_specifiers(value)
            elif key == "User":
                assert value == t.user


def check_manifest(t: deploy.Target, text: str) -> None:
    configmap, pvc, cron = yaml.safe_load_all(text)
    assert (configmap["kind"], pvc["kind"], cron["kind"]) == ("ConfigMap", "PersistentVolumeClaim", "CronJob")
    assert configmap["data"]["config.toml"] == (t.config_toml or deploy.GENERIC_CONFIG)
    assert cron["spec"]["timeZone"] == (t.timezone or "UTC")
    assert cron["spec"]["schedule"] == deploy.cronexpr.crontab_schedule(deploy.cronexpr.parse(t.cron))
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["initContainers"] + pod["containers"]] == [t.image, t.image]
    url = t.git_url or "https://git.example.com/you/repo.git"
    assert pod["initContainers"][0]["env"][0] == {"name": "EVOLVE_GIT_URL", "value": url}
    assert {"name": "PATH", "value": t.path} in pod["containers"][0]["env"]
    assert cron["metadata"]["name"] == f"evolve-{deploy.k8s_name(t.name)}"


# -- property tests: arbitrary text is refused or reads back as itself ----------------------------------

# Half arbitrary text (mostly refused), half text that is legal but dense in what each format reads specially.
SPECIAL = st.sampled_from([*"%$\"'\\ ;#=*`{}[]-+@:,.~!&|<>()?/", "\u00a0", "\ufeff", "\U0001f600"])
LEGAL = st.text(st.one_of(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), SPECIAL))
TEXT = st.one_of(LEGAL, st.text())
CRON = st.sampled_from(["*/30 * * * *", "0 9 * * mon-fri", "@hourly", "5 4 1 * *"])
SCHEDULES = st.one_of(CRON, CRON, CRON, st.text())


def mostly(value: str) -> st.SearchStrategy[str]:
    """``value`` three times in four, else arbitrary text: fields with a narrow alphabet (a user, a name)."""
    return st.one_of(st.just(value), st.just(value), st.just(value), st.text())
PROPERTY = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)


def build(**values) -> deploy.Target | None:
    """The Target, or None when it refuses a value (what `evolve install` reports as exit 2)."""
    try:
        t = target(**values)
        deploy.cronexpr.parse(t.cron)  # evolve install reports a bad schedule as a usage error too
    except (UsageError, ValueError):
        event("refused")
        return None
    event("rendered")
    return t


@PROPERTY
@given(repo=TEXT, path=TEXT, user=mostly("u"), name=mostly("r"), cron=SCHEDULES, evolve=TEXT, state=TEXT)
def test_crontab_is_one_job_line_whatever_the_values(repo: str, path: str, user: str, name: str, cron: str,
                                                     evolve: str, state: str) -> None:
    t = build(repo="/" + repo, state_dir=f"/{repo}/.agents/evolve", path=path, user=user, name=name, cron=cron,
              evolve=("/" + evolve, "--x"), extra_env={"EVOLVE_DIR": "/" + state, "EVOLVE_NEXTWORK": path})
    if t is None:
        return
    for system in (False, True):
        (text,) = deploy.crontab(t, system=system).values()
        check_crontab(t, text, system)


BASELINE = target(home="/home/u", extra_env={"EVOLVE_SCHEDULE_CRON": "* * * * *", "EVOLVE_DIR": "/srv/state"})


@PROPERTY
@given(repo=TEXT, state=TEXT, home=TEXT, path=TEXT, evolve=TEXT, env_value=TEXT, user=mostly("u"),
       timezone=mostly("UTC"), written=st.lists(TEXT, max_size=3))
def test_systemd_units_read_back_whatever_the_values(repo: str, state: str, home: str, path: str, evolve: str,
                                                      env_value: str, user: str, timezone: str,
                                                      written: list[str]) -> None:
    t = build(repo="/" + repo, state_dir="/" + state, home="/" + home, path=path, evolve=("/" + evolve, "-x"),
              user=user, timezone=timezone, extra_env={"EVOLVE_SCHEDULE_CRON": env_value, "EVOLVE_DIR": "/" + state},
              rw_paths=tuple("/" + w for w in written))
    if t is None:
        return
    for daemon in (False, True):
        try:
            files = deploy.systemd_units(t, daemon=daemon)
        except UsageError:
            assert any(c in "\"'\\" for c in t.evolve[0])  # systemd refuses such an executable path
            return
        except Exception as exc:  # an unknown time zone name: the timer's calendar cannot be computed
            assert not daemon and type(exc).__name__ == "ZoneInfoNotFoundError"
            return
        check_units(t, files, deploy.systemd_units(BASELINE, daemon=daemon))


@PROPERTY
@given(name=mostly("r"), image=TEXT, git_url=TEXT, cron=SCHEDULES, timezone=mostly("UTC"), config=TEXT, path=TEXT)
def test_kubernetes_manifest_round_trips_whatever_the_values(name: str, image: str, git_url: str, cron: str,
                                                             timezone: str, config: str, path: str) -> None:
    t = build(name=name, image=image, git_url=git_url, cron=cron, timezone=timezone, config_toml=config, path=path)
    if t is None:
        return
    if not t.image:  # no image, no manifest: `evolve install` says how to build and push one
        with pytest.raises(UsageError, match="kubernetes needs --image"):
            deploy.kubernetes(t)
        return
    try:
        (text,) = deploy.kubernetes(t).values()
    except Exception as exc:
        # An unknown or malformed zone ("/" is a ValueError to zoneinfo): `evolve install` refuses both
        # before rendering (commands/install.py), so only a zone error may come from the renderer.
        assert type(exc).__name__ == "ZoneInfoNotFoundError" or str(exc).startswith("ZoneInfo keys"), exc
        return
    check_manifest(t, text)


@PROPERTY
@given(st.text())
@example("\ufeff BOM, \ufffe and \uffff (YAML refuses them raw), \U0001f600, \"q\" \\ \x0b")
def test_yaml_str_round_trips_any_text(value: str) -> None:
    # Even control characters (Target refuses them first) come back as themselves; lone surrogates cannot.
    if re.search("[\ud800-\udfff]", value) is None:
        assert yaml.safe_load(f"key: {deploy.yaml_str(value)}\n") == {"key": value}


# -- the real parsers on hostile-but-legal values -------------------------------------------------------


def make_evolve(bin_dir: Path, record: Path) -> Path:
    """A stand-in for evolve at a hostile path: it records its cwd, argv, PATH and EVOLVE_DIR as JSON."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "evolve"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\nrecord = {str(record)!r}\n"
                      "open(record, 'w').write(json.dumps([os.getcwd(), sys.argv[1:], os.environ['PATH'],"
                      " os.environ.get('EVOLVE_DIR')]))\n")
    script.chmod(0o755)
    return script


def systemd_dump(units: Path, unit: str, *, user: bool) -> dict[str, list[str]]:
    """What systemd itself parsed: ``systemd-analyze verify`` dumps the loaded unit at debug level."""
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "debug"}
    args = [systemd_tool()]
    if user:
        env["XDG_RUNTIME_DIR"] = str(units / "runtime")
        args.append("--user")
    out = subprocess.run([*args, "verify", str(units / unit)], capture_output=True, text=True, env=env, timeout=120)
    block = out.stdout.split(f"-> Unit {unit}:", 1)[1].split("-> Unit ", 1)[0]
    settings_: dict[str, list[str]] = {}
    for line in block.splitlines():
        key, sep, value = line.lstrip().partition(": ")  # a path may end in a space
        if sep:
            settings_.setdefault(key, []).append(value)
    return settings_


def dumped_command(line: str) -> list[str]:
    """systemd's ``Command Line:`` dump: words in ``"..."`` with ``\\`` before ``"``, ``\\``, `` ` `` and ``$``."""
    return [re.sub(r"\\(.)", r"\1", w[1:-1]) if w.startswith('"') else w
            for w in re.findall(r'"(?:[^"\\]|\\.)*"|\S+', line)]


@pytest.mark.parametrize("hostile", [h for h in HOSTILE_LEGAL if h != "plain"])
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_systemd_parses_hostile_values_back(tmp_path: Path, hostile: str, user: bool) -> None:
    repo = tmp_path / "repos" / hostile  # its last component: a final backslash or space included
    repo.mkdir(parents=True)
    # The executable path may not hold quotes or backslashes (systemd refuses it); the rest of it may.
    evolve = make_evolve(tmp_path / re.sub(r"[\"'\\]", "_", hostile) / "bin", tmp_path / "record.json")
    t = target(name="hx", repo=str(repo), state_dir=str(tmp_path / f"state {hostile}"), evolve=(str(evolve),),
               path=f"{evolve.parent}:/usr/bin:/bin", home=str(tmp_path / f"home {hostile}"),
               user=None if user else getpass.getuser(), user_mode=user,
               extra_env={"EVOLVE_SCHEDULE_CRON": f"*/5 * * * * {hostile}",
                          "EVOLVE_DIR": str(tmp_path / f"state {hostile}")},
               rw_paths=(str(tmp_path / f"metrics {hostile}"),))
    Path(t.state_dir).mkdir(parents=True)
    units = tmp_path / "units"
    (units / "runtime").mkdir(parents=True, mode=0o700)
    files = {**deploy.systemd_units(t), **deploy.systemd_units(t, daemon=True)}
    for name, text in files.items():
        (units / name).write_text(text, encoding="utf-8")
    for name in files:
        verify(units, name, user=user)  # exit 0, no complaint (an unparsed ExecStart path would be one)
    for name, verb in (("evolve@hx.service", "fire"), ("evolve-daemon@hx.service", "daemon")):
        parsed = systemd_dump(units, name, user=user)
        (command,) = parsed["Command Line"]
        argv0, *args = dumped_command(command)
        assert [argv0, *(a.replace("$$", "$") for a in args)] == [str(evolve), "--repo", str(repo), verb]
        assert parsed["WorkingDirectory"] == [str(repo)]
        assert f"PATH={t.path}" in parsed["Environment"]
        assert f"EVOLVE_DIR={t.state_dir}" in parsed["Environment"]
        # Under /tmp, so PrivateTmp is off and the real /tmp stays writable.
        assert parsed["ReadWritePaths"] == [" ".join([str(repo), t.state_dir, f"-{t.rw_paths[0]}", "-/tmp",
                                                      "-/var/tmp", f"-{t.home}/.claude", f"-{t.home}/.claude.json",
                                                      f"-{t.home}/.local/state/evolve"])]
    assert f"EVOLVE_SCHEDULE_CRON=*/5 * * * * {hostile}" in systemd_dump(units, "evolve-daemon@hx.service",
                                                                         user=user)["Environment"]


@pytest.mark.parametrize("hostile", HOSTILE_LEGAL)
def test_crontab_command_runs_in_sh_with_hostile_values(tmp_path: Path, hostile: str) -> None:
    """The command as cron hands it to ``/bin/sh`` (after its ``%`` pass), run: cwd, argv, PATH, files."""
    repo = tmp_path / "repos" / hostile
    repo.mkdir(parents=True)
    record = tmp_path / "record.json"
    evolve = make_evolve(tmp_path / f"bin {hostile}", record)
    state = tmp_path / f"state {hostile}"
    t = target(repo=str(repo), state_dir=str(state), evolve=(str(evolve),),
               path=f"{evolve.parent}:/usr/bin:/bin", user=getpass.getuser(), extra_env={"EVOLVE_DIR": str(state)})
    (text,) = deploy.crontab(t, system=True).values()
    check_crontab(t, text, system=True)
    (job,) = cron_jobs(text)
    command, _ = cron_percent(job.split(None, 6)[6])
    home = tmp_path / "home"
    home.mkdir()
    done = run_like_cron(command, home)
    assert done.returncode == 0, (command, done.stderr)
    assert json.loads(record.read_text()) == [str(repo), ["fire"], t.path, str(state)]
    assert (state / "cron.log").is_file() and (state / "cron.lock").is_file()
    assert not list(home.iterdir()) and not list(repo.iterdir()), "something ran that was not evolve"
    assert sorted(p.name for p in state.iterdir()) == ["cron.lock", "cron.log"]
    assert not [p for p in tmp_path.rglob("pwned*") if p.is_file()]


# -- the fleet file: what an editor shows is what the daemon reads --------------------------------------


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\r", "\x00", "\x1b"],
                         ids=lambda c: f"U+{ord(c):04X}")
def test_fleet_line_with_a_control_character_is_refused(tmp_path: Path, char: str) -> None:
    fleet = tmp_path / "fleet.txt"
    fleet.write_bytes(f"# fleet\n/srv/a\n/srv/b{char}/srv/evil\n".encode("utf-8", "surrogatepass"))
    with pytest.raises(UsageError) as err:
        read_fleet(fleet)
    assert f"line 3: control character U+{ord(char):04X}" in str(err.value) and "\n" not in str(err.value)


def test_fleet_file_keeps_crlf_tabs_around_entries_and_comments(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.txt"
    fleet.write_bytes(b"# fleet\r\n\t/srv/a\t# first\r\nrel\r\n\r\n")
    assert read_fleet(fleet) == [Path("/srv/a"), tmp_path / "rel"]
    fleet.write_bytes(b"/srv/a\tb\n")
    with pytest.raises(UsageError, match="line 1: control character U\\+0009"):
        read_fleet(fleet)
    fleet.write_bytes(b"/srv/\xff\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_fleet(fleet)


def test_daemon_refuses_a_smuggling_fleet_file(env: Env, cli) -> None:
    fleet = env.root / "fleet.txt"
    fleet.write_text(f"{env.repo}\u2028{env.root}\n", encoding="utf-8")
    line = one_error_line(cli("daemon", "--fleet", str(fleet)))
    assert "--fleet" in line and "line 1: control character U+2028" in line


@PROPERTY
@given(st.lists(st.text(), max_size=6))
def test_fleet_entries_are_the_lines_an_editor_shows(lines: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        fleet = Path(tmp) / "fleet.txt"
        fleet.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
        try:
            got = read_fleet(fleet)
        except UsageError:
            return
        text = "\n".join(lines)
        entries = [e for e in (ln.removesuffix("\r").split("#", 1)[0].strip(" \t") for ln in text.split("\n")) if e]
        assert got == [Path(tmp) / os.path.expanduser(e) for e in entries]  # an absolute entry replaces tmp
        assert not any(deploy.CONTROL.search(str(p)) for p in got)


def test_the_enable_hint_quotes_its_paths(env: Env, cli, tmp_path: Path) -> None:
    """The hint is a command to paste into a shell: a --dest with spaces and `;` stays one word."""
    dest = tmp_path / "d; touch pwned"
    r = cli("install", "cron", "--user", "--dest", str(dest))
    assert r.code == 0, r.stderr
    (hint,) = [ln for ln in r.stdout.splitlines() if ln.startswith("enable: ")]
    assert shlex.quote(str(dest / "evolve-repo.crontab")) in hint
    words = shlex.split(hint.removeprefix("enable: "))
    assert sum(str(dest / "evolve-repo.crontab") in w for w in words) == 2 and "touch" not in words
