"""What several commands share: the repository a command acts on, and the flags' layer of the config.

Standard library and ``evolve.errors`` only at import time: every command imports this module.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from evolve.errors import UsageError


def repo_of(args: argparse.Namespace) -> Path:
    """The repository a command acts on: ``--repo`` or the git top level of the cwd."""
    from evolve.git.toplevel import git_toplevel

    start = args.repo if args.repo is not None else Path.cwd()
    if not start.is_dir():
        raise UsageError(f"--repo {start}: not a directory")
    return git_toplevel(start)


def config_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The command-line layer of ``config.load`` (above the environment): only the flags that were given."""
    flags: dict[str, dict[str, Any]] = {}
    if getattr(args, "mode", None):
        flags.setdefault("fire", {})["mode"] = args.mode
    if getattr(args, "quality", False):
        flags.setdefault("work", {})["quality"] = True
    if getattr(args, "beads_only", False):
        flags.setdefault("work", {})["beads_only"] = True
    return flags
