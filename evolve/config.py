"""Configuration: built-in defaults < ``.agents/evolve/config.toml`` < ``EVOLVE_*`` env < flags.

Unknown keys and wrong types are errors that name the key and where it came from (exit 78).
Every key has an env name ``EVOLVE_<SECTION>_<KEY>``; the names the ``/evolve`` sources used
(``EVOLVE_CONTEXT_STREAK_LIMIT``, ``EVOLVE_KILL_TTL_DAYS``, ``EVOLVE_HALT_TIMEOUT``,
``EVOLVE_GOVERNOR_CMD``) keep working.
"""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.childenv import valid_name
from evolve.errors import ConfigError


@dataclass(frozen=True)
class AgentConfig:
    runner: str = "claude"
    argv: list[str] = field(default_factory=lambda: ["claude"])
    model: str = ""
    permission_mode: str = "acceptEdits"
    allowed_tools: list[str] = field(default_factory=list)
    timeout_s: float = 1800
    idle_timeout_s: float = 600
    heartbeat_s: float = 30
    transient_retries: int = 2
    retry_backoff_s: float = 30
    max_turns: int = 0
    max_budget_usd: float = 0
    base_url: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    message_budget_chars: int = 200_000
    pass_env: list[str] = field(default_factory=list)  # extra env names for the agent (childenv)


@dataclass(frozen=True)
class ContextConfig:
    streak_limit: int = 2
    heavy_pct: float = 40
    returning_fresh_start_turns: int = 8
    autocompact_pct: int = 40
    context_window: int = 0


@dataclass(frozen=True)
class FireConfig:
    max_cycles: int = 5
    max_minutes: float = 55
    max_cost_usd: float = 0
    mode: str = "burst"


@dataclass(frozen=True)
class ScheduleConfig:
    cron: str = "*/30 * * * *"
    timezone: str = "UTC"
    jitter_s: int = 0


@dataclass(frozen=True)
class DaemonConfig:
    grace_s: float = 30


@dataclass(frozen=True)
class WorkConfig:
    beads_command: list[str] = field(default_factory=lambda: ["bd", "ready", "--json"])
    generators: list[list[str]] = field(default_factory=list)
    max_attempts: int = 3
    quality: bool = False
    beads_only: bool = False
    probe_timeout_s: float = 30
    goal_timeout_s: float = 60
    goals_timeout_s: float = 300
    max_new_work: int = 20  # follow-ups queued per agent report; the rest are logged and dropped
    claim_visibility_minutes: float = 0  # a foreign in_progress claim older than this is taken over; 0 = fire's
    pass_env: list[str] = field(default_factory=list)  # extra env names for the tracker and generators


@dataclass(frozen=True)
class GateConfig:
    commands: list[list[str]] = field(default_factory=list)
    timeout_s: float = 1800
    pass_env: list[str] = field(default_factory=list)  # extra env names for gate commands and goal checks


@dataclass(frozen=True)
class BreakerConfig:
    max_consecutive_failures: int = 3
    cooldown_minutes: float = 30


@dataclass(frozen=True)
class GitConfig:
    commit: bool = True
    push: bool = False
    run_hooks: bool = False  # evolve's own git runs the repo's hooks (still with the minimal env)
    sign: bool = False  # evolve's commits are signed (gpg gets GNUPGHOME, GPG_TTY, SSH_AUTH_SOCK)
    timeout_s: float = 300  # one git command's limit (also capped by the fire's remaining max_minutes)
    # Where the agent works (docs/DESIGN.md §8.3): "worktree" = evolve's own git worktree, landed on the
    # operator's branch by compare-and-swap; "none" = in the operator's checkout (hand fires, no operator).
    isolation: str = "worktree"
    worktree_dir: str = ""  # the agent's worktree; "" = <state dir>/worktree (stable: sessions resume)
    max_file_mb: float = 50  # a landing that adds or grows a file past this waits unlanded (0 = no limit)
    setaside_keep_days: float = 30  # refs/evolve/{stranded,interrupted,...} older than this are dropped (0 = kept)


@dataclass(frozen=True)
class LandConfig:
    """How a green cycle reaches the branch (docs/DESIGN.md §8.3)."""

    remote: str = "origin"  # where [git] push publishes what landed: git push <remote> <sha>:<branch>


