"""Whose configuration it is, and what the operator trusted (docs/DESIGN.md §8.5.1 *The repository's config
and agent settings*).

A ``.agents/evolve/config.toml`` that git tracks in the operator's checkout is the repository's: whoever can
push chooses its gate, notify and governor commands, its ``pass_env`` lists and its push remote. Its content is
used only once the operator has trusted exactly those bytes (``evolve trust``: the sha256 recorded in
``config-trust.json``, :attr:`evolve.paths.Paths.config_trust`, with who and when); a change needs trust again.
An untracked one (``evolve init``, the Kubernetes init container) is the operator's, as always.

The same record holds the hashes of the repository's agent settings (``.claude/settings.json`` and the
Codex and Gemini equivalents, :data:`AGENT_SETTINGS`): :mod:`evolve.agent.settings` decides what reaches the
agent's run.

The layers, lowest first (each a TOML file checked on its own, then merged key by key)::

    built-in defaults
    .agents/evolve/config.toml, when git tracks it (the repository's): only when trusted
    $XDG_CONFIG_HOME/evolve/config.toml (the operator's, every repository)
    .agents/evolve/config.toml, when git does not track it (the operator's, this repository)
    --config PATH / $EVOLVE_CONFIG (the operator's, this command)
    EVOLVE_<SECTION>_<KEY> variables
    command-line flags

so the operator's files override the repository's, and among the operator's the narrower wins. Every read and
write of the record is here. Light imports: ``evolve status`` loads its config through :func:`load`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve import config as configmod
from evolve.errors import ConfigError
from evolve.paths import Paths

VERSION = 1
CONFIG_ENV = "EVOLVE_CONFIG"  # what --config sets for the command (and a unit may set itself)
CONFIG = "config"
AGENT = "agent-settings"
# The files of the agents' own settings a repository may commit, which their pinned CLIs load from the project
# (checked against each: docs/DESIGN.md §8.5). Gemini under --skip-trust leaves .gemini/settings.json out but
# reads the project's .env files into its environment.
CLAUDE_FILES: tuple[str, ...] = (".claude/settings.json", ".claude/settings.local.json", ".mcp.json")
CODEX_FILES: tuple[str, ...] = (".codex/config.toml",)
GEMINI_FILES: tuple[str, ...] = (".gemini/.env", ".env")
AGENT_SETTINGS: tuple[str, ...] = (*CLAUDE_FILES, *CODEX_FILES, *GEMINI_FILES)
# What a config names that runs or widens what evolve passes: shown first by `evolve trust`.
SENSITIVE: frozenset[tuple[str, str]] = frozenset({
    ("agent", "runner"), ("agent", "argv"), ("agent", "base_url"), ("agent", "api_key_env"), ("agent", "pass_env"),
    ("agent", "permission_mode"), ("agent", "allowed_tools"),
    ("work", "beads_command"), ("work", "generators"), ("work", "pass_env"),
    ("gate", "commands"), ("gate", "pass_env"),
    ("git", "push"), ("git", "run_hooks"), ("git", "sign"), ("git", "isolation"), ("git", "worktree_dir"),
    ("land", "remote"),
    ("workspace", "setup"), ("workspace", "link"), ("workspace", "copy"), ("workspace", "path"),
    ("workspace", "pass_env"),
    ("halt", "governor_cmd"), ("halt", "pass_env"),
    ("notify", "command"), ("notify", "pass_env"),
    ("metrics", "textfile_dir"),
})


def sha256_of(path: Path) -> str | None:
    """The sha256 of the file's bytes; None when there is no regular file (a link is followed: the CLI would)."""
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def rel_in(repo: Path, path: Path) -> list[str]:
    """``path`` relative to ``repo``, as written and as resolved (a committed link to a tracked directory), or []."""
    out: list[str] = []
    for base, p in ((os.path.abspath(repo), os.path.abspath(path)), (os.path.realpath(repo), os.path.realpath(path))):
        if p.startswith(base.rstrip("/") + "/"):
            rel = p[len(base.rstrip("/")) + 1:]
            if rel not in out:
                out.append(rel)
    return out


