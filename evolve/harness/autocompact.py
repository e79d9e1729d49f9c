"""The harness autocompact threshold: where it is set, whether it is valid, and the settings writer.

``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`` is a *string* ``"1"``..``"100"`` (grammar ``100`` or
``[1-9][0-9]?``: no sign, spaces, decimals or leading zero; a JSON number is invalid). The
detector takes the first source that defines the key: the process env, then
``.claude/settings.local.json``, ``.claude/settings.json``, and the user settings
(``$CLAUDE_CONFIG_DIR/settings.json`` or ``~/.claude/settings.json``); malformed files are skipped.

The writer (``evolve setup``) merges the key, and optionally the two SessionStart hook
registrations, into the repo's ``.claude/settings.json``: it refuses a symlink, malformed JSON, a
non-object top level or a non-object ``env`` (exit 2, the file left byte-identical), keeps every
other key, keeps a valid existing value unless a flag says otherwise, and writes atomically
keeping the file mode, only when something changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from evolve.errors import UsageError

KEY = "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"
DEFAULT = "40"
HARNESS_DEFAULT_PCT = 83  # reported: values above the harness's own threshold are ignored
_VALUE = re.compile(r"100|[1-9][0-9]?")

CONFIGURED, INVALID, ABSENT = "CONFIGURED", "INVALID", "ABSENT"
SRC_ENV = "process env"
SRC_LOCAL = ".claude/settings.local.json"
SRC_PROJECT = ".claude/settings.json"
SRC_USER = "user settings"

NUDGE_OFF = Path(".claude") / "memory" / "autocompact-nudge-off"
HOOK_COMMAND = "evolve hook session-start"
HOOK_MATCHERS = ("startup|resume|clear", "compact")
HOOK_TIMEOUT_S = 10


def valid_value(value: object) -> bool:
    """A string in the grammar ``100`` or ``[1-9][0-9]?`` (``"040"``, ``" 40"``, ``40`` are not)."""
    return isinstance(value, str) and _VALUE.fullmatch(value) is not None


def settings_path(project: Path) -> Path:
    return project / ".claude" / "settings.json"


def local_settings_path(project: Path) -> Path:
    return project / ".claude" / "settings.local.json"


def user_settings_path(env: Mapping[str, str]) -> Path:
    if env.get("CLAUDE_CONFIG_DIR"):
        return Path(env["CLAUDE_CONFIG_DIR"]) / "settings.json"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".claude" / "settings.json"


def nudge_off_marker(project: Path) -> Path:
    return project / NUDGE_OFF


# -- the detector ----------------------------------------------------------------------------


class Detection(NamedTuple):
    """Where the key was found and whether it is valid.

    A NamedTuple rather than a dataclass: ``evolve hook session-start`` imports this module at every
    agent session start, and importing ``dataclasses`` costs it ~5 ms.
    """

    status: str  # CONFIGURED | INVALID | ABSENT
    value: Any = None  # the raw value where it was found (any JSON type from a file)
    source: str = ""  # SRC_* label
    path: Path | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            # A hostile file may hold anything, lone surrogates included: strings are shown escaped.
            "value": self.value
            if not isinstance(self.value, str) or self.value.isprintable()
            else ascii(self.value)[1:-1],
            "source": self.source or None,
            "path": str(self.path) if self.path else None,
        }


def _env_block(path: Path) -> dict[str, Any] | None:
    """The ``env`` object of a settings file; None when missing or malformed (then skipped)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.strip():
        return {}
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None  # malformed or nested too deeply: skipped, like any unreadable source
    if not isinstance(obj, dict):
        return None
    block = obj.get("env", {})
    return block if isinstance(block, dict) else None


def detect(project: Path, env: Mapping[str, str]) -> Detection:
    """The first source that defines the key decides: env > local > project > user."""
    if KEY in env:
        raw = env[KEY]
        return Detection(CONFIGURED if valid_value(raw) else INVALID, raw, SRC_ENV)
    for label, path in (
        (SRC_LOCAL, local_settings_path(project)),
        (SRC_PROJECT, settings_path(project)),
        (SRC_USER, user_settings_path(env)),
    ):
        block = _env_block(path)
        if block is not None and KEY in block:
            raw = block[KEY]
            return Detection(CONFIGURED if valid_value(raw) else INVALID, raw, label, path)
    return Detection(ABSENT)