# What a change to one of these means for the worktree's environment: its setup runs again.
SETUP_INPUTS = ["pyproject.toml", "setup.*", "requirements*.txt", "*.lock", "package*.json", "pnpm-lock.yaml", "go.sum"]


@dataclass(frozen=True)
class WorkspaceConfig:
    """What the agent's worktree needs besides the commit, so the gate tests the tree that lands (§8.4)."""

    setup: list[list[str]] = field(default_factory=list)  # argv lists run in the worktree: made, or inputs changed
    inputs: list[str] = field(default_factory=lambda: list(SETUP_INPUTS))  # worktree paths/globs keying setup
    link: list[str] = field(default_factory=list)  # checkout paths linked into the worktree (e.g. node_modules)
    copy: list[str] = field(default_factory=list)  # checkout paths copied in (a gitignored file the tests read)
    path: list[str] = field(default_factory=list)  # worktree dirs put first on PATH (e.g. .venv/bin)
    setup_timeout_s: float = 1800
    pass_env: list[str] = field(default_factory=list)  # extra env names for setup (a registry's token)
    probe: bool = True  # before a claim: does the gate see the worktree's code? (exit 78 with the fix if not)


@dataclass(frozen=True)
class HaltConfig:
    kill_ttl_days: float = 7
    governor_cmd: list[str] = field(default_factory=list)
    timeout_s: float = 30
    pass_env: list[str] = field(default_factory=list)  # extra env names for the governor


@dataclass(frozen=True)
class NotifyConfig:
    command: list[str] = field(default_factory=list)
    timeout_s: float = 10
    pass_env: list[str] = field(default_factory=list)  # extra env names for the notify command


@dataclass(frozen=True)
class RetentionConfig:
    """What evolve keeps of its own logs (applied at the end of every fire): sizes in MB, ages in days; 0 = no limit."""

    run_log_max_mb: float = 50  # one run log: beyond this only its head and tail are kept, while written
    runs_max_age_days: float = 30
    runs_max_total_mb: float = 500
    fires_max_mb: float = 10  # fires.jsonl: the newest lines are kept
    cron_log_max_mb: float = 10  # cron.log: the newest lines are kept
    baselines_max_age_days: float = 90  # fitness-baselines/
    baselines_max_count: int = 200


@dataclass(frozen=True)
class MetricsConfig:
    textfile_dir: str = ""


@dataclass(frozen=True)
class SandboxConfig:
    """What the agent, gate commands, setup and goal checks run in (docs/DESIGN.md §8.6, evolve/sandbox.py)."""

    mode: str = "auto"  # auto: bubblewrap where it starts, else unsandboxed with a warning | required | off
    network: str = "all"  # all | none (--unshare-net)
    writable: list[str] = field(default_factory=list)  # extra absolute (or ~/) paths the children may write


