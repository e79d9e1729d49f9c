"""The Codex and Gemini CLIs' own compaction settings: where each is set, and ``evolve setup``'s writer.

Claude Code's threshold is :mod:`evolve.harness.autocompact`. The other two expose:

- Codex: ``model_auto_compact_token_limit`` (a token count) in ``$CODEX_HOME/config.toml``. The
  codex runner passes ``-c model_auto_compact_token_limit=<N>`` itself when ``[context]
  context_window`` is set (N = that window x ``[context] autocompact_pct``), so nothing is written;
  setup reports what the config file says.
- Gemini: ``model.compressionThreshold`` (a fraction of the window, 0.5 by default) in the settings.
  The CLI has no flag or variable for it, and the agent runs in evolve's worktree, which carries
  only committed files, so setup writes it into the user settings of the account evolve runs as
  (``$GEMINI_CLI_HOME`` or ``$HOME``, ``.gemini/settings.json``): merged, other keys kept, a
  malformed file or non-object refused (left byte-identical), written atomically only on change.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.errors import UsageError

GEMINI_KEY = "model.compressionThreshold"
CODEX_KEY = "model_auto_compact_token_limit"


@dataclass
class Detected:
    value: Any  # None when the key is not set
    source: str


@dataclass
class CompactionSetup:
    messages: list[str] = field(default_factory=list)
    wrote: bool = False


def codex_setting(env: Mapping[str, str]) -> Detected:
    home = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else Path(env.get("HOME") or Path.home()) / ".codex"
    path = home / "config.toml"
    try:
        with open(path, "rb") as fh:
            value = tomllib.load(fh).get(CODEX_KEY)
    except (OSError, tomllib.TOMLDecodeError):
        value = None
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return Detected(value if ok else None, str(path))


def gemini_settings_path(env: Mapping[str, str]) -> Path:
    return Path(env.get("GEMINI_CLI_HOME") or env.get("HOME") or str(Path.home())) / ".gemini" / "settings.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); fix it by hand, evolve leaves it as it is") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("model", {}), dict):
        raise UsageError(f"{path}: the top level (and its \"model\") must be JSON objects; left as it is")
    return obj


def gemini_setting(env: Mapping[str, str]) -> Detected:
    path = gemini_settings_path(env)
    try:
        value = _load(path).get("model", {}).get("compressionThreshold")
    except UsageError:
        value = None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1
    return Detected(value if ok else None, str(path))


def setup(runner: str, env: Mapping[str, str], *, pct: int, keep: bool, context_window: int) -> CompactionSetup:
    """Report (codex) or set (gemini) the CLI's own compaction threshold; ``keep`` leaves a valid one."""
    out = CompactionSetup()
    if runner == "codex":
        got = codex_setting(env)
        if context_window:
            out.messages.append(f"codex: the runner passes -c {CODEX_KEY}={context_window * pct // 100} "
                                f"({pct}% of [context] context_window = {context_window})")
        elif got.value is not None:
            out.messages.append(f"codex: {CODEX_KEY} = {got.value} in {got.source}")
        else:
            out.messages.append(f"codex: {CODEX_KEY} not set in {got.source}: the CLI compacts at its own "
                                "default; set [context] context_window to have evolve pass one")
        return out
    got = gemini_setting(env)
    path = Path(got.source)
    if got.value is not None and keep:
        out.messages.append(f"gemini: {GEMINI_KEY} = {got.value:g} in {path} (kept)")
        return out
    settings = _load(path)
    want = round(pct / 100, 2)
    if settings.get("model", {}).get("compressionThreshold") == want:
        out.messages.append(f"gemini: {GEMINI_KEY} = {want:g} in {path} (already)")
        return out
    settings.setdefault("model", {})["compressionThreshold"] = want
    # The operator's own home (which may sit behind a link, unlike evolve's directories): a plain
    # temp file and rename, so the CLI never reads a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".evolve-tmp")
    tmp.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    out.wrote = True
    out.messages.append(f"gemini: set {GEMINI_KEY} = {want:g} in {path}")
    return out