def show_value(value: Any, cap: int = 40) -> str:
    """A raw value as one short printable token (it may come from a hostile file)."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= cap else text[: cap - 1] + "…"


def status_info(repo: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The autocompact preflight for ``evolve status --json`` and ``evolve doctor`` (advisory only)."""
    env = os.environ if env is None else env
    det = detect(repo, env)
    out = det.as_json()
    out["nudge_off"] = nudge_off_marker(repo).exists()
    out["line"] = preflight_line(det)
    return out


def preflight_line(det: Detection) -> str:
    """One human line; agent runs get the override in their env from ``context.autocompact_pct`` anyway."""
    if det.status == CONFIGURED:
        line = f"autocompact {show_value(det.value)}% (from {det.source})"
        if int(det.value) > HARNESS_DEFAULT_PCT:
            line += f"; above ~{HARNESS_DEFAULT_PCT}% it has no effect"
        return line
    if det.status == INVALID:
        return (
            f"autocompact INVALID: {KEY}={show_value(det.value)} in {det.source} (need a string 1-100); "
            "run `evolve setup`"
        )
    return f"autocompact not configured for interactive sessions ({KEY} absent); run `evolve setup` (default 40%)"


# -- the settings writer -----------------------------------------------------------------------


def load_settings(path: Path) -> dict[str, Any]:
    """The settings object, or a refusal (UsageError, exit 2) that leaves the file untouched."""
    if path.is_symlink():
        raise UsageError(f"{path} is a symlink; refusing to write through it (settings unchanged)")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text; refusing to rewrite it (settings unchanged)") from exc
    if not text.strip():
        return {}
    try:
        obj = json.loads(text)
    except RecursionError as exc:
        raise UsageError(f"{path}: JSON nested too deeply; refusing to rewrite it (settings unchanged)") from exc
    except ValueError as exc:
        raise UsageError(f"{path}: malformed JSON ({exc}); fix it first (settings unchanged)") from exc
    if not isinstance(obj, dict):
        raise UsageError(f"{path}: the top level is not a JSON object (settings unchanged)")
    if "env" in obj and not isinstance(obj["env"], dict):
        raise UsageError(f'{path}: "env" is not a JSON object (settings unchanged)')
    return obj


def merge_hooks(settings: dict[str, Any], command: str = HOOK_COMMAND) -> bool:
    """Add the two SessionStart registrations unless present; existing hooks are kept. Idempotent."""
    hooks = settings.get("hooks", {})
    if not isinstance(hooks, dict):
        raise UsageError('.claude/settings.json: "hooks" is not a JSON object (settings unchanged)')
    entries = hooks.get("SessionStart", [])
    if not isinstance(entries, list):
        raise UsageError('.claude/settings.json: "hooks.SessionStart" is not a list (settings unchanged)')

    def registered(matcher: str) -> bool:
        for e in entries:
            if (
                isinstance(e, dict)
                and e.get("matcher") == matcher
                and isinstance(e.get("hooks"), list)
                and any(isinstance(h, dict) and h.get("command") == command for h in e["hooks"])
            ):
                return True
        return False

    missing = [m for m in HOOK_MATCHERS if not registered(m)]
    if not missing:
        return False
    hook = {"type": "command", "command": command, "timeout": HOOK_TIMEOUT_S}
    entries = [*entries, *({"matcher": m, "hooks": [dict(hook)]} for m in missing)]
    settings["hooks"] = {**hooks, "SessionStart": entries}
    return True


