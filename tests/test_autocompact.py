"""`evolve setup` (the settings writer) and the autocompact detector (docs/DESIGN.md §7; reference notes §5.6–5.7).

Every writer case runs the real `evolve setup` process against real files in a throwaway repo, and
checks bytes, mtimes and modes on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from support import Env

from evolve.errors import UsageError
from evolve.harness import autocompact as ac

KEY = ac.KEY


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing from the developer's own shell may decide a detection."""
    for name in (KEY, "CLAUDE_CONFIG_DIR", "CLAUDE_PROJECT_DIR", "EVOLVE_AUTOCOMPACT_NUDGE"):
        monkeypatch.delenv(name, raising=False)


def home(env: Env) -> Path:
    h = env.root / "home"
    h.mkdir(exist_ok=True)
    return h


def setup_cli(env: Env, cli, *args: str, **extra: str):
    return cli("setup", *args, extra_env={"HOME": str(home(env)), **extra})


def settings(env: Env) -> Path:
    return env.repo / ".claude" / "settings.json"


def write_settings(env: Env, text: str | bytes, name: str = "settings.json") -> Path:
    p = env.repo / ".claude" / name
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def snapshot(p: Path) -> tuple[bytes, int, int]:
    st = p.stat()
    return p.read_bytes(), st.st_mtime_ns, st.st_mode


def backdate(p: Path) -> None:
    """Move the mtime an hour back, so a rewrite would show even on a coarse clock."""
    old = time.time() - 3600
    os.utime(p, (old, old))


# -- the writer (§5.6) -------------------------------------------------------------------------


def test_missing_file_creates_settings_with_only_the_key(env: Env, cli) -> None:
    r = setup_cli(env, cli, "--yes")
    assert r.code == 0, r.stderr
    assert json.loads(settings(env).read_text()) == {"env": {KEY: "40"}}
    assert settings(env).read_bytes().endswith(b"}\n")
    assert settings(env).stat().st_mode & 0o777 == 0o644
    assert f'set {KEY}="40"' in r.stdout


