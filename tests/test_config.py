"""Configuration (docs/DESIGN.md §9, §10): layers, env names, validation errors, exit 78, and the commented template."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env

from evolve import config
from evolve.config import Config
from evolve.config_template import TEMPLATE
from evolve.errors import ConfigError

TOML_PATH = "/repo/.agents/evolve/config.toml"


def resolve(toml: dict[str, Any] | None = None, env: dict[str, str] | None = None,
            flags: dict[str, dict[str, Any]] | None = None) -> Config:
    return config.resolve(toml or {}, TOML_PATH, env or {}, flags)


def error(toml: dict[str, Any] | None = None, env: dict[str, str] | None = None,
          flags: dict[str, dict[str, Any]] | None = None) -> str:
    with pytest.raises(ConfigError) as exc:
        resolve(toml, env, flags)
    assert exc.value.exit_code == 78
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def fields() -> list[tuple[str, str, Any, Any]]:
    """(section, key, type, default) for every key of every section of Config."""
    out = []
    cfg = Config()
    for section, cls in typing.get_type_hints(Config).items():
        for key, tp in typing.get_type_hints(cls).items():
            out.append((section, key, tp, getattr(getattr(cfg, section), key)))
    return out


ALL_FIELDS = fields()


# -- precedence ------------------------------------------------------------------------------------------


def test_defaults() -> None:
    cfg = resolve()
    assert cfg == Config()
    assert cfg.context.streak_limit == 2
    assert cfg.context.heavy_pct == 40
    assert cfg.context.returning_fresh_start_turns == 8
    assert cfg.context.autocompact_pct == 40
    assert cfg.fire.max_cycles == 5 and cfg.fire.mode == "burst"
    assert cfg.agent.runner == "claude" and cfg.agent.argv == ["claude"]
    assert cfg.work.beads_command == ["bd", "ready", "--json"]
    assert cfg.breaker.max_consecutive_failures == 3 and cfg.breaker.cooldown_minutes == 30
    assert cfg.git.commit is True and cfg.git.push is False
    assert cfg.halt.kill_ttl_days == 7 and cfg.halt.governor_cmd == []


def test_precedence_defaults_toml_env_flags() -> None:
    toml = {"context": {"streak_limit": 3}, "fire": {"mode": "loop", "max_cycles": 9}}
    assert resolve(toml).context.streak_limit == 3
    env = {"EVOLVE_CONTEXT_STREAK_LIMIT": "4", "EVOLVE_FIRE_MODE": "burst"}
    cfg = resolve(toml, env)
    assert cfg.context.streak_limit == 4
    assert cfg.fire.mode == "burst"
    assert cfg.fire.max_cycles == 9, "keys the env does not set keep the TOML value"
    cfg = resolve(toml, env, {"context": {"streak_limit": 5}, "fire": {"mode": "loop"}})
    assert cfg.context.streak_limit == 5 and cfg.fire.mode == "loop"
    assert cfg.fire.max_cycles == 9
    # flags alone over defaults
    assert resolve(flags={"fire": {"mode": "loop"}}).fire.mode == "loop"


def test_load_real_file(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text('[context]\nstreak_limit = 3\nheavy_pct = 55.5\n[work]\ngenerators = [["gen", "--json"]]\n'
                 '[gate]\ncommands = [["make", "test"], ["ruff", "check"]]\n', encoding="utf-8")
    cfg = config.load(p, {})
    assert cfg.context.streak_limit == 3
    assert cfg.context.heavy_pct == 55.5
    assert cfg.work.generators == [["gen", "--json"]]
    assert cfg.gate.commands == [["make", "test"], ["ruff", "check"]]
    cfg = config.load(p, {"EVOLVE_CONTEXT_STREAK_LIMIT": "6", "EVOLVE_CONTEXT_HEAVY_PCT": "30"})
    assert cfg.context.streak_limit == 6 and cfg.context.heavy_pct == 30
    cfg = config.load(p, {"EVOLVE_CONTEXT_STREAK_LIMIT": "6"}, {"context": {"streak_limit": 7}})
    assert cfg.context.streak_limit == 7


def test_missing_file_is_defaults(tmp_path: Path) -> None:
    assert config.load(tmp_path / "absent.toml", {}) == Config()


def test_int_accepted_for_float_keys() -> None:
    cfg = resolve({"agent": {"timeout_s": 60}, "fire": {"max_minutes": 1.5}})
    assert cfg.agent.timeout_s == 60.0 and isinstance(cfg.agent.timeout_s, float)
    assert cfg.fire.max_minutes == 1.5


def test_unrelated_evolve_env_vars_are_ignored() -> None:
    env = {"EVOLVE_DIR": "/x", "EVOLVE_NEXTWORK": "/y", "EVOLVE_AUTOCOMPACT_NUDGE": "0", "EVOLVE_MODE": "first",
           "EVOLVE_CYCLE": "3", "EVOLVE_WORK_JSON": "{}", "EVOLVE_NOPE_NOPE": "1", "EVOLVE_CONTEXT_NOPE": "x"}
    assert resolve(env=env) == Config()


# -- env names -------------------------------------------------------------------------------------------


def test_legacy_env_names() -> None:
    cfg = resolve(env={
        "EVOLVE_CONTEXT_STREAK_LIMIT": "3",
        "EVOLVE_KILL_TTL_DAYS": "2.5",
        "EVOLVE_HALT_TIMEOUT": "12",
        "EVOLVE_GOVERNOR_CMD": "check-budget --team 'ml ops' --max=3",
    })
    assert cfg.context.streak_limit == 3
    assert cfg.halt.kill_ttl_days == 2.5
    assert cfg.halt.timeout_s == 12
    assert cfg.halt.governor_cmd == ["check-budget", "--team", "ml ops", "--max=3"]


def test_legacy_env_beats_toml() -> None:
    toml = {"context": {"streak_limit": 5}, "halt": {"kill_ttl_days": 1, "timeout_s": 3, "governor_cmd": ["a"]}}
    cfg = resolve(toml, {"EVOLVE_CONTEXT_STREAK_LIMIT": "3", "EVOLVE_KILL_TTL_DAYS": "9",
                         "EVOLVE_HALT_TIMEOUT": "4", "EVOLVE_GOVERNOR_CMD": "b c"})
    assert cfg.context.streak_limit == 3
    assert cfg.halt.kill_ttl_days == 9 and cfg.halt.timeout_s == 4 and cfg.halt.governor_cmd == ["b", "c"]


def test_governor_cmd_split_without_a_shell() -> None:
    cmd = resolve(env={"EVOLVE_GOVERNOR_CMD": "sh -c 'exit 3; rm -rf / $(id) `x` | y && z > f'"}).halt.governor_cmd
    assert cmd == ["sh", "-c", "exit 3; rm -rf / $(id) `x` | y && z > f"]
    # shell syntax outside the quoted argument cannot start without a shell: refused at load, naming why
    msg = error(env={"EVOLVE_GOVERNOR_CMD": "sh -c 'exit 3' ; rm -rf / $(id) `x` | y && z > f"})
    assert "';' is a shell operator" in msg and "evolve runs no shell" in msg
    # a JSON array is taken as the argv as is
    assert resolve(env={"EVOLVE_GOVERNOR_CMD": '["my gov", "--x"]'}).halt.governor_cmd == ["my gov", "--x"]
    assert resolve(env={"EVOLVE_HALT_GOVERNOR_CMD": "a 'b c'"}).halt.governor_cmd == ["a", "b c"]
    msg = error(env={"EVOLVE_GOVERNOR_CMD": "gov 'unterminated"})
    assert "EVOLVE_GOVERNOR_CMD" in msg and "governor_cmd" in msg


def test_explicit_generic_name_beats_legacy_name() -> None:
    cfg = resolve(env={"EVOLVE_HALT_TIMEOUT": "5", "EVOLVE_HALT_TIMEOUT_S": "9",
                       "EVOLVE_KILL_TTL_DAYS": "1", "EVOLVE_HALT_KILL_TTL_DAYS": "2",
                       "EVOLVE_GOVERNOR_CMD": "a", "EVOLVE_HALT_GOVERNOR_CMD": "b"})
    assert cfg.halt.timeout_s == 9 and cfg.halt.kill_ttl_days == 2 and cfg.halt.governor_cmd == ["b"]


def changed(section: str, key: str, tp: Any, default: Any) -> Any:
    """A valid value different from the default."""
    if (section, key) in config.ENUMS:
        return next(v for v in config.ENUMS[(section, key)] if v != default)
    if tp is bool:
        return not default
    if tp is int or tp is float:
        return default + 1
    if tp is str:
        return "changed value"
    if key == "pass_env":
        return ["A_B", "C_*"]  # variable names, validated
    if (section, key) == ("sandbox", "writable"):
        return ["/srv/build cache", "~/.cache/tool"]  # absolute or ~/, validated
    if tp == list[str]:
        return ["a b", "c"]
    if tp == list[list[str]]:
        return [["make", "test"], ["x"]]
    raise AssertionError(tp)  # pragma: no cover


def env_text(tp: Any, value: Any) -> str:
    if tp is str:
        return value
    if tp is bool:
        return "true" if value else "false"
    return orjson.dumps(value).decode()


@pytest.mark.parametrize(("section", "key", "tp", "default"), ALL_FIELDS, ids=[f"{s}.{k}" for s, k, _, _ in ALL_FIELDS])
def test_generic_env_name_for_every_key(section: str, key: str, tp: Any, default: Any) -> None:
    want = changed(section, key, tp, default)
    name = f"EVOLVE_{section.upper()}_{key.upper()}"
    cfg = resolve({section: {key: default}}, {name: env_text(tp, want)})
    assert getattr(getattr(cfg, section), key) == want
    # and the same value in the TOML file
    assert getattr(getattr(resolve({section: {key: want}}), section), key) == want


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True),
                                           ("0", False), ("false", False), ("No", False), ("off", False)])
def test_env_booleans(raw: str, want: bool) -> None:
    assert resolve(env={"EVOLVE_GIT_PUSH": raw}).git.push is want
    assert resolve(env={"EVOLVE_WORK_QUALITY": f" {raw} "}).work.quality is want


# -- validation errors -----------------------------------------------------------------------------------

TOML_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"nope": {"x": 1}}, "nope"),
    ({"agent": {"nope": 1}}, "agent.nope"),
    ({"agent": 3}, "agent"),
    ({"context": {"streak_limit": "2"}}, "context.streak_limit"),
    ({"context": {"streak_limit": True}}, "context.streak_limit"),
    ({"context": {"streak_limit": 2.5}}, "context.streak_limit"),
    ({"context": {"heavy_pct": "40"}}, "context.heavy_pct"),
    ({"context": {"heavy_pct": False}}, "context.heavy_pct"),
    ({"work": {"quality": 1}}, "work.quality"),
    ({"git": {"push": "false"}}, "git.push"),
    ({"agent": {"model": 3}}, "agent.model"),
    ({"agent": {"allowed_tools": [1, "Read"]}}, "agent.allowed_tools"),
    ({"agent": {"allowed_tools": "Read"}}, "agent.allowed_tools"),
    ({"agent": {"argv": [["claude"]]}}, "agent.argv"),
    ({"work": {"generators": ["gen"]}}, "work.generators"),
    ({"gate": {"commands": [["make", 2]]}}, "gate.commands"),
    ({"work": {"beads_command": "bd ready --json"}}, "work.beads_command"),
    ({"schedule": {"cron": ["*/30"]}}, "schedule.cron"),
    ({"context": {"streak_limit": 0}}, "context.streak_limit"),
    ({"context": {"streak_limit": -1}}, "context.streak_limit"),
    ({"context": {"heavy_pct": 0}}, "context.heavy_pct"),
    ({"context": {"heavy_pct": 101}}, "context.heavy_pct"),
    ({"context": {"autocompact_pct": 0}}, "context.autocompact_pct"),
    ({"context": {"returning_fresh_start_turns": -1}}, "context.returning_fresh_start_turns"),
    ({"context": {"context_window": -5}}, "context.context_window"),
    ({"fire": {"max_cycles": -1}}, "fire.max_cycles"),
    ({"work": {"max_attempts": 0}}, "work.max_attempts"),
    ({"breaker": {"max_consecutive_failures": 0}}, "breaker.max_consecutive_failures"),
    ({"breaker": {"cooldown_minutes": -1}}, "breaker.cooldown_minutes"),
    ({"halt": {"kill_ttl_days": -0.5}}, "halt.kill_ttl_days"),
    ({"agent": {"timeout_s": -1}}, "agent.timeout_s"),
    ({"schedule": {"jitter_s": -1}}, "schedule.jitter_s"),
    ({"agent": {"runner": "bash"}}, "agent.runner"),
    ({"agent": {"runner": "Claude"}}, "agent.runner"),
    ({"fire": {"mode": "forever"}}, "fire.mode"),
]


@pytest.mark.parametrize(("toml", "key"), TOML_ERRORS, ids=[f"{i}-{k}" for i, (_, k) in enumerate(TOML_ERRORS)])
def test_toml_errors_name_key_and_file(toml: dict[str, Any], key: str) -> None:
    msg = error(toml)
    assert key in msg
    assert TOML_PATH in msg


ENV_ERRORS: list[tuple[str, str, str]] = [
    ("EVOLVE_CONTEXT_STREAK_LIMIT", "abc", "context.streak_limit"),
    ("EVOLVE_CONTEXT_STREAK_LIMIT", "true", "context.streak_limit"),
    ("EVOLVE_CONTEXT_STREAK_LIMIT", "2.5", "context.streak_limit"),
    ("EVOLVE_CONTEXT_STREAK_LIMIT", '"2"', "context.streak_limit"),
    ("EVOLVE_CONTEXT_STREAK_LIMIT", "0", "context.streak_limit"),
    ("EVOLVE_CONTEXT_STREAK_LIMIT", "", "context.streak_limit"),
    ("EVOLVE_KILL_TTL_DAYS", "seven", "halt.kill_ttl_days"),
    ("EVOLVE_KILL_TTL_DAYS", "-1", "halt.kill_ttl_days"),
    ("EVOLVE_HALT_TIMEOUT", "false", "halt.timeout_s"),
    ("EVOLVE_CONTEXT_HEAVY_PCT", "200", "context.heavy_pct"),
    ("EVOLVE_WORK_QUALITY", "maybe", "work.quality"),
    ("EVOLVE_GIT_PUSH", "2", "git.push"),
    ("EVOLVE_FIRE_MODE", "sometimes", "fire.mode"),
    ("EVOLVE_AGENT_RUNNER", "bash", "agent.runner"),
    ("EVOLVE_AGENT_ALLOWED_TOOLS", "[1]", "agent.allowed_tools"),
    ("EVOLVE_AGENT_ALLOWED_TOOLS", "Read,Edit", "agent.allowed_tools"),
    ("EVOLVE_AGENT_ARGV", '"claude"', "agent.argv"),
    ("EVOLVE_GATE_COMMANDS", '["make"]', "gate.commands"),
    ("EVOLVE_WORK_MAX_ATTEMPTS", "0", "work.max_attempts"),
]


@pytest.mark.parametrize(("name", "raw", "key"), ENV_ERRORS, ids=[f"{n}={r}" for n, r, _ in ENV_ERRORS])
def test_env_errors_name_key_and_variable(name: str, raw: str, key: str) -> None:
    msg = error(env={name: raw})
    assert name in msg
    assert key in msg


def test_flag_errors_name_the_command_line() -> None:
    msg = error(flags={"fire": {"mode": "sometimes"}})
    assert "fire.mode" in msg and "command line" in msg


def test_bad_toml_value_is_an_error_even_when_env_overrides_it() -> None:
    msg = error({"context": {"streak_limit": "2"}}, {"EVOLVE_CONTEXT_STREAK_LIMIT": "3"})
    assert "context.streak_limit" in msg and TOML_PATH in msg


def test_invalid_toml_file(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[agent\nrunner = 'claude'\n", encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        config.load(p, {})
    assert str(p) in str(exc.value) and "TOML" in str(exc.value)
    assert exc.value.exit_code == 78


def test_unknown_key_in_real_file(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text("[context]\nstreak_limt = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        config.load(p, {})
    assert "context.streak_limt" in str(exc.value) and str(p) in str(exc.value)


# -- through the real CLI --------------------------------------------------------------------------------


def one_line(stderr: str) -> str:
    lines = stderr.strip("\n").split("\n")
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("section", "table", "key"),
    [
        ("context", {"streak_limit": "2"}, "context.streak_limit"),
        ("context", {"streak_limit": 0}, "context.streak_limit"),
        ("work", {"quality": 1}, "work.quality"),
        ("fire", {"mode": "forever"}, "fire.mode"),
        ("agent", {"allowed_tools": [1]}, "agent.allowed_tools"),
        ("context", {"bogus_key": 1}, "context.bogus_key"),
    ],
)
def test_cli_bad_config_exits_78_with_one_line(env: Env, cli, section: str, table: dict[str, Any], key: str) -> None:
    env.write_config(**{section: table})
    r = cli("fire")
    assert r.code == 78, r.stderr
    line = one_line(r.stderr)
    assert key in line
    assert str(env.paths.config) in line
    assert not env.paths.ledger.exists(), "a bad config must not run anything"


def test_cli_invalid_toml_exits_78(env: Env, cli) -> None:
    env.paths.config.write_text("[agent\nrunner = \n", encoding="utf-8")
    r = cli("fire")
    assert r.code == 78, r.stderr
    line = one_line(r.stderr)
    assert str(env.paths.config) in line
    assert not env.paths.ledger.exists()


def test_cli_bad_env_exits_78(env: Env, cli) -> None:
    r = cli("fire", extra_env={"EVOLVE_CONTEXT_STREAK_LIMIT": "lots"})
    assert r.code == 78, r.stderr
    line = one_line(r.stderr)
    assert "EVOLVE_CONTEXT_STREAK_LIMIT" in line and "context.streak_limit" in line


# -- the commented template ------------------------------------------------------------------------------

KEY_LINE = re.compile(r"^# ([a-z_]+) = (.+)$")
SECTION_LINE = re.compile(r"^\[([a-z_]+)\]$")


def template_keys() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    section = None
    for line in TEMPLATE.splitlines():
        if m := SECTION_LINE.match(line):
            section = m.group(1)
            assert section not in out, f"[{section}] twice"
            out[section] = {}
        elif m := KEY_LINE.match(line):
            assert section is not None, f"key outside a section: {line}"
            key = m.group(1)
            assert key not in out[section], f"{section}.{key} twice"
            out[section][key] = tomllib.loads(f"v = {m.group(2)}")["v"]  # inline comments are TOML comments
        else:
            assert not line or line.startswith("#"), f"uncommented line in the template: {line!r}"
    return out


def test_template_documents_every_key_with_its_default() -> None:
    documented = template_keys()
    defaults = dataclasses.asdict(Config())
    assert set(documented) == set(defaults)
    for section, table in defaults.items():
        assert set(documented[section]) == set(table), section
        for key, value in table.items():
            assert documented[section][key] == value, f"{section}.{key}"
            assert type(documented[section][key]) is type(value) or isinstance(value, float), f"{section}.{key}"


def test_template_commented_out_is_all_defaults() -> None:
    assert config.resolve(tomllib.loads(TEMPLATE), "template", {}) == Config()
    assert tomllib.loads(TEMPLATE) == {s: {} for s in dataclasses.asdict(Config())}


def test_template_uncommented_parses_to_exactly_the_defaults() -> None:
    text = "\n".join(line[2:] if KEY_LINE.match(line) else line for line in TEMPLATE.splitlines())
    parsed = tomllib.loads(text)
    assert parsed == dataclasses.asdict(Config())
    assert config.resolve(parsed, "template", {}) == Config()


def test_template_covers_spec_section_10_keys() -> None:
    documented = template_keys()
    spec = {
        "agent": {"runner", "argv", "model", "permission_mode", "allowed_tools", "timeout_s", "idle_timeout_s",
                  "max_turns", "max_budget_usd", "base_url", "api_key_env"},
        "context": {"streak_limit", "heavy_pct", "returning_fresh_start_turns", "autocompact_pct", "context_window"},
        "fire": {"max_cycles", "max_minutes", "max_cost_usd", "mode"},
        "schedule": {"cron", "timezone", "jitter_s"},
        "work": {"beads_command", "generators", "max_attempts", "quality", "beads_only"},
        "gate": {"commands", "timeout_s"},
        "breaker": {"max_consecutive_failures", "cooldown_minutes"},
        "git": {"commit", "push"},
    }
    for section, keys in spec.items():
        assert keys <= set(documented[section]), section


def test_example_file_equals_template() -> None:
    example = Path(__file__).parents[1] / ".agents" / "evolve" / "config.example.toml"
    assert example.read_bytes() == TEMPLATE.encode("utf-8")


def test_governor_command_line_starting_with_a_bracket_is_split_not_json() -> None:
    cmd = resolve(env={"EVOLVE_GOVERNOR_CMD": "[ -f budget.ok ]"}).halt.governor_cmd
    assert cmd == ["[", "-f", "budget.ok", "]"]


def test_hostile_key_still_gives_one_error_line(env, cli) -> None:
    env.paths.config.write_text('[fire]\n"max\\ncycles" = 1\n')
    r = cli("fire")
    assert r.code == 78
    assert len(r.stderr.strip().splitlines()) == 1 and "config.toml" in r.stderr