def tracked(repo: Path, rels: Iterable[str]) -> set[str]:
    """Which of ``rels`` git tracks in ``repo``'s index (staged counts). When git cannot answer, all of them:
    an unknown owner is not the operator."""
    from evolve.git.run import GitError, run_git

    rels = [r for r in rels if r]
    if not rels or _surely_untracked(repo, rels):
        return set()
    try:
        proc = run_git(repo, "ls-files", "-z", "--", *rels, extra_env={"GIT_LITERAL_PATHSPECS": "1"})
    except (GitError, OSError):
        return set(rels)
    if proc.returncode != 0:
        return set(rels)
    listed = {p for p in proc.stdout.split("\0") if p}
    return {r for r in rels if r in listed}


def _surely_untracked(repo: Path, rels: list[str]) -> bool:
    """None of ``rels`` is in the index, read without git (``evolve status`` starts none when nothing is tracked).

    An index of version 2 or 3 holds every entry's full path followed by a NUL; when none of those bytes is in
    it, none is tracked. Anything else (version 4's compressed paths, a split index, a worktree's index kept
    elsewhere, a read error) is not sure: git is asked."""
    dot = repo / ".git"
    try:
        if not dot.is_dir() or any(p.name.startswith("sharedindex.") for p in dot.iterdir()):
            return False
        data = (dot / "index").read_bytes()
    except FileNotFoundError:
        return (dot / "HEAD").is_file()  # no index yet: nothing is tracked
    except OSError:
        return False
    if data[:4] != b"DIRC" or int.from_bytes(data[4:8], "big") not in (2, 3):
        return False
    return not any(r.encode("utf-8", "surrogateescape") + b"\0" in data for r in rels)


# -- the record ------------------------------------------------------------------------------


def read_record(path: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {sha256, kind, trusted_by, trusted_at}}``; a missing, torn or foreign record trusts nothing."""
    from evolve.store.atomic import read_json

    obj = read_json(path)
    files = obj.get("files") if isinstance(obj, dict) and obj.get("version") == VERSION else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items()
            if isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("sha256"), str)}


def write_record(path: Path, files: Mapping[str, Mapping[str, Any]]) -> None:
    from evolve.store.atomic import write_json
    from evolve.store.dirfd import ensure_dir

    ensure_dir(path.parent)
    write_json(path, {"version": VERSION, "files": {k: dict(v) for k, v in sorted(files.items())}})


def who() -> str:
    """The operator as the record names them: ``user@host``."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{os.uname().nodename}"


# -- a repository-owned file -----------------------------------------------------------------


@dataclass(frozen=True)
class Owned:
    """A file the repository owns (git tracks it) and the operator's verdict on its bytes (pure data)."""

    rel: str  # relative to the repository
    kind: str  # CONFIG | AGENT
    sha256: str | None  # None: the file is gone
    trusted_sha256: str | None  # what the operator trusted for this path, or None

    @property
    def trusted(self) -> bool:
        return self.sha256 is not None and self.sha256 == self.trusted_sha256

    def why(self) -> str:
        """One line: why it is not trusted ("" when it is)."""
        if self.trusted:
            return ""
        if self.trusted_sha256 is None:
            return f"the repository's {self.rel} (tracked in git) is not trusted: review it, then `evolve trust`"
        return (f"the repository's {self.rel} (tracked in git) changed since you trusted it "
                f"(sha256 {self.trusted_sha256[:12]}, now {(self.sha256 or 'gone')[:12]}): review it, then "
                "`evolve trust`")


def verdict(rel: str, kind: str, sha: str | None, record: Mapping[str, Mapping[str, Any]]) -> Owned:
    """The operator's verdict on one repository-owned file (pure)."""
    got = record.get(rel)
    trusted = got.get("sha256") if isinstance(got, Mapping) and got.get("kind", kind) == kind else None
    return Owned(rel=rel, kind=kind, sha256=sha, trusted_sha256=trusted if isinstance(trusted, str) else None)


def repo_config(paths: Paths) -> Owned | None:
    """The repository's config when git tracks it in the operator's checkout, with the verdict; None when the
    config is the operator's (untracked, outside the repository, or absent)."""
    path = paths.config
    if not os.path.isfile(path):
        return None
    rels = rel_in(paths.repo, path)
    if not rels:
        return None  # EVOLVE_DIR outside the repository: the operator's
    key = _memo_key(paths)
    if key is not None and key in _MEMO:
        return _MEMO[key]
    hit = tracked(paths.repo, rels)
    got = verdict(rels[0], CONFIG, sha256_of(path), read_record(paths.config_trust)) if hit else None
    if key is not None:
        _MEMO.clear()
        _MEMO[key] = got
    return got