@dataclass(frozen=True)
class Config:
    agent: AgentConfig = field(default_factory=AgentConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    fire: FireConfig = field(default_factory=FireConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    work: WorkConfig = field(default_factory=WorkConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    git: GitConfig = field(default_factory=GitConfig)
    land: LandConfig = field(default_factory=LandConfig)
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    halt: HaltConfig = field(default_factory=HaltConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


SECTIONS: dict[str, type] = typing.get_type_hints(Config)

ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("agent", "runner"): ("claude", "codex", "gemini", "command", "http"),
    ("fire", "mode"): ("burst", "loop"),
    ("git", "isolation"): ("worktree", "none"),
    ("sandbox", "mode"): ("auto", "required", "off"),
    ("sandbox", "network"): ("all", "none"),
}
RANGES: dict[tuple[str, str], tuple[float, float]] = {
    ("context", "streak_limit"): (1, 10_000),
    ("context", "heavy_pct"): (1, 100),
    ("context", "autocompact_pct"): (1, 100),
    ("context", "returning_fresh_start_turns"): (0, 1_000_000),
    ("context", "context_window"): (0, 1 << 40),
    ("fire", "max_cycles"): (0, 1_000_000),
    ("fire", "max_minutes"): (0, 1 << 30),
    ("fire", "max_cost_usd"): (0, 1 << 30),
    ("agent", "timeout_s"): (0, 1 << 30),
    ("agent", "idle_timeout_s"): (0, 1 << 30),
    ("agent", "heartbeat_s"): (0.1, 1 << 30),
    ("agent", "transient_retries"): (0, 100),
    ("agent", "retry_backoff_s"): (0, 1 << 30),
    ("agent", "max_turns"): (0, 1 << 30),
    ("agent", "max_budget_usd"): (0, 1 << 30),
    ("agent", "message_budget_chars"): (1000, 1 << 40),
    ("work", "max_attempts"): (1, 1_000_000),
    ("work", "probe_timeout_s"): (0.1, 1 << 30),
    ("work", "goal_timeout_s"): (0.1, 1 << 30),
    ("work", "goals_timeout_s"): (0.1, 1 << 30),
    ("work", "max_new_work"): (0, 1000),  # agent/report.py NEW_WORK_PARSED_MAX: what a report may carry at all
    ("work", "claim_visibility_minutes"): (0, 1 << 30),
    ("breaker", "max_consecutive_failures"): (1, 1_000_000),
    ("breaker", "cooldown_minutes"): (0, 1 << 30),
    ("halt", "kill_ttl_days"): (0, 1 << 30),
    ("gate", "timeout_s"): (0, 1 << 30),
    ("halt", "timeout_s"): (0, 1 << 30),
    ("notify", "timeout_s"): (0.1, 3600),
    ("schedule", "jitter_s"): (0, 1 << 30),
    ("daemon", "grace_s"): (0, 3600),
    ("git", "timeout_s"): (0.1, 1 << 30),
    ("git", "max_file_mb"): (0, 1 << 30),
    ("git", "setaside_keep_days"): (0, 1 << 30),
    ("workspace", "setup_timeout_s"): (0.1, 1 << 30),
    ("retention", "run_log_max_mb"): (0, 1 << 30),
    ("retention", "runs_max_age_days"): (0, 1 << 30),
    ("retention", "runs_max_total_mb"): (0, 1 << 30),
    ("retention", "fires_max_mb"): (0, 1 << 30),
    ("retention", "cron_log_max_mb"): (0, 1 << 30),
    ("retention", "baselines_max_age_days"): (0, 1 << 30),
    ("retention", "baselines_max_count"): (0, 1 << 30),
}
LEGACY_ENV: dict[str, tuple[str, str]] = {
    "EVOLVE_CONTEXT_STREAK_LIMIT": ("context", "streak_limit"),
    "EVOLVE_KILL_TTL_DAYS": ("halt", "kill_ttl_days"),
    "EVOLVE_HALT_TIMEOUT": ("halt", "timeout_s"),
    "EVOLVE_GOVERNOR_CMD": ("halt", "governor_cmd"),
}


def _section_fields(section: str) -> dict[str, Any]:
    return typing.get_type_hints(SECTIONS[section])


def _shown(name: str) -> str:
    """A key or section name as the error shows it: escaped when it holds control or invisible characters."""
    return name if name.isprintable() else repr(name)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check(value: Any, tp: Any, where: str, key: str) -> Any:
    """Validate ``value`` against the field type ``tp``; returns the value (ints widened to float)."""

    def bad() -> ConfigError:
        return ConfigError(f"{where}: {key} must be {_type_name(tp)}, got {type(value).__name__} {value!r}"[:300])

    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad()
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise bad()
        return [_check(v, inner, where, f"{key}[{i}]") for i, v in enumerate(value)]
    raise bad()  # pragma: no cover - every field type is listed above


# Words only a shell understands: as argv[0] they name no program, so the command cannot start.
SHELL_ONLY = frozenset(
    [
        "exit", "return", "cd", "source", ".", "export", "unset", "set", "eval", "exec", "alias", "declare",
        "local", "readonly", "shift", "trap", "ulimit", "umask", "wait", "let", "if", "then", "else", "elif",
        "fi", "for", "while", "until", "do", "done", "case", "esac", "function", "{", "}", "(", ")", "!", "[[",
        "]]", "((",
    ]
)
SHELL_OPERATORS = frozenset(";|&<>") | {"&&", "||", ">>", "2>&1", ";;", "$("}


def shell_syntax(argv: Sequence[str], *, command_line: bool = False) -> str | None:
    """Why ``argv`` is shell syntax evolve cannot start (it runs no shell), or None.

    ``command_line``: ``argv`` was split from one string, so a lone operator token (``&&``, ``|``,
    ``>``) is shell syntax too; in the argv form such a token is an argument like any other.
    """
    if not argv:
        return None
    first = argv[0]
    if first in SHELL_ONLY:
        return f"{first!r} is shell syntax, not a program"
    if "=" in first and "/" not in first.split("=", 1)[0]:
        return f"{first!r} is a shell variable assignment, not a program"
    if command_line:
        op = next((t for t in argv if t in SHELL_OPERATORS or t.startswith(("$(", "`"))), None)
        if op is not None:
            return f"{op!r} is a shell operator"
    return None


def _governor_check(argv: Sequence[str], where: str, *, command_line: bool = False) -> None:
    """EVOLVE_GOVERNOR_CMD in shell syntax fails loudly at load: at run time it could only fail to
    start, and Step 1 would go on as if no governor were configured (docs/DESIGN.md §4.1)."""
    why = shell_syntax(argv, command_line=command_line)
    if why is None:
        return
    shown = redact.current().text(" ".join(argv))[:120]  # a command line may carry a token
    example = orjson.dumps(["bash", "-c", shown]).decode()
    raise ConfigError(
        f"{where}: halt.governor_cmd {shown!r}: {why}, and evolve runs no shell; give a program and "
        f"its arguments, e.g. EVOLVE_GOVERNOR_CMD='{example}' (or governor_cmd = {example} in [halt])"
    )


def bad_rel_path(path: str) -> str | None:
    """Why ``path`` cannot name a place in the agent's worktree (``[workspace] link/copy/path/inputs``), or None.

    Relative, no ``..``, nothing under ``.git``, no control characters: evolve creates links and copies
    there and puts it first on PATH, so it must stay inside the worktree (docs/DESIGN.md §8.4).
    """
    if not path or path.strip() != path:
        return "is empty or padded with spaces"
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        return "holds a control character"
    if path.startswith(("/", "~")):
        return "is not relative to the worktree"
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        return "names the worktree itself"
    if ".." in parts:
        return "leaves the worktree (..)"
    if parts[0] == ".git":
        return "is under .git"
    return None


def _validate_ranges(section: str, key: str, value: Any, where: str) -> None:
    if (section, key) == ("halt", "governor_cmd"):
        _governor_check(value, where)
    if key == "pass_env":
        bad = [name for name in value if not valid_name(name)]
        if bad:
            raise ConfigError(f"{where}: {section}.pass_env: not a variable name (or NAME_*): {bad[0]!r}"[:300])
    if (section, key) == ("land", "remote") and (not value or value.startswith("-") or not value.isprintable()):
        raise ConfigError(f"{where}: land.remote must be a remote's name or URL (not empty, not starting with '-'), "
                          f"got {value!r}"[:300])
    if section == "workspace" and key in ("link", "copy", "path", "inputs"):
        for entry in value:
            why = bad_rel_path(entry)
            if why:
                raise ConfigError(f"{where}: workspace.{key}: {entry!r} {why}"[:300])
    if section == "workspace" and key == "setup":
        for i, argv in enumerate(value):
            why = shell_syntax(argv) if argv else "an empty command"
            if why:
                raise ConfigError(f"{where}: workspace.setup[{i}]: {why}, and evolve runs no shell; give a program "
                                  'and its arguments, e.g. ["npm", "ci"]'[:300])
    if section == "sandbox":
        _sandbox_check(key, value, where)
    if (section, key) in ENUMS and value not in ENUMS[(section, key)]:
        choices = "|".join(ENUMS[(section, key)])
        raise ConfigError(f"{where}: {section}.{key} must be one of {choices}, got {value!r}")
    if (section, key) in RANGES:
        lo, hi = RANGES[(section, key)]
        if not lo <= value <= hi:
            raise ConfigError(f"{where}: {section}.{key} must be between {lo:g} and {hi:g}, got {value!r}")


def _sandbox_check(key: str, value: Any, where: str) -> None:
    if key == "network" and value == "model":
        raise ConfigError(f'{where}: sandbox.network = "model" (only the model API reachable) is not implemented '
                          'yet; use "all" or "none"')
    if key == "writable":
        for entry in value:
            if not (entry.startswith("/") or entry.startswith("~/")) or "\0" in entry:
                raise ConfigError(f"{where}: sandbox.writable: {entry!r} must be an absolute path (or start with ~/)"
                                  [:300])


def _json_string_list(raw: str) -> bool:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, list)


def _parse_env_value(raw: str, tp: Any, name: str, section: str, key: str) -> Any:
    if tp is str:
        return raw
    if (section, key) == ("halt", "governor_cmd") and not _json_string_list(raw):
        # EVOLVE_GOVERNOR_CMD is historically a command line; split it, never hand it to a shell.
        try:
            argv = shlex.split(raw)
        except ValueError as exc:
            raise ConfigError(f"env {name}: {section}.{key}: cannot split command line: {exc}") from exc
        _governor_check(argv, f"env {name}", command_line=True)
        return argv
    if tp is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"env {name}: {section}.{key} must be a boolean, got {raw!r}")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"env {name}: {section}.{key} must be {_type_name(tp)}, got {raw!r}") from exc
    return value


