"""The operator's program-valued keys in the repository's own git config (docs/DESIGN.md §8.1).

evolve's git pins every program a repository's ``.git/config`` names (:mod:`evolve.git.pins`), since
the agent can write that file. But git-crypt and ``git lfs install --local`` are set up exactly
there, by the operator. So evolve keeps a record of the ones that are the operator's: key and
values, one file in the state directory (``git-trust.json``, :attr:`evolve.paths.Paths.git_trust`).

- ``evolve init`` records what the repository's config holds when evolve first sees it (the record
  is written once, even empty: a key that appears after that was not there at set-up);
- ``evolve doctor --trust-git-config`` shows exactly what it approves and replaces the record with it.

A key whose values in the repository's config are exactly the recorded ones is not pinned; a key
that appears or changes afterwards (possibly the agent's) stays pinned until approved, and
``status`` and ``doctor`` name it. A value whose program lies inside the repository, its git
directory or evolve's state directory is never approved: the agent can rewrite it.

The record lives with the operator's other records (:mod:`evolve.trusted`), out of the worktree and
the state directory the agent works in; one an older evolve kept in the state directory is moved
there once (:func:`adopt_legacy`). Every read and write of it is here.

Whose record applies to a git process: a shell that knows its paths (the fire, ``doctor``) hands
:func:`register` the record for the repository's git directory, and
:func:`evolve.git.run.run_git` asks :func:`trusted_for` about the directory it runs in (any of the
repository's work trees); nothing registered, nothing trusted. This module starts no git (``run``
asks it on every content command); reading and approving what the repository holds is
:mod:`evolve.git.approve`.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evolve.git import pins

VERSION = 1
_RECORDS: dict[Path, Path] = {}  # a repository's git common dir -> the trust record for it


@dataclass(frozen=True)
class Review:
    """The repository's own program-valued keys against the record (pure: :func:`review`)."""

    trusted: dict[str, tuple[str, ...]] = field(default_factory=dict)  # run by evolve's git
    unapproved: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pinned until approved
    refused: dict[str, str] = field(default_factory=dict)  # key -> why it can never be approved


def review(local: Mapping[str, Sequence[str]], recorded: Mapping[str, Sequence[str]],
           refused: Mapping[str, str] | None = None) -> Review:
    """Sort the repository's own keys (pure). Keys nobody may approve (editors, hooks) are left out:
    they are pinned silently, as always."""
    out = Review()
    runs = pins.approved_keys(local, recorded)
    for key, values in sorted(local.items()):
        if not pins.trustable(key):
            continue
        if refused and key in refused:
            out.refused[key] = refused[key]
        elif key in runs:
            out.trusted[key] = tuple(values)
        else:
            out.unapproved[key] = tuple(values)
    return out


def words_of(value: str) -> list[str] | None:
    """A key's value as the shell splits it (pure); None if unreadable."""
    try:
        return shlex.split(value)
    except ValueError:
        return None


def why_refused(values: Sequence[str], roots: Iterable[Path], path_env: str | None) -> str | None:
    """Why these values can never be approved, or None: each must name a program found outside ``roots``
    (the repository, its git directory, the state directory), which the agent cannot rewrite, and no
    file inside them as an argument (``python3 tools/clean.py``)."""
    resolved_roots = [Path(os.path.realpath(r)) for r in roots]

    def inside(path: str) -> Path | None:
        real = Path(os.path.realpath(path))
        return next((r for r in resolved_roots if real == r or r in real.parents), None)

    for value in values:
        words = words_of(value)
        if not words:
            return f"cannot tell which program {value!r} runs"
        prog, args = words[0], words[1:]
        for word in (prog, *args):
            if "/" in word and not os.path.isabs(word) and "://" not in word:
                return f"{word} is relative to the work tree, which the agent edits"
        found = prog if os.path.isabs(prog) else shutil.which(prog, path=path_env)
        if found is None or not os.path.isfile(found):
            return f"{prog} is not found (install it, then approve)"
        for word in (found, *(a for a in args if os.path.isabs(a))):
            root = inside(word)
            if root is not None:
                return f"{os.path.realpath(word)} is inside {root}, which the agent can write"
    return None


# -- the record ------------------------------------------------------------------------------


def load(record: Path) -> dict[str, tuple[str, ...]] | None:
    """The approved keys, or None when there is no record (a torn or foreign file trusts nothing)."""
    from evolve.store.atomic import read_json

    if not record.exists():
        return None
    obj = read_json(record)
    keys = obj.get("keys") if isinstance(obj, dict) else None
    if not isinstance(keys, dict):
        return {}
    return {k: tuple(v) for k, v in keys.items()
            if isinstance(k, str) and pins.trustable(k) and isinstance(v, list) and all(isinstance(x, str) for x in v)}


def adopt_legacy(record: Path, legacy: Path) -> bool:
    """Move a record an older evolve kept in the state directory to ``record``, once (True when moved).
    It was written by ``evolve init`` or ``doctor --trust-git-config``; the agent could have edited it, but
    it is the only record the operator has, and a key it approves is still checked by :func:`why_refused`."""
    if record.exists() or not legacy.is_file() or legacy.is_symlink():
        return False
    from evolve.store.atomic import atomic_write_bytes
    from evolve.store.dirfd import ensure_dir

    ensure_dir(record.parent)
    atomic_write_bytes(record, legacy.read_bytes())
    legacy.unlink()
    return True


def write(record: Path, keys: Mapping[str, Sequence[str]], by: str) -> None:
    from evolve.store.atomic import write_json
    from evolve.store.dirfd import ensure_dir
    from evolve.timeutil import utc_iso

    ensure_dir(record.parent)
    write_json(record, {"version": VERSION, "approved_by": by, "approved_at": utc_iso(),
                        "keys": {k: list(v) for k, v in sorted(keys.items())}})


# -- whose record a git process uses ---------------------------------------------------------


def common_dir(start: Path) -> Path | None:
    """The git common directory of the repository ``start`` is in, found without starting git
    (a ``.git`` directory, or a worktree's ``.git`` file and its ``commondir``); None when unsure."""
    try:
        here = Path(os.path.abspath(start))
        for d in (here, *here.parents):
            dot = d / ".git"
            if dot.is_dir():
                gitdir = dot
            elif dot.is_file():
                text = dot.read_text(encoding="utf-8", errors="replace").strip()
                if not text.startswith("gitdir:"):
                    return None
                gitdir = Path(os.path.normpath(d / text[len("gitdir:"):].strip()))
            else:
                continue
            link = gitdir / "commondir"
            if link.is_file():
                gitdir = gitdir / link.read_text(encoding="utf-8", errors="replace").strip()
            return Path(os.path.realpath(gitdir))
    except OSError:
        return None
    return None


def register(repo: Path, record: Path) -> None:
    """From now on evolve's git in any work tree of ``repo`` runs the keys ``record`` approves."""
    found = common_dir(repo)
    if found is not None:
        _RECORDS[found] = record


def trusted_for(cwd: Path) -> dict[str, tuple[str, ...]]:
    """The approved keys for git running in ``cwd`` (read afresh: an approval counts at once)."""
    if not _RECORDS:
        return {}
    found = common_dir(cwd)
    record = _RECORDS.get(found) if found is not None else None
    return (load(record) or {}) if record is not None else {}


def roots_of(repo: Path, evolve_dir: Path, *more: Path) -> list[Path]:
    """What the agent can write: the repository, its git directory, the state directory (and the worktree)."""
    found = common_dir(repo)
    return [repo, evolve_dir, *more, *([found] if found is not None else [])]
