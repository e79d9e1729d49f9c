"""``evolve hook session-start``: the SessionStart hook Claude Code runs (registered by ``evolve setup --hooks``).

Always exits 0, whatever stdin holds: a hook must never break or block a session.
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hook", help="harness hooks (run by Claude Code, not by hand)")
    hs = p.add_subparsers(dest="hook", metavar="HOOK")
    s = hs.add_parser("session-start", help="SessionStart: autocompact nudge; cycle state after a compaction")
    s.set_defaults(run=run_session_start)
    p.set_defaults(run=_usage)


def run_session_start(args: argparse.Namespace) -> int:
    from evolve.harness.hooks import main_hook

    return main_hook(sys.stdin, sys.stdout)


def _usage(args: argparse.Namespace) -> int:
    print("usage: evolve hook session-start  (reads the hook JSON on stdin)", file=sys.stderr)
    return 0
