"""The repository a command works on, found fast (docs/DESIGN.md §9): usually without starting git.

Every command starts here, ``evolve status`` and the session-start hook included, so this module
imports nothing heavy; git itself is asked only when the plain walk up is unsure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from evolve.errors import ConfigError, UsageError, owner_name

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
    from evolve.git.run import run_git

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
    m = re.search(r"repository at '([^']+)'", stderr)
    top = m.group(1) if m else str(start)
    owner = owner_name(Path(top))
    me = owner_name(None)
    return (f"git refuses the repository at {top}: it is owned by {owner} and evolve runs as {me} "
            f"(git's safe.directory check, not a missing repository); run evolve as {owner}, or trust it with "
            f"`git config --global --add safe.directory {top}`")