def render(settings: dict[str, Any]) -> bytes:
    """``indent=2`` plus a trailing newline; key order kept (the original formatting is not)."""
    try:
        return (json.dumps(settings, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escaped in the input: keep it escaped
        return (json.dumps(settings, indent=2, ensure_ascii=True) + "\n").encode("utf-8")


class SetupResult:
    """What ``evolve setup`` did (a plain class for the reason given at :class:`Detection`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.wrote = False
        self.value: str | None = None
        self.messages: list[str] = []
        self.warnings: list[str] = []


Ask = Callable[[str], str]


def check_pct(value: str | None) -> None:
    if value is not None and not valid_value(value):
        raise UsageError(
            f"--autocompact-pct {show_value(value)}: need an integer 1-100 written plainly (e.g. 40; no leading zero)"
        )


def setup(
    project: Path,
    env: Mapping[str, str],
    *,
    pct: str | None = None,
    no_autocompact: bool = False,
    hooks: bool = False,
    ask: Ask | None = None,
) -> SetupResult:
    """``evolve setup``: validate everything first, then one atomic write (or none)."""
    from evolve.store.atomic import atomic_write_bytes

    check_pct(pct)
    if no_autocompact and pct is not None:
        raise UsageError("--no-autocompact and --autocompact-pct contradict each other")
    path = settings_path(project)
    result = SetupResult(path)
    if no_autocompact and not hooks:
        _nudge_off(project, result)
        return result
    settings = load_settings(path)
    changed = False
    if not no_autocompact:
        changed = _set_value(project, env, settings, pct, ask, result)
    if hooks:
        if merge_hooks(settings):
            changed = True
            result.messages.append(f"registered the SessionStart hooks ({' and '.join(HOOK_MATCHERS)}) in {path}")
        else:
            result.messages.append(f"SessionStart hooks already registered in {path}")
    if changed:
        # Keeps the file's mode, owner and group; a linked .claude/ is refused (UnsafePathError).
        atomic_write_bytes(path, render(settings))
        result.wrote = True
    if no_autocompact:
        _nudge_off(project, result)
    return result


def _nudge_off(project: Path, result: SetupResult) -> None:
    marker = nudge_off_marker(project)
    from evolve.store.dirfd import open_file

    os.close(open_file(marker, os.O_WRONLY | os.O_CREAT))  # touch, without following a link
    result.messages.append(f"created {marker}: the autocompact nudge is silenced; {KEY} left as it was")


def _set_value(
    project: Path,
    env: Mapping[str, str],
    settings: dict[str, Any],
    pct: str | None,
    ask: Ask | None,
    result: SetupResult,
) -> bool:
    block = settings.get("env", {})
    present = KEY in block
    existing = block.get(KEY)
    default = existing if valid_value(existing) else DEFAULT
    if pct is not None:
        final = pct
    elif ask is not None:
        try:
            answer = ask(f"{KEY} (autocompact at this % of the context window) [{default}]: ").strip()
        except EOFError as exc:
            raise UsageError("no input available; pass --yes or --autocompact-pct") from exc
        if answer and not valid_value(answer):
            raise UsageError(f"{show_value(answer)}: need an integer 1-100 written plainly (settings unchanged)")
        final = answer or default
    else:
        final = default
    result.value = final
    if present and existing == final:
        result.messages.append(f'kept existing {KEY}="{final}" in {result.path}')
        changed = False
    else:
        if present and not valid_value(existing):
            result.messages.append(f'replaced invalid value {show_value(existing)} with "{final}" in {result.path}')
        elif present:
            result.messages.append(f'changed {KEY} from "{existing}" to "{final}" in {result.path}')
        else:
            result.messages.append(f'set {KEY}="{final}" in {result.path}')
        settings["env"] = {**block, KEY: final}
        changed = True
    if int(final) > HARNESS_DEFAULT_PCT:
        result.warnings.append(
            f"{final}% is above the harness default (~{HARNESS_DEFAULT_PCT}%): values above it are ignored, "
            "so this does not make compaction later"
        )
    shadow = detect(project, env)
    if shadow.source in (SRC_ENV, SRC_LOCAL):
        where = "the process environment" if shadow.source == SRC_ENV else str(local_settings_path(project))
        result.warnings.append(
            f"{KEY} is also set in {where} ({show_value(shadow.value)}), which takes precedence: "
            f"the value in {SRC_PROJECT} will not take effect until that entry is removed"
        )
    return changed
