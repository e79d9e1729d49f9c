"""``evolve status`` and ``evolve history``: read-only views of what the loop is doing and has done.

Nothing heavy at import time: ``evolve status`` must answer fast (tests/test_startup.py).
"""

from __future__ import annotations

import argparse
import os
import sys

from evolve.commands._common import repo_of
from evolve.errors import UsageError


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "history":
        p.add_argument("--limit", type=int, default=20, help="at most N entries (default 20)")
        p.add_argument("--since", default=None, metavar="WHEN",
                       help="only entries newer than 90m, 24h, 7d or an ISO time")
        p.add_argument("--result", action="append", default=[], metavar="RESULT",
                       help="only these results (repeat or comma-separate), e.g. failed,regressed")
        p.add_argument("--json", action="store_true", help="the matching ledger lines as they are (JSONL)")
        p.add_argument("--all", action="store_true",
                       help="include idle polls (passes that found no work; hidden by default)")
        return
    p.description = ("What the loop is doing and why. Exit 0 healthy or dormant (DORMANT: caught up, nothing to do), "
                     "1 degraded (breaker open, last cycle failed, invalid config), 75 halted (KILL, STOP, goal "
                     "regression).")
    p.add_argument("--json", action="store_true", help="one JSON object for machines")


def run(args: argparse.Namespace) -> int:
    return run_history(args) if args.command == "history" else run_status(args)


def run_status(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.redact import current
    from evolve.status import render_status, status

    paths = Paths.for_repo(repo_of(args))
    info = status(paths)
    if args.json:
        import orjson

        from evolve import jsonsafe

        sys.stdout.buffer.write(jsonsafe.dumps(current().json(info), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from evolve.tty import colour_on, colourize

        sys.stdout.write(colourize(current().text(render_status(info)), colour_on(sys.stdout, os.environ)))
    sys.stdout.flush()
    return int(info["exit_code"])


def run_history(args: argparse.Namespace) -> int:
    import time

    import orjson

    from evolve import exitcodes
    from evolve.paths import Paths
    from evolve.status import history, parse_since, render_history
    from evolve.store.ledger import Ledger

    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    since = None
    if args.since is not None:
        try:
            since = parse_since(args.since, time.time())
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    results = [r.strip() for arg in args.result for r in arg.split(",") if r.strip()]
    paths = Paths.for_repo(repo_of(args))
    rows, malformed, hidden = history(Ledger(paths.ledger), limit=args.limit, since=since, results=results,
                                      idle=args.all)
    from evolve.redact import current

    r = current()
    if args.json:
        for raw, entry in rows:
            # Lines as they are, unless one holds a secret (written before redaction, or by hand).
            clean = r.json(entry)
            sys.stdout.buffer.write((raw if clean == entry else orjson.dumps(clean)) + b"\n")
    else:
        sys.stdout.write(r.text(render_history([e for _, e in rows], malformed, idle_hidden=hidden)))
    sys.stdout.flush()
    return exitcodes.OK
