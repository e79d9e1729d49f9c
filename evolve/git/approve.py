"""Reading the repository's own program-valued git keys and approving them (docs/DESIGN.md §8.1).

The shell around :mod:`evolve.git.trust` (which holds the record and the pure review, and starts no
git, since :mod:`evolve.git.run` asks it on every content command): ``doctor`` and the fire
:func:`observe`, ``evolve doctor --trust-git-config`` calls :func:`approve`, ``evolve init``
:func:`record_first`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from evolve.git import pins, trust
from evolve.git.run import git, git_env


def local_keys(repo: Path) -> dict[str, list[str]]:
    """The program-valued keys the repository's own config sets, with their values (one git process)."""
    listing = git(repo, "config", "--show-scope", "-z", "--get-regexp", pins.PATTERN, check=False)
    return pins.local_values(listing)


def refusals(local: Mapping[str, Sequence[str]], roots: Iterable[Path]) -> dict[str, str]:
    """``key -> why`` for each approvable key whose program the agent could rewrite (or none is found)."""
    roots = list(roots)
    path_env = git_env().get("PATH")
    out = {}
    for key, values in local.items():
        if pins.trustable(key):
            why = trust.why_refused(values, roots, path_env)
            if why:
                out[key] = why
    return out


def observe(repo: Path, record: Path, roots: Iterable[Path]) -> trust.Review:
    """The repository's own program-valued keys now, against the record."""
    local = local_keys(repo)
    return trust.review(local, trust.load(record) or {}, refusals(local, roots))


def approve(repo: Path, record: Path, roots: Iterable[Path], by: str) -> trust.Review:
    """Approve every key the repository's own config holds now (those that may be): the record is
    replaced by exactly the returned ``trusted``."""
    local = local_keys(repo)
    refused = refusals(local, roots)
    ok = {k: tuple(v) for k, v in local.items() if pins.trustable(k) and k not in refused}
    trust.write(record, ok, by)
    return trust.review(local, ok, refused)


def record_first(repo: Path, record: Path, roots: Iterable[Path], by: str) -> trust.Review | None:
    """:func:`approve` when evolve has no record for this repository yet (its first look); None otherwise."""
    if record.exists() or record.is_symlink():
        return None
    return approve(repo, record, roots, by)
