"""Git operations the cycle needs, always by explicit path and argv (never ``git add -A``).

Every git process evolve starts goes through :func:`run_git`: hooks, fsmonitor and signing off
unless the operator opts in (``[git] run_hooks``, ``[git] sign``), program-valued keys of the
repository's own config pinned, and an allow-listed environment (:func:`git_env`), because the agent
can write ``.git/hooks`` and ``.git/config`` and evolve holds API keys.

``subprocess`` is imported inside the functions that start git: every command (``evolve status``
too) imports this module for :func:`git_toplevel`, which usually needs no git process.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evolve.childenv import GIT_IDENTITY, child_env
from evolve.errors import ConfigError, UsageError, owner_name

if TYPE_CHECKING:
    import subprocess

NON_SUBSTANTIVE_FILES = ("GOALS.md", "GOALS.yaml", "GOALS.yml")


class GitError(Exception):
    pass


class GitTimeout(GitError):
    """A git command ran past its limit (``[git] timeout_s`` or the fire's budget); its group was killed."""


DEFAULT_TIMEOUT_S = 300.0  # [git] timeout_s; the limit of every git command that names none


@dataclass(frozen=True)
class GitPolicy:
    """What evolve's own git may run: the operator opts in to hooks and signing (``[git]``).

    Either way git gets :func:`git_env`, never evolve's environment.
    """

    run_hooks: bool = False
    sign: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S


SAFE = GitPolicy()

# Variables git needs to find the operator's repository, config and identity; none is a secret.
GIT_ALLOW: tuple[str, ...] = (
    "PATH", "HOME", "LANG", "LC_*", "TZ", "TMPDIR", "XDG_CONFIG_HOME",
    "GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_CEILING_DIRECTORIES", "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM",
    *GIT_IDENTITY,
)
# Signing needs the operator's keyring and agent (opted in with [git] sign).
SIGN_ALLOW: tuple[str, ...] = ("GNUPGHOME", "GPG_TTY", "GPG_AGENT_INFO", "SSH_AUTH_SOCK")
# A push needs the ssh agent (and the operator's ssh command, which also outranks core.sshCommand).
PUSH_ALLOW: tuple[str, ...] = ("SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "GIT_SSH")
# Always on: no repo hooks directory, no fsmonitor daemon, no gpg run by ``git log``, no ext:: transport.
_FIXED = ("core.fsmonitor=false", "log.showSignature=false", "protocol.ext.allow=never", "diff.external=")
# Keys naming a program that the repository's own config (writable by the agent) must not choose.
_PROGRAM_KEYS = re.compile(
    r"^(filter\..+\.(clean|smudge|process)|merge\..+\.driver|diff\..+\.(textconv|command)"
    r"|gpg(\..+)?\.program|gpg\.ssh\.defaultkeycommand|core\.sshcommand|core\.editor|sequence\.editor"
    r"|core\.pager|core\.askpass|core\.hookspath|core\.fsmonitor)$"
)
# What a pinned key falls back to when the operator's config has no value: git's own default
# program (signing and ssh must still work); any other key pinned empty means "no program".
_PROGRAM_DEFAULTS = {"gpg.program": "gpg", "gpg.openpgp.program": "gpg", "gpg.x509.program": "gpgsm",
                     "gpg.ssh.program": "ssh-keygen", "core.sshcommand": "ssh", "core.pager": "cat",
                     "core.editor": "true", "sequence.editor": "true"}
# Subcommands that may read or write work-tree content (filters, merge drivers), sign, or reach a remote.
# A file written into a work tree runs the smudge filter (``worktree add``, ``merge``, ``rebase``,
# ``read-tree -u``); comparing one with the index may run the clean filter (``diff``, ``rm``).
_CONTENT = frozenset({"add", "apply", "checkout", "checkout-index", "cherry-pick", "clean", "commit",
                      "commit-tree", "diff", "diff-files", "diff-index", "ls-files", "merge", "push", "read-tree",
                      "rebase", "reset", "restore", "revert", "rm", "stash", "status", "update-index", "worktree"})


def git_env(policy: GitPolicy = SAFE, *, push: bool = False, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of evolve's own git: an allow-list, so a hook, filter or gpg program gets no secret."""
    extra = (*(SIGN_ALLOW if policy.sign else ()), *(PUSH_ALLOW if push else ()))
    # No prompt (an unattended loop would hang), no pager, no editor.
    return child_env(source, GIT_ALLOW, extra,
                     set_={"GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "GIT_EDITOR": "true"})


def _config_args(policy: GitPolicy) -> list[str]:
    out = [*_FIXED]
    if not policy.run_hooks:
        out.append("core.hooksPath=/dev/null")
    if policy.sign:
        out += ["commit.gpgSign=true"]
    else:
        out += ["commit.gpgSign=false", "tag.gpgSign=false"]
    return [arg for kv in out for arg in ("-c", kv)]


def _repo_program_overrides(repo: Path, env: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """``-c`` pins for program-valued keys set by the repository's own (local/worktree) config.

    The agent can write ``.git/config``: a ``filter.x.clean`` there (with a ``.gitattributes`` line)
    would run on ``git add``. Each such key is pinned to the operator's value from the system or
    global config, or to empty, which git reads as "no program". (Git LFS set up globally still works.)
    """
    proc = _run(["git", "config", "--show-scope", "-z", "--get-regexp", _PROGRAM_KEYS.pattern],
                repo, env, timeout)
    operator: dict[str, str] = {}
    local: set[str] = set()
    fields = proc.stdout.split("\0")
    for scope, rec in zip(fields[0::2], fields[1::2], strict=False):  # -z: scope NUL key LF value NUL
        key, _, value = rec.partition("\n")
        if not key:
            continue
        if scope in ("system", "global"):
            operator[key] = value
        else:  # local, worktree, and anything git adds later: not the operator's to trust
            local.add(key)
    pins = [f"{key}={operator.get(key, _PROGRAM_DEFAULTS.get(key.lower(), ''))}" for key in sorted(local)
            if key.lower() not in ("core.hookspath", "core.fsmonitor")]  # pinned already by _config_args
    return [arg for kv in pins for arg in ("-c", kv)]


def run_git(
    repo: Path,
    *args: str,
    policy: GitPolicy = SAFE,
    extra_env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Every git command evolve runs goes through here (docs/DESIGN.md §8, "What evolve's git runs").

    Hooks and fsmonitor are off unless ``policy.run_hooks``; signing is off unless ``policy.sign``;
    program-valued keys from the repository's own config are pinned; the environment is
    :func:`git_env`. Git runs in its own process group (a hook's children too) under
    ``min(timeout, policy.timeout_s)``, also capped by the running fire's remaining budget
    (:func:`evolve.procgroup.capped`). Raises OSError when git cannot start and GitTimeout (a
    GitError) when the limit passes: the group is killed and the caller's step fails.
    """
    from evolve.procgroup import capped

    limit = capped(min(timeout or policy.timeout_s, policy.timeout_s))
    push = bool(args) and args[0] == "push"
    env = git_env(policy, push=push)
    if extra_env:
        env.update(extra_env)
    pins = _repo_program_overrides(repo, env, limit) if args and args[0] in _CONTENT else []
    argv = ["git", "--no-pager", *_config_args(policy), *pins, *args]
    return _run(argv, repo, env, limit)


def _run(argv: list[str], repo: Path, env: Mapping[str, str], limit: float) -> subprocess.CompletedProcess[str]:
    """One git process in its own group, killed whole (hooks, their children) after ``limit`` seconds."""
    import subprocess

    from evolve.procgroup import kill_group, progressed, spawn

    proc = spawn(argv, cwd=repo, env=env)
    try:
        out, err = proc.communicate(timeout=limit or None)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, grace_s=1.0, reap=proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)  # a child that left the group may still hold the pipes
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise GitTimeout(f"git {_verb(argv)} timed out after {limit:g}s; process group killed") from None
    except BaseException:
        kill_group(proc.pid, grace_s=1.0, reap=proc.poll)  # interrupted: git must not outlive the fire
        raise
    progressed()  # a finished git command is a step of the fire done (the daemon's watchdog)
    # surrogateescape: a path that is not UTF-8 survives the round trip back into an argv.
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode("utf-8", "surrogateescape"),
                                       err.decode("utf-8", "replace"))


def _verb(argv: list[str]) -> str:
    """The subcommand of a git argv (after ``--no-pager`` and the ``-c`` pins), for an error message."""
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "-c" else 1
    return argv[i] if i < len(argv) else "git"


def _identity(repo: Path) -> dict[str, str]:
    """A fallback identity: a repo without one must still be committable by an unattended loop."""
    probe = run_git(repo, "config", "user.email")
    if probe.returncode == 0 and probe.stdout.strip():
        return {}
    env = git_env()
    fallback = {"GIT_AUTHOR_NAME": "evolve", "GIT_AUTHOR_EMAIL": "evolve@localhost",
                "GIT_COMMITTER_NAME": "evolve", "GIT_COMMITTER_EMAIL": "evolve@localhost"}
    return {k: v for k, v in fallback.items() if k not in env}


def git(repo: Path, *args: str, check: bool = True, policy: GitPolicy = SAFE,
        extra_env: Mapping[str, str] | None = None) -> str:
    proc = run_git(repo, *args, policy=policy, extra_env=extra_env)
    if check and proc.returncode != 0:
        raise GitError(f"git {args[0]} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def head(repo: Path) -> str | None:
    proc = run_git(repo, "rev-parse", "--verify", "-q", "HEAD")
    return proc.stdout.strip() or None if proc.returncode == 0 else None


# Variables that change how git finds the repository: with any of them set, git itself decides.
_DISCOVERY_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_CEILING_DIRECTORIES",
                  "GIT_DISCOVERY_ACROSS_FILESYSTEM")

_BARE = re.compile(rb"^\s*bare\s*(?:=(?!\s*false\s*$)|$)", re.M)


def git_toplevel(start: Path, env: Mapping[str, str] | None = None) -> Path:
    """The git top level containing ``start``; a usage error outside a repository.

    Every command starts here, ``evolve status`` and the session-start hook included, so the common
    case (a plain ``.git`` directory we own above ``start``) is found by walking up without starting
    git (~10 ms); anything git might answer differently goes to ``git rev-parse --show-toplevel``.
    """
    env = os.environ if env is None else env
    found = None if any(k in env for k in _DISCOVERY_ENV) else _plain_toplevel(start)
    return found if found is not None else _rev_parse_toplevel(start)


def _plain_toplevel(start: Path) -> Path | None:
    """The nearest ancestor with a plain ``.git`` directory git would accept; None when unsure.

    Unsure means: ``start`` inside a ``.git`` directory, a ``.git`` file (worktree, submodule), a
    repository with ``core.worktree``/``core.bare``, one owned by another user (``safe.directory``), a
    file-system boundary crossed on the way up (git stops there), or no repository at all.
    """
    try:
        here = start.resolve()
        dev = os.stat(here).st_dev
        for d in (here, *here.parents):
            if d.name == ".git" or os.stat(d).st_dev != dev:
                return None
            dot = d / ".git"
            if dot.is_file() or dot.is_symlink():
                return None
            if dot.is_dir():
                return d if _acceptable_git_dir(d, dot) else None
    except (OSError, RuntimeError):
        return None
    return None


def _acceptable_git_dir(top: Path, dot: Path) -> bool:
    if not ((dot / "HEAD").is_file() and (dot / "objects").is_dir() and (dot / "refs").is_dir()):
        return False
    uid = os.geteuid()
    if os.stat(top).st_uid != uid or os.stat(dot).st_uid != uid:
        return False
    try:
        config = (dot / "config").read_bytes().lower()
    except FileNotFoundError:
        config = b""
    # A ``bare`` key with any value but false, or a ``worktree`` anywhere: let git decide.
    return b"worktree" not in config and _BARE.search(config) is None


def _rev_parse_toplevel(start: Path) -> Path:
    try:
        out = run_git(start, "rev-parse", "--show-toplevel")
    except FileNotFoundError as exc:
        raise UsageError("git is not installed; evolve needs it") from exc
    if out.returncode != 0:
        if "dubious ownership" in (out.stderr or "") or "safe.directory" in (out.stderr or ""):
            raise ConfigError(unsafe_repo_text(start, out.stderr or ""))
        raise UsageError(f"{start} is not inside a git repository (use --repo PATH)")
    return Path(out.stdout.strip())


def unsafe_repo_text(start: Path, stderr: str) -> str:
    """git's ``safe.directory`` refusal, said as what it is: whose repository, and the two ways out."""
    import re

    m = re.search(r"repository at '([^']+)'", stderr)
    top = m.group(1) if m else str(start)
    owner = owner_name(Path(top))
    me = owner_name(None)
    return (f"git refuses the repository at {top}: it is owned by {owner} and evolve runs as {me} "
            f"(git's safe.directory check, not a missing repository); run evolve as {owner}, or trust it with "
            f"`git config --global --add safe.directory {top}`")



def is_internal(path: str) -> bool:
    return path == ".agents" or path.startswith(".agents/")


def dirty_paths(repo: Path) -> set[str]:
    """Paths with uncommitted changes or untracked, as git reports them (``-z``: names verbatim)."""
    out = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    paths: set[str] = set()
    parts = out.split("\0")
    i = 0
    while i < len(parts):
        rec = parts[i]
        i += 1
        if len(rec) < 4:
            continue
        status, path = rec[:2], rec[3:]
        paths.add(path)
        if "R" in status or "C" in status:
            if i < len(parts) and parts[i]:
                paths.add(parts[i])  # the rename's source path
            i += 1
    return paths


def changed_since(repo: Path, start: str | None) -> set[str]:
    """Paths that differ between ``start`` and HEAD (commits the agent made itself)."""
    now = head(repo)
    if not start or not now or start == now:
        return set()
    out = git(repo, "diff", "--name-only", "-z", f"{start}..{now}")
    return {p for p in out.split("\0") if p}


def foreign_commits(repo: Path, since: object) -> int:
    """Commits on HEAD after ``since`` that the loop did not make (intervening events, docs/DESIGN.md §5)."""
    if not isinstance(since, str) or not since:
        return 0
    proc = run_git(repo, "log", "--format=%s", f"{since}..HEAD")
    if proc.returncode != 0:
        return 0
    return sum(1 for subject in proc.stdout.splitlines() if not subject.startswith("evolve: "))


def substantive(paths: Iterable[str]) -> list[str]:
    """Paths that count as a real change: outside ``.agents/`` and the GOALS files."""
    return sorted(p for p in paths if not is_internal(p) and p not in NON_SUBSTANTIVE_FILES)


def commit_paths(repo: Path, paths: Iterable[str], message: str, policy: GitPolicy = SAFE) -> str | None:
    """Stage and commit exactly ``paths``; returns the new HEAD (None when nothing was staged).

    ``--no-verify`` even when ``policy.run_hooks``: the gate, not a pre-commit hook, judges a cycle.
    """
    paths = sorted(set(paths))
    if not paths:
        return None
    ident = _identity(repo)
    git(repo, "add", "--", *paths, policy=policy)
    staged = git(repo, "diff", "--cached", "--name-only", "-z", "--", *paths, policy=policy)
    if not staged.strip("\0"):
        return None
    git(repo, "commit", "-q", "--no-verify", "-m", message, "--", *paths, policy=policy, extra_env=ident)
    return head(repo)


def restore_cycle(repo: Path, start: str | None, paths_before: set[str], policy: GitPolicy = SAFE) -> list[str]:
    """Undo what a cycle did: restore the paths it dirtied, then revert its commits.

    Paths that were already dirty before the cycle are the operator's and are left alone. A revert
    that cannot apply is aborted and reported (GitError), never left half-done.
    """
    ident = _identity(repo)
    touched = sorted(p for p in dirty_paths(repo) - paths_before if not is_internal(p))
    tracked = set(git(repo, "ls-files", "-z", "--", *touched).split("\0")) if touched else set()
    for p in touched:
        if p in tracked:
            git(repo, "checkout", "-q", "HEAD", "--", p, policy=policy)
        else:
            target = repo / p
            if target.is_file() or target.is_symlink():
                target.unlink()
    now = head(repo)
    if start and now and now != start:
        try:
            git(repo, "revert", "--no-edit", f"{start}..{now}", policy=policy, extra_env=ident)
        except GitError:
            git(repo, "revert", "--abort", check=False, policy=policy, extra_env=ident)
            raise
    return touched


def commit_message(cycle: int, target: str, result: str, cap: int = 72) -> str:
    """The commit's subject; ``target`` (a work item's title) is redacted before it is capped."""
    from evolve.redact import current  # the sink: git history is pushed and outlives every log

    target = current().text(target)
    if len(target) > cap:
        target = target[: cap - 1] + "…"
    return f"evolve: cycle {cycle} -- {target} {result}"


UNCOMMITTED_REF = "refs/evolve/uncommitted/"


def save_uncommitted(repo: Path, paths: Iterable[str], cycle: int, message: str) -> str:
    """Keep ``paths`` as they are now in a commit on ``HEAD`` under ``refs/evolve/uncommitted/<cycle>``.

    A scratch index (never ``.git/index``, which a stale ``index.lock`` may hold) and no signing:
    this must work exactly when the cycle's own commit could not. Returns the ref; GitError if not.
    """
    import tempfile

    paths = sorted(set(paths))
    ident = _identity(repo)
    with tempfile.TemporaryDirectory(prefix="evolve-save-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **ident}
        base = head(repo)
        if base:
            git(repo, "read-tree", base, extra_env=env)
        git(repo, "add", "-A", "--", *paths, extra_env=env)
        tree = git(repo, "write-tree", extra_env=env).strip()
        parent = ["-p", base] if base else []
        sha = git(repo, "commit-tree", tree, *parent, "-m", message, extra_env=env).strip()
    ref = f"{UNCOMMITTED_REF}{cycle}"
    git(repo, "update-ref", ref, sha)
    return ref


def restore_paths(repo: Path, paths: Iterable[str]) -> None:
    """Put ``paths`` back as they are in HEAD (absent there: removed), through a scratch index.

    The real index is then reset for them, best effort: with a stale ``index.lock`` it cannot be
    written, but then the failed commit never staged anything either.
    """
    import tempfile

    paths = sorted(set(paths))
    base = head(repo)
    with tempfile.TemporaryDirectory(prefix="evolve-restore-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if base:
            git(repo, "read-tree", base, extra_env=env)
        known = set(git(repo, "ls-files", "-z", "--", *paths, extra_env=env).split("\0")) - {""}
        for p in paths:
            if p not in known and ((repo / p).is_file() or (repo / p).is_symlink()):
                (repo / p).unlink()
        if known:
            git(repo, "checkout-index", "-f", "-q", "--", *sorted(known), extra_env=env)
    if base:
        run_git(repo, "reset", "-q", base, "--", *paths)
