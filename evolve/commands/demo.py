"""``evolve demo``: a throwaway repo, the bundled scripted agent and a context hand-off, narrated."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--dir", type=Path, default=None, help="where to create the demo repo (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the demo repo (the default; kept for old scripts)")
    p.add_argument("--rm", action="store_true", help="delete the demo repo at the end (and list no paths in it)")


def run(args: argparse.Namespace) -> int:
    from evolve.demo import run_demo

    return run_demo(args.dir, keep=not args.rm)