def test_other_keys_are_kept_and_only_one_changes(env: Env, cli) -> None:
    before = {"model": "opus", "env": {"FOO": "1", "BAR": "x"}, "permissions": {"allow": ["Bash(ls)"]},
              "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "x"}]}]}}
    write_settings(env, json.dumps(before))
    assert setup_cli(env, cli, "--yes").code == 0
    after = json.loads(settings(env).read_text())
    assert after == {**before, "env": {"FOO": "1", "BAR": "x", KEY: "40"}}
    assert list(after) == list(before) and list(after["env"]) == ["FOO", "BAR", KEY]


def test_a_valid_existing_value_is_kept_without_a_write(env: Env, cli) -> None:
    p = write_settings(env, '{"env":{"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE":"60"},"x":1}')  # compact: a rewrite would show
    backdate(p)
    before = snapshot(p)
    r = setup_cli(env, cli, "--yes")
    assert r.code == 0, r.stderr
    assert snapshot(p) == before
    assert f'kept existing {KEY}="60"' in r.stdout and "unchanged" in r.stdout


def test_a_flag_replaces_a_valid_value_with_one_write(env: Env, cli) -> None:
    p = write_settings(env, json.dumps({"env": {KEY: "60"}}))
    backdate(p)
    r = setup_cli(env, cli, "--autocompact-pct", "30")
    assert r.code == 0, r.stderr
    assert json.loads(p.read_text()) == {"env": {KEY: "30"}}
    assert p.stat().st_mtime > time.time() - 60
    assert 'from "60" to "30"' in r.stdout
    assert sorted(x.name for x in p.parent.iterdir()) == ["settings.json"]  # no temp file left


@pytest.mark.parametrize("bad", ["0", "101", "040", " 40", "40 ", "4.5", "-5", "+5", "", "abc", 40, 40.0, None, ["40"]])
def test_each_invalid_existing_value_is_replaced(env: Env, cli, bad: object) -> None:
    write_settings(env, json.dumps({"env": {KEY: bad, "OTHER": "keep"}}))
    r = setup_cli(env, cli, "--yes")
    assert r.code == 0, r.stderr
    assert json.loads(settings(env).read_text()) == {"env": {KEY: "40", "OTHER": "keep"}}
    assert "replaced invalid value" in r.stdout


def test_an_invalid_value_is_replaced_by_the_flag(env: Env, cli) -> None:
    write_settings(env, json.dumps({"env": {KEY: 50}}))
    r = setup_cli(env, cli, "--autocompact-pct", "25")
    assert json.loads(settings(env).read_text())["env"][KEY] == "25" and "replaced invalid value 50" in r.stdout


@pytest.mark.parametrize("flag", ["0", "101", "040", "4.5", "-1", " 40", "1e2", "abc", ""])
def test_an_invalid_flag_exits_2_and_writes_nothing(env: Env, cli, flag: str) -> None:
    p = write_settings(env, '{"env": {"A": "b"}}\n')
    backdate(p)
    before = snapshot(p)
    r = setup_cli(env, cli, "--autocompact-pct", flag, "--hooks")
    assert r.code == 2 and "--autocompact-pct" in r.stderr
    assert snapshot(p) == before
    p.unlink()
    r = setup_cli(env, cli, "--autocompact-pct", flag)
    assert r.code == 2 and not p.exists()


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"env": {', "malformed JSON"),
        ("{'env': {}}", "malformed JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"text"', "not a JSON object"),
        ('{"env": "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=40"}', '"env" is not a JSON object'),
        ('{"env": ["x"]}', '"env" is not a JSON object'),
        (b'{"env": {"A": "\xff"}}', "not UTF-8"),
    ],
)
def test_refusals_exit_2_and_leave_the_file_byte_identical(env: Env, cli, content: str | bytes, why: str) -> None:
    p = write_settings(env, content)
    backdate(p)
    before = snapshot(p)
    for args in (["--yes"], ["--autocompact-pct", "30", "--hooks"]):
        r = setup_cli(env, cli, *args)
        assert r.code == 2, r.stdout
        assert why in r.stderr
        assert snapshot(p) == before
    assert sorted(x.name for x in p.parent.iterdir()) == ["settings.json"]


def test_a_symlink_is_refused_and_neither_link_nor_target_changes(env: Env, cli) -> None:
    target = env.root / "elsewhere.json"
    target.write_text('{"env": {}}\n')
    backdate(target)
    link = settings(env)
    link.parent.mkdir()
    link.symlink_to(target)
    before = snapshot(target)
    r = setup_cli(env, cli, "--yes")
    assert r.code == 2 and "symlink" in r.stderr
    assert link.is_symlink() and snapshot(target) == before


def test_hooks_that_are_not_an_object_are_refused(env: Env, cli) -> None:
    p = write_settings(env, '{"hooks": ["x"]}')
    before = snapshot(p)
    r = setup_cli(env, cli, "--yes", "--hooks")
    assert r.code == 2 and snapshot(p) == before


@pytest.mark.parametrize("content", ["", "   \n\t\n"])
def test_an_empty_or_whitespace_file_counts_as_an_empty_object(env: Env, cli, content: str) -> None:
    write_settings(env, content)
    assert setup_cli(env, cli, "--yes").code == 0
    assert json.loads(settings(env).read_text()) == {"env": {KEY: "40"}}


def test_above_83_is_written_with_a_warning(env: Env, cli) -> None:
    r = setup_cli(env, cli, "--autocompact-pct", "90")
    assert r.code == 0
    assert json.loads(settings(env).read_text())["env"][KEY] == "90"
    assert "above the harness default" in r.stderr
    assert "above the harness default" not in setup_cli(env, cli, "--autocompact-pct", "83").stderr


def test_shadowing_by_the_process_env_is_named(env: Env, cli) -> None:
    r = setup_cli(env, cli, "--yes", **{KEY: "55"})
    assert r.code == 0 and json.loads(settings(env).read_text())["env"][KEY] == "40"
    assert "process environment" in r.stderr and '"55"' in r.stderr and "will not take effect" in r.stderr


def test_shadowing_by_settings_local_is_named(env: Env, cli) -> None:
    local = write_settings(env, json.dumps({"env": {KEY: "70"}}), "settings.local.json")
    r = setup_cli(env, cli, "--yes")
    assert r.code == 0
    assert str(local) in r.stderr and '"70"' in r.stderr
    assert json.loads(local.read_text()) == {"env": {KEY: "70"}}  # never touched


def test_user_settings_do_not_shadow(env: Env, cli) -> None:
    user = home(env) / ".claude" / "settings.json"
    user.parent.mkdir()
    user.write_text(json.dumps({"env": {KEY: "20"}}))
    r = setup_cli(env, cli, "--yes")
    assert r.code == 0 and "warning" not in r.stderr


def test_no_autocompact_only_creates_the_marker(env: Env, cli) -> None:
    r = setup_cli(env, cli, "--no-autocompact")
    assert r.code == 0
    assert (env.repo / ".claude/memory/autocompact-nudge-off").is_file()
    assert not settings(env).exists()
    p = write_settings(env, '{"env":{"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE":"040"}}')
    before = snapshot(p)
    assert setup_cli(env, cli, "--no-autocompact").code == 0 and snapshot(p) == before
    assert setup_cli(env, cli, "--no-autocompact", "--autocompact-pct", "40").code == 2


def test_the_file_mode_is_kept(env: Env, cli) -> None:
    p = write_settings(env, '{"a": 1}')
    p.chmod(0o600)
    assert setup_cli(env, cli, "--yes").code == 0
    assert p.stat().st_mode & 0o777 == 0o600
    p.chmod(0o664)
    assert setup_cli(env, cli, "--autocompact-pct", "35").code == 0
    assert p.stat().st_mode & 0o777 == 0o664
    assert p.read_text().endswith("}\n")


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write_settings(env, '{"env": {"A": "1"}}')
    before = p.read_bytes()

    def boom(*_a: object, **_dir_fds: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        ac.setup(env.repo, {"HOME": str(home(env))}, pct="30")
    assert p.read_bytes() == before
    assert sorted(x.name for x in p.parent.iterdir()) == ["settings.json"]


def test_without_a_tty_or_yes_the_default_is_used_without_a_prompt(env: Env, cli) -> None:
    r = setup_cli(env, cli)
    assert r.code == 0 and "[40]" not in r.stdout
    assert json.loads(settings(env).read_text())["env"][KEY] == "40"


def _setup_on_a_tty(env: Env, answer: bytes) -> tuple[int, str]:
    import pty

    master, slave = pty.openpty()
    e = {k: v for k, v in env.env().items() if k != KEY}
    e["HOME"] = str(home(env))
    p = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "setup"],
                         stdin=slave, stdout=slave, stderr=slave, env=e)
    os.close(slave)
    out = b""
    while b"]: " not in out:
        chunk = os.read(master, 4096)
        if not chunk:
            break
        out += chunk
    os.write(master, answer)
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    code = p.wait(timeout=30)
    os.close(master)
    return code, out.decode(errors="replace")