_MEMO: dict[tuple[object, ...], Owned | None] = {}  # one answer per state of the file, the index and the record


def _memo_key(paths: Paths) -> tuple[object, ...] | None:
    """What :func:`repo_config`'s answer depends on (``status`` asks twice): the config's, the index's and the
    record's stat; None (no memo) for a checkout whose index is not at ``.git/index``."""
    def st(p: Path) -> tuple[int, int, int] | None:
        try:
            s = os.stat(p)
        except OSError:
            return None
        return (s.st_ino, s.st_size, s.st_mtime_ns)

    index = st(paths.repo / ".git" / "index")
    if index is None:
        return None
    return (str(paths.config), str(paths.repo), st(paths.config), index, str(paths.config_trust),
            st(paths.config_trust))


def agent_settings(paths: Paths, tree: Path | None = None) -> list[Owned]:
    """The repository's agent settings files (:data:`AGENT_SETTINGS`) present in ``tree`` (default: the
    operator's checkout) that git tracks there, each with the verdict against the operator's record."""
    tree = paths.repo if tree is None else tree
    present = [rel for rel in AGENT_SETTINGS if os.path.isfile(tree / rel)]
    if not present:
        return []
    record = read_record(paths.config_trust)
    hit = tracked(tree, present)
    return [verdict(rel, AGENT, sha256_of(tree / rel), record) for rel in present if rel in hit]


def owned_files(paths: Paths) -> list[Owned]:
    """Everything of the repository's that needs the operator's trust: the config, then the agent settings."""
    cfg = repo_config(paths)
    return ([cfg] if cfg is not None else []) + agent_settings(paths)


def trust(paths: Paths, files: Iterable[Owned]) -> dict[str, dict[str, Any]]:
    """Record the current bytes of ``files`` as trusted (``evolve trust``); returns the new record."""
    from evolve.timeutil import utc_iso

    record = read_record(paths.config_trust)
    by, at = who(), utc_iso()
    for f in files:
        if f.sha256 is None:
            record.pop(f.rel, None)
            continue
        record[f.rel] = {"sha256": f.sha256, "kind": f.kind, "trusted_by": by, "trusted_at": at}
    write_record(paths.config_trust, record)
    return record


def revoke(paths: Paths) -> list[str]:
    """Forget every trusted hash of this repository (``evolve trust --revoke``); the paths forgotten."""
    record = read_record(paths.config_trust)
    if paths.config_trust.exists():
        write_record(paths.config_trust, {})
    return sorted(record)


# -- the layers ------------------------------------------------------------------------------


