"""Shared by the real-CLI runner tests: where a pinned CLI is installed, and the git-state checks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from support import Env, git

ROOT = Path(__file__).resolve().parents[1]


def cli_binary(name: str, override: str) -> str | None:
    """``$override``, then ``.tools/`` (the README's install), then ``.tools-extra/`` (a local install
    beside a shared ``.tools``), then the PATH."""
    for cand in (os.environ.get(override), str(ROOT / ".tools/node_modules/.bin" / name),
                 str(ROOT / ".tools-extra/node_modules/.bin" / name), shutil.which(name)):
        if cand and Path(cand).exists():
            return cand
    return None


def assert_git_sane(env: Env) -> None:
    """No stray index lock; every improved entry's commit exists on the operator's branch."""
    assert not list(env.repo.joinpath(".git").rglob("index.lock"))
    for e in env.ledger():
        if e["result"] == "improved":
            assert git(env.repo, "cat-file", "-t", e["sha"]).strip() == "commit"