def test_on_a_tty_the_prompt_keeps_the_default_on_enter_and_takes_an_answer(env: Env) -> None:
    write_settings(env, json.dumps({"env": {KEY: "60"}}))
    code, out = _setup_on_a_tty(env, b"\n")
    assert code == 0 and "[60]" in out and json.loads(settings(env).read_text())["env"][KEY] == "60"
    code, out = _setup_on_a_tty(env, b"25\n")
    assert code == 0 and json.loads(settings(env).read_text())["env"][KEY] == "25"
    code, out = _setup_on_a_tty(env, b"025\n")
    assert code == 2 and json.loads(settings(env).read_text())["env"][KEY] == "25"


def test_eof_at_the_prompt_exits_2(env: Env) -> None:
    code, out = _setup_on_a_tty(env, b"\x04")
    assert code == 2 and "no input available; pass --yes or --autocompact-pct" in out
    assert not settings(env).exists()


def test_hooks_are_merged_idempotently_and_existing_hooks_kept(env: Env, cli) -> None:
    mine = {"matcher": "startup", "hooks": [{"type": "command", "command": "echo hi"}]}
    other = {"matcher": "Bash", "hooks": [{"type": "command", "command": "lint"}]}
    p = write_settings(env, json.dumps({"hooks": {"SessionStart": [mine], "PreToolUse": [other]}}))
    r = setup_cli(env, cli, "--yes", "--hooks")
    assert r.code == 0, r.stderr
    got = json.loads(p.read_text())
    ss = got["hooks"]["SessionStart"]
    assert ss[0] == mine and got["hooks"]["PreToolUse"] == [other]
    assert [(e["matcher"], e["hooks"][0]["command"]) for e in ss[1:]] == [
        ("startup|resume|clear", "evolve hook session-start"), ("compact", "evolve hook session-start")]
    backdate(p)
    before = snapshot(p)
    r = setup_cli(env, cli, "--yes", "--hooks")
    assert r.code == 0 and snapshot(p) == before and "already registered" in r.stdout
    # only the missing registration is added back
    got["hooks"]["SessionStart"] = [e for e in ss if e["matcher"] != "compact"]
    p.write_text(json.dumps(got))
    assert setup_cli(env, cli, "--yes", "--hooks").code == 0
    again = json.loads(p.read_text())["hooks"]["SessionStart"]
    assert [e["matcher"] for e in again] == ["startup", "startup|resume|clear", "compact"]