def user_config_path(env: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/evolve/config.toml`` (``~/.config/evolve/config.toml`` without XDG)."""
    xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(xdg) / "evolve" / "config.toml"


@dataclass(frozen=True)
class Loaded:
    """The config a command runs with, the layers it came from, and the repository's config's verdict."""

    cfg: configmod.Config
    layers: tuple[str, ...] = ()  # the files applied, lowest first
    repo: Owned | None = None  # the config when it is the repository's (tracked in git)
    ignored: tuple[str, ...] = field(default_factory=tuple)  # files found but not applied (untrusted)

    @property
    def refusal(self) -> str | None:
        """Why a fire may not start: the repository's config is not trusted (one line), or None."""
        return self.repo.why() if self.repo is not None and not self.repo.trusted else None


def merge(tables: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """TOML tables merged key by key, later ones winning (pure; a list value is replaced whole)."""
    out: dict[str, Any] = {}
    for t in tables:
        for section, table in t.items():
            if isinstance(table, dict) and isinstance(out.get(section), dict):
                out[section] = {**out[section], **table}
            else:
                out[section] = table
    return out


def load(paths: Paths, env: Mapping[str, str], flags: Mapping[str, Mapping[str, Any]] | None = None) -> Loaded:
    """The layered config (module docstring). Each file is checked on its own first, so an error names its file;
    an untrusted repository config is checked too but not applied (a fire refuses: :attr:`Loaded.refusal`)."""
    owned = repo_config(paths)
    user = user_config_path(env)
    explicit = env.get(CONFIG_ENV) or ""
    if explicit and not os.path.isfile(explicit):
        raise ConfigError(f"--config {explicit}: no such file")
    files: list[tuple[Path, bool]] = []  # (path, applied)
    if owned is not None:
        files.append((paths.config, owned.trusted))
    if user.is_file():
        files.append((user, True))
    if owned is None and paths.config.is_file():
        files.append((paths.config, True))
    if explicit:
        files.append((Path(explicit), True))
    tables = []
    for path, applied in files:
        table = configmod.load_toml(path)
        configmod.resolve(table, str(path), {})  # its own errors, named by its own path
        if applied:
            tables.append(table)
    applied_files = tuple(str(p) for p, a in files if a)
    where = applied_files[-1] if len(applied_files) == 1 else " + ".join(applied_files) or str(paths.config)
    cfg = configmod.resolve(merge(tables), where, env, flags)
    return Loaded(cfg=cfg, layers=applied_files, repo=owned, ignored=tuple(str(p) for p, a in files if not a))


def load_cfg(paths: Paths, env: Mapping[str, str], flags: Mapping[str, Mapping[str, Any]] | None = None
             ) -> configmod.Config:
    """:func:`load`'s config alone, for a command that runs nothing of the repository's (status, report)."""
    return load(paths, env, flags).cfg


def load_for_fire(paths: Paths, env: Mapping[str, str], flags: Mapping[str, Mapping[str, Any]] | None = None,
                  on_refusal: Any = None) -> configmod.Config:
    """The config a fire runs with; a ConfigError (exit 78, one line) before anything runs or is claimed when
    the repository's config is not trusted: none of its commands may run, and a subset would be a surprise.
    ``on_refusal(cfg, why)`` first hears of it, with the operator's layers only (their notify command)."""
    loaded = load(paths, env, flags)
    if loaded.refusal:
        if on_refusal is not None:
            on_refusal(loaded.cfg, loaded.refusal)
        raise ConfigError(loaded.refusal)
    return loaded.cfg


def show(path: Path, kind: str, cap: int = 200) -> list[str]:
    """What ``evolve trust`` prints for a file: what runs or widens first, then the other keys (redacted)."""
    from evolve import redact

    r = redact.current()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return [f"  (cannot read: {exc})"]
    if path.name == ".env":  # names only: the values are the repository's, and may be secrets
        names = [ln.split("=", 1)[0].strip().removeprefix("export ").strip()
                 for ln in raw.decode("utf-8", "replace").splitlines() if "=" in ln and not ln.lstrip().startswith("#")]
        return [r.text(f"  ! env {n}") for n in names if n]
    if path.suffix == ".toml":
        import tomllib

        try:
            obj: Any = tomllib.loads(raw.decode("utf-8", "replace"))
        except tomllib.TOMLDecodeError as exc:
            return [f"  (not valid TOML: {exc})"]
    else:
        import json

        try:
            obj = json.loads(raw)
        except ValueError as exc:
            return [f"  (not valid JSON: {exc})"]
    flat = list(_flatten(obj, ""))
    if kind == CONFIG:
        first = [(k, v) for k, v in flat if tuple(k.split(".", 1)[:2]) in SENSITIVE]
    else:
        first = [(k, v) for k, v in flat if k.split(".")[0].split("[")[0] in _AGENT_SENSITIVE]
    rest = [(k, v) for k, v in flat if (k, v) not in first]
    import json as _json

    def line(k: str, v: Any, mark: str) -> str:
        text = _json.dumps(v, ensure_ascii=False)
        text = text if len(text) <= cap else text[: cap - 1] + "…"
        return r.text(f"  {mark} {k} = {text}")

    return [line(k, v, "!") for k, v in first] + [line(k, v, " ") for k, v in rest]


# Agent settings keys that run programs, set the agent's environment or credentials, or widen its permissions.
_AGENT_SENSITIVE = frozenset({
    "hooks", "env", "apiKeyHelper", "awsCredentialExport", "awsAuthRefresh", "gcpAuthRefresh", "otelHeadersHelper",
    "permissions", "mcpServers", "enableAllProjectMcpServers", "enabledMcpjsonServers", "enabledPlugins",
    "extraKnownMarketplaces", "statusLine", "forceLoginMethod", "model_provider", "model_providers", "mcp_servers",
    "shell_environment_policy", "notify", "sandbox_mode", "approval_policy", "sandbox", "tools", "security",
    "advanced", "profiles",
})


def _flatten(obj: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix or "(top level)", obj
