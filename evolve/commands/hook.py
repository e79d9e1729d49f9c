"""``evolve hook session-start``: the SessionStart hook Claude Code runs (registered by ``evolve setup --hooks``).

Always exits 0, whatever stdin holds: a hook must never break or block a session.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    hs = p.add_subparsers(dest="hook", metavar="HOOK")
    hs.add_parser("session-start", help="SessionStart: autocompact nudge; cycle state after a compaction")


def run(args: argparse.Namespace) -> int:
    if args.hook == "session-start":
        from evolve.harness.hooks import main_hook

        return main_hook(sys.stdin, sys.stdout)
    # ``evolve hook`` alone: a usage line, still exit 0 (a hook must never fail a session).
    print("usage: evolve hook session-start  (reads the hook JSON on stdin)", file=sys.stderr)
    return 0