def env_overrides(env: Mapping[str, str]) -> dict[str, dict[str, tuple[Any, str]]]:
    """``{section: {key: (value, source)}}`` from recognised ``EVOLVE_*`` variables."""
    names: dict[str, tuple[str, str]] = {}
    for section in SECTIONS:
        for key in _section_fields(section):
            names[f"EVOLVE_{section.upper()}_{key.upper()}"] = (section, key)
    out: dict[str, dict[str, tuple[Any, str]]] = {}
    # Legacy names first so the longer, explicit name wins when both are set.
    for name in [*LEGACY_ENV, *names]:
        if name not in env:
            continue
        section, key = LEGACY_ENV.get(name) or names[name]
        tp = _section_fields(section)[key]
        value = _parse_env_value(env[name], tp, name, section, key)
        out.setdefault(section, {})[key] = (value, f"env {name}")
    return out


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc


def resolve(
    toml: Mapping[str, Any],
    toml_path: str,
    env: Mapping[str, str],
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Merge the layers into a validated :class:`Config` (pure: no I/O).

    Every layer is validated, not only the winning one: a wrong type in the file is an error even
    when an env var or a flag overrides that key.
    """

    def checked(section: str, key: str, value: Any, where: str) -> tuple[Any, str]:
        v = _check(value, _section_fields(section)[key], where, f"{section}.{key}")
        _validate_ranges(section, key, v, where)
        return v, where

    layers: dict[str, dict[str, tuple[Any, str]]] = {s: {} for s in SECTIONS}
    for section, table in toml.items():
        if section not in SECTIONS:
            raise ConfigError(f"{toml_path}: unknown section [{_shown(section)}]{did_you_mean(section, SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"{toml_path}: [{_shown(section)}] must be a table")
        fields = _section_fields(section)
        for key, value in table.items():
            if key not in fields:
                hint = did_you_mean(key, fields, prefix=f"{section}.")
                raise ConfigError(f"{toml_path}: unknown key {section}.{_shown(key)}{hint}")
            layers[section][key] = checked(section, key, value, toml_path)
    for section, table in env_overrides(env).items():
        for key, (value, where) in table.items():
            layers[section][key] = checked(section, key, value, where)
    for section, table in (flags or {}).items():
        for key, value in table.items():
            layers[section][key] = checked(section, key, value, "command line")
    built: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        built[section] = cls(**{key: value for key, (value, _) in layers[section].items()})
    return Config(**built)


def did_you_mean(word: object, known: Any, prefix: str = "") -> str:
    """``"; did you mean X?"`` for the closest known name (difflib), or "" when none is close."""
    import difflib

    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(k) for k in known], n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def load(config_path: Path, env: Mapping[str, str], flags: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    return resolve(load_toml(config_path), str(config_path), env, flags)


def claim_visibility_s(cfg: Config) -> float:
    """How long another tool's ``in_progress`` claim on a harvested item holds (docs/DESIGN.md §6.1):
    ``work.claim_visibility_minutes``, else a fire's own length (``fire.max_minutes``), else an hour."""
    minutes = cfg.work.claim_visibility_minutes or cfg.fire.max_minutes or 60
    return minutes * 60


def as_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