def test_the_child_env_carries_the_override_whatever_the_settings_say(env: Env, cli) -> None:
    write_settings(env, json.dumps({"env": {KEY: "70"}}))
    env.write_config(agent={"runner": "claude", "argv": ["claude"]}, context={"autocompact_pct": 35})
    from support import entry

    env.queue(entry("a"))
    r = cli("fire", "--dry-run")
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    assert plan["agent"]["env"][KEY] == "35"


# -- the detector (§5.7) -----------------------------------------------------------------------


def _layers(env: Env) -> dict[str, Path]:
    user = home(env) / ".claude" / "settings.json"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(json.dumps({"env": {KEY: "10"}}))
    return {
        "local": write_settings(env, json.dumps({"env": {KEY: "30"}}), "settings.local.json"),
        "project": write_settings(env, json.dumps({"env": {KEY: "20"}})),
        "user": user,
    }


def test_precedence_env_then_local_then_project_then_user(env: Env) -> None:
    files = _layers(env)
    e = {"HOME": str(home(env)), KEY: "50"}
    d = ac.detect(env.repo, e)
    assert (d.status, d.value, d.source) == (ac.CONFIGURED, "50", ac.SRC_ENV)
    del e[KEY]
    assert (ac.detect(env.repo, e).value, ac.detect(env.repo, e).source) == ("30", ac.SRC_LOCAL)
    files["local"].unlink()
    d = ac.detect(env.repo, e)
    assert (d.value, d.source, d.path) == ("20", ac.SRC_PROJECT, files["project"])
    files["project"].unlink()
    assert (ac.detect(env.repo, e).value, ac.detect(env.repo, e).source) == ("10", ac.SRC_USER)
    files["user"].unlink()
    assert ac.detect(env.repo, e) == ac.Detection(ac.ABSENT)


def test_claude_config_dir_overrides_the_home_user_settings(env: Env) -> None:
    _layers(env)
    for name in ("settings.local.json", "settings.json"):
        (env.repo / ".claude" / name).unlink()
    cfg = env.root / "cfgdir"
    cfg.mkdir()
    (cfg / "settings.json").write_text(json.dumps({"env": {KEY: "15"}}))
    d = ac.detect(env.repo, {"HOME": str(home(env)), "CLAUDE_CONFIG_DIR": str(cfg)})
    assert (d.value, d.path) == ("15", cfg / "settings.json")
    (cfg / "settings.json").unlink()
    assert ac.detect(env.repo, {"HOME": str(home(env)), "CLAUDE_CONFIG_DIR": str(cfg)}).status == ac.ABSENT


@pytest.mark.parametrize("bad", ["{nope", "[]", '{"env": "x"}', b"\xff\xfe"])
def test_a_malformed_higher_precedence_file_is_skipped(env: Env, bad: str | bytes) -> None:
    _layers(env)
    write_settings(env, bad, "settings.local.json")
    d = ac.detect(env.repo, {"HOME": str(home(env))})
    assert (d.status, d.value, d.source) == (ac.CONFIGURED, "20", ac.SRC_PROJECT)


def test_invalid_values_are_reported_with_their_raw_value(env: Env) -> None:
    write_settings(env, json.dumps({"env": {KEY: 40}}))
    d = ac.detect(env.repo, {"HOME": str(home(env))})
    assert (d.status, d.value) == (ac.INVALID, 40)
    assert ac.detect(env.repo, {"HOME": str(home(env)), KEY: "0"}).status == ac.INVALID
    info = ac.status_info(env.repo, {"HOME": str(home(env))})
    assert info["status"] == ac.INVALID and "INVALID" in info["line"] and info["nudge_off"] is False


def test_status_json_shows_the_detection(env: Env, cli) -> None:
    r = cli("status", "--json", extra_env={"HOME": str(home(env))})
    info = orjson.loads(r.stdout)
    assert info["autocompact"]["state"] == "ABSENT"
    assert setup_cli(env, cli, "--yes").code == 0
    info = orjson.loads(cli("status", "--json", extra_env={"HOME": str(home(env))}).stdout)
    assert info["autocompact"]["state"] == "CONFIGURED" and info["autocompact"]["value"] == "40"


def test_setup_in_process_refusal_is_a_usage_error(env: Env) -> None:
    write_settings(env, "[]")
    with pytest.raises(UsageError):
        ac.setup(env.repo, {})
    settings(env).unlink()

    def eof(_prompt: str) -> str:
        raise EOFError

    with pytest.raises(UsageError, match="no input available"):
        ac.setup(env.repo, {}, ask=eof)
    assert not settings(env).exists()
