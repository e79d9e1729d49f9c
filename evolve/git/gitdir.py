"""A checkout's git directory read without git (docs/DESIGN.md §8.3): light enough for ``evolve status``.

Only ``os`` and :mod:`evolve.git.land` (pure): ``status`` says the operator is mid-rebase from the
same rule a fire obeys, without starting a process.
"""

from __future__ import annotations

import os
from pathlib import Path

from evolve.git import land


def git_dir_of(checkout: Path) -> Path | None:
    """The checkout's own git directory (``.git``, or a linked worktree's ``gitdir:``), read without git."""
    dot = checkout / ".git"
    try:
        if dot.is_dir() and not dot.is_symlink():
            return dot
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:"):].strip())
    return target if target.is_absolute() else Path(os.path.normpath(checkout / target))


def busy(checkout: Path) -> str:
    """:func:`evolve.git.land.operator_busy` for a checkout, read from its git directory (no git process)."""
    gd = git_dir_of(checkout)
    if gd is None:
        return "its git directory cannot be found"
    try:
        names = set(os.listdir(gd))
    except OSError:
        return "its git directory cannot be read"
    try:
        head_text: str | None = (gd / "HEAD").read_text(encoding="utf-8", errors="replace")
    except OSError:
        head_text = None
    why = land.operator_busy(names, head_text)
    if why or head_text is None:
        return why
    ref = head_text.strip()[4:].strip()
    if _ref_missing(gd, ref):
        return f"its branch {land.short_branch(ref)} has no commit yet"
    return ""


def operating_on(checkout: Path) -> str | None:
    """The branch a rebase or bisect in progress in ``checkout`` is on (``refs/heads/...``), or None.

    Both detach HEAD while they run, so ``git worktree list`` names no branch for the checkout; yet the
    branch is the operator's: the rebase moves it when it finishes (from the value it started with: a
    branch moved meanwhile makes ``rebase --continue`` fail, and ``--abort`` puts it back over whatever
    landed) and ``bisect reset`` returns to it. A landing treats that checkout as the one holding it.
    """
    gd = git_dir_of(checkout)
    if gd is None:
        return None
    for name in ("rebase-merge/head-name", "rebase-apply/head-name", "BISECT_START"):
        try:
            text = (gd / name).read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if name == "BISECT_START":  # the branch's short name (or a sha, when the bisect began detached)
            text = "refs/heads/" + text if text and not text.startswith("refs/") else text
        return text if text.startswith("refs/heads/") else None
    return None


def _ref_missing(gd: Path, ref: str) -> bool:
    """Whether ``ref`` exists neither as a loose ref nor in ``packed-refs``."""
    common = gd
    try:
        text = (gd / "commondir").read_text(encoding="utf-8").strip()
        common = Path(text) if os.path.isabs(text) else Path(os.path.normpath(gd / text))
    except OSError:
        pass
    if (common / ref).is_file():
        return False
    try:
        packed = (common / "packed-refs").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return not any(line.endswith(" " + ref) for line in packed.splitlines())


def index_lock(checkout: Path) -> Path | None:
    gd = git_dir_of(checkout)
    return gd / "index.lock" if gd is not None else None
