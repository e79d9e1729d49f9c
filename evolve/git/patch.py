"""A unified diff from a model, applied to a work tree by evolve's own git (the http runner, docs/DESIGN.md §5.4).

The model's answer is untrusted: the paths it names are checked before ``git apply`` writes anything,
and a failed apply leaves the tree as it was.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from evolve.git.change import dirty_paths, is_internal
from evolve.git.pathargs import reset_index
from evolve.git.run import GitError, run_git


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # evolve's own git (no hooks, no repo-chosen programs, an allow-listed env): never the API key.
    return run_git(repo, *args)


def apply(repo: Path, patch: Path, diff: str) -> str:
    """Apply ``diff`` (already written to ``patch``) in ``repo``; on any failure the tree is as it was.

    Returns the error, or "" when applied. Refused before anything is written: a path outside the
    repository, under ``.agents/`` or ``.git/``, or one with uncommitted changes.
    """
    stat = _git(repo, "apply", "--numstat", "-z", str(patch))
    if stat.returncode != 0:
        return _first_error(stat.stderr) or f"git apply --numstat exited {stat.returncode}"
    touched = sorted(set(_numstat_paths(stat.stdout)) | _rename_sources(diff))
    if not touched:
        return "the diff names no files"
    outside = [p for p in touched if p.startswith("/") or ".." in p.split("/")]
    if outside:
        return f"the diff reaches outside the repository: {', '.join(outside)[:200]}"
    bad = [p for p in touched if is_internal(p) or p == ".git" or p.startswith(".git/")]
    if bad:
        return f"the diff touches .agents/ or .git/: {', '.join(bad)[:200]}"
    try:
        dirty_before = dirty_paths(repo)
    except GitError as exc:
        return str(exc)
    dirty = dirty_before & set(touched)
    if dirty:
        return f"the diff touches paths with uncommitted changes: {', '.join(sorted(dirty))[:200]}"
    check = _git(repo, "apply", "--check", str(patch))
    if check.returncode != 0:
        return _first_error(check.stderr) or f"git apply --check exited {check.returncode}"
    applied = _git(repo, "apply", "--3way", str(patch))
    try:
        changed = {p for p in dirty_paths(repo) - dirty_before if not is_internal(p)}
    except GitError:
        changed = set()
    paths = sorted(set(touched) | changed)
    if applied.returncode != 0:
        _restore(repo, paths)
        return _first_error(applied.stderr) or f"git apply --3way exited {applied.returncode}"
    # --3way implies --index: leave the index as it was (the gate stages by explicit path).
    _unstage(repo, paths)
    return ""


def _in_head(repo: Path, path: str) -> bool:
    return _git(repo, "cat-file", "-e", f"HEAD:{path}").returncode == 0


def _unstage(repo: Path, paths: list[str]) -> None:
    born = _git(repo, "rev-parse", "--verify", "-q", "HEAD").returncode == 0
    with contextlib.suppress(GitError):  # as ``git reset`` was: best effort, the apply itself succeeded
        reset_index(repo, "HEAD" if born else None, paths)  # without HEAD: ``rm --cached``


def _restore(repo: Path, paths: list[str]) -> None:
    """Put the touched paths (all clean before the apply) back to HEAD, index and tree."""
    for p in paths:
        if _in_head(repo, p):
            _git(repo, "checkout", "-q", "HEAD", "--", p)
        else:
            _git(repo, "rm", "-q", "--cached", "-f", "--ignore-unmatch", "--", p)
            target = repo / p
            if target.is_file() or target.is_symlink():
                target.unlink()




def _first_error(stderr: str) -> str:
    """git's complaints, joined: ``error: patch failed: x:1; error: x: patch does not apply``."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    picked = [ln for ln in lines if ln.startswith(("error:", "fatal:"))] or lines[:1]
    return "; ".join(picked)[:300]  # the runner makes it one printable line


def _numstat_paths(out: str) -> list[str]:
    """Paths from ``git apply --numstat -z``: ``A\\tD\\tpath\\0`` or, for a rename, ``A\\tD\\t\\0src\\0dst\\0``."""
    parts = out.split("\0")
    paths: list[str] = []
    i = 0
    while i < len(parts):
        rec = parts[i]
        i += 1
        if not rec:
            continue
        fields = rec.split("\t", 2)
        if len(fields) < 3:
            continue
        if fields[2]:
            paths.append(fields[2])
        else:
            paths.extend(p for p in parts[i : i + 2] if p)
            i += 2
    return sorted(set(paths))


def _unquote(path: str) -> str:
    """A path as git prints it in a header: C-quoted when it holds special characters."""
    if len(path) >= 2 and path[0] == path[-1] == '"':
        try:
            return path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode()
        except (UnicodeError, ValueError):
            return path[1:-1]
    return path


def _rename_sources(diff: str) -> set[str]:
    """Paths a rename or copy takes from (``git apply --numstat`` names only the destination)."""
    out = set()
    for line in diff.splitlines():
        for tag in ("rename from ", "copy from "):
            if line.startswith(tag):
                out.add(_unquote(line[len(tag) :].strip()))
    return out
