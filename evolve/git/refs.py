"""Refs and commits: what a ref names, ancestry, compare-and-swap moves (docs/DESIGN.md §8.3).

A branch evolve lands on only ever moves by compare-and-swap (:func:`update_ref` with the old value)
or by git's own fast-forward in the checkout that has it (:mod:`evolve.git.worktree`).
"""

from __future__ import annotations

from pathlib import Path

from evolve.git.run import run_git

ROOT = "refs/evolve/"
PENDING_REF = ROOT + "pending/"  # green commits waiting for the operator's checkout to allow a fast-forward
STRANDED_REF = ROOT + "stranded/"  # a dead cycle's work, set aside
UNLANDED_REF = ROOT + "unlanded/"  # green commits that could not be replayed onto a moved branch
UNCOMMITTED_REF = ROOT + "uncommitted/"  # a green change whose commit failed


def head(repo: Path) -> str | None:
    proc = run_git(repo, "rev-parse", "--verify", "-q", "HEAD")
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def rev(repo: Path, ref: str) -> str | None:
    proc = run_git(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def branch_of(repo: Path) -> str | None:
    """The full ref the checkout's HEAD names (``refs/heads/main``); None when detached or unborn."""
    proc = run_git(repo, "symbolic-ref", "-q", "HEAD")
    ref = proc.stdout.strip()
    return ref if proc.returncode == 0 and ref.startswith("refs/heads/") and rev(repo, ref) else None


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return run_git(repo, "merge-base", "--is-ancestor", older, newer).returncode == 0


def update_ref(repo: Path, ref: str, new: str, old: str | None) -> bool:
    """Compare-and-swap: ``ref`` moves to ``new`` only if it still is ``old`` (None: must not exist)."""
    expect = old or "0" * 40
    return run_git(repo, "update-ref", "-m", "evolve: land", ref, new, expect).returncode == 0


def delete_ref(repo: Path, ref: str) -> None:
    run_git(repo, "update-ref", "-d", ref)


def refs(repo: Path, prefix: str) -> list[tuple[str, str]]:
    """(ref, sha) under ``prefix``, oldest first by committer date."""
    out = run_git(repo, "for-each-ref", "--sort=committerdate", "--format=%(refname) %(objectname)", prefix)
    return [tuple(line.split(" ", 1)) for line in out.stdout.splitlines() if " " in line]  # type: ignore[misc]


def free_ref(repo: Path, prefix: str, cycle: int) -> str:
    """``<prefix><cycle>``, or ``<prefix><cycle>-<n>`` when taken: a set-aside ref is never overwritten."""
    ref, n = f"{prefix}{cycle}", 1
    while rev(repo, ref):
        n += 1
        ref = f"{prefix}{cycle}-{n}"
    return ref
