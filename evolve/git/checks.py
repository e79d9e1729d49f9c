"""The scripts the gate runs and the GOALS checks: a chain that changes one waits for the operator (§8.5).

The gate judges the agent's work by running commands; a GOALS file's checks measure it. A chain that
rewrites one of them (``check.sh`` that a ``[gate]`` command names, a GOALS check command) was judged
by its own rules: it is held pending (``refs/evolve/pending/``, with the reason) until the operator
has looked and trusted that content (``evolve trust``), which records the file's blob in
``checks-trust.json`` among the operator's records (:mod:`evolve.trusted`). Pure but for the reads.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evolve.git.run import git, run_git

GOALS_FILES = ("GOALS.md", "GOALS.yaml", "GOALS.yml")  # evolve.work.goals.model.GOALS_FILES, without its imports


@dataclass(frozen=True)
class Checks:
    """What a chain may not change without the operator: the files the gate commands name, the GOALS files."""

    scripts: frozenset[str] = frozenset()
    trusted: Mapping[str, str] = field(default_factory=dict)  # path -> the blob the operator trusted
    # A GOALS file's bytes -> its check commands (None: unreadable); the work layer's parser, handed down.
    goal_checks: Callable[[str, bytes], tuple[str, ...] | None] | None = None


def named_paths(commands: Iterable[Sequence[str]]) -> frozenset[str]:
    """Every word of the gate's argv lists that could name a file in the repository (pure): ``./check.sh``,
    ``scripts/gate.py`` in ``python scripts/gate.py``. Only what a command names directly: what ``make``
    reads, or what a script imports, is the repository's code like any other."""
    out: set[str] = set()
    for argv in commands:
        for word in _words(argv):
            if not word or word.startswith("-") or os.path.isabs(word) or "://" in word or "\0" in word:
                continue
            if "=" in word.split("/")[0]:
                continue  # VAR=value, --opt=value
            norm = posixpath.normpath(word)
            if norm.startswith("../") or norm in (".", ".."):
                continue
            out.add(norm)
    return frozenset(out)


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def _words(argv: Sequence[str]) -> list[str]:
    """The argv's words, and for ``sh -c STRING`` the words of STRING too (split as the shell would, operators
    dropped): ``sh -c "./check.sh --strict && make"`` names ``./check.sh``."""
    import shlex

    out = list(argv)
    if argv and os.path.basename(argv[0]) in SHELLS:
        for i, word in enumerate(argv[:-1]):
            if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
                try:
                    lex = shlex.shlex(argv[i + 1], posix=True, punctuation_chars=True)
                    lex.whitespace_split = True
                    out += [w for w in lex if w not in (";", "&&", "||", "|", "&", "(", ")")]
                except ValueError:
                    pass
                break
    return out


def load_trusted(record: Path) -> dict[str, str]:
    try:
        obj = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return {}
    blobs = obj.get("blobs") if isinstance(obj, dict) else None
    return {k: v for k, v in (blobs or {}).items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(blobs, dict) else {}


def trust(record: Path, blobs: Mapping[str, str], by: str) -> None:
    """Record these blobs as the operator's (merged with what was trusted before)."""
    from evolve.store.atomic import write_json
    from evolve.store.dirfd import ensure_dir
    from evolve.timeutil import utc_iso

    ensure_dir(record.parent)
    write_json(record, {"version": 1, "trusted_by": by, "trusted_at": utc_iso(),
                        "blobs": dict(sorted({**load_trusted(record), **blobs}.items()))})


def untrusted(repo: Path, base: str, new: str, checks: Checks) -> dict[str, str]:
    """``path -> blob at new`` ("" when deleted) of the check files ``base..new`` changes that the operator
    has not trusted: a script a gate command names, or a GOALS file whose check commands changed."""
    out: dict[str, str] = {}
    changed = [p for p in git(repo, "diff", "--name-only", "-z", "--no-renames", base, new).split("\0") if p]
    scripts = set(checks.scripts)
    for named in checks.scripts:  # a named script the repository commits as a link: its target is the script
        for rev in (base, new):
            target = _link_target(repo, rev, named)
            if target:
                scripts.add(target)
    for path in changed:
        goals = path in GOALS_FILES
        if path not in scripts and not goals:
            continue
        blob = _blob(repo, new, path)
        if checks.trusted.get(path) == blob:
            continue
        if goals and _goal_checks(repo, base, path, checks) == _goal_checks(repo, new, path, checks):
            continue  # the descriptions or directives changed, not what is run
        out[path] = blob
    return out


def _link_target(repo: Path, rev: str, path: str) -> str:
    """The in-tree path a committed symlink at ``path`` names (one level), or ""."""
    proc = run_git(repo, "ls-tree", "-z", rev, "--", path)
    entry = proc.stdout.split("\0")[0] if proc.returncode == 0 else ""
    if not entry.startswith("120000 "):
        return ""
    target = run_git(repo, "cat-file", "blob", entry.split()[2])
    if target.returncode != 0 or os.path.isabs(target.stdout):
        return ""
    norm = posixpath.normpath(posixpath.join(posixpath.dirname(path), target.stdout))
    return "" if norm.startswith("../") or norm == ".." else norm


def reason(found: Mapping[str, str]) -> str:
    names = ", ".join(sorted(found)[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return (f"the change rewrites what judges it ({names}: a script a [gate] command runs, or a GOALS check): "
            "held until you review it and run `evolve trust`")


def _blob(repo: Path, rev: str, path: str) -> str:
    proc = run_git(repo, "rev-parse", "-q", "--verify", f"{rev}:{path}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _goal_checks(repo: Path, rev: str, path: str, checks: Checks) -> tuple[str, ...] | None:
    """The check commands of the GOALS file at ``rev``; None when absent. Without a parser every change counts."""
    proc = run_git(repo, "cat-file", "blob", f"{rev}:{path}")
    if proc.returncode != 0:
        return None
    if checks.goal_checks is None:
        return ("<unparsed>", rev)
    return checks.goal_checks(path, proc.stdout.encode("utf-8", "surrogateescape"))
