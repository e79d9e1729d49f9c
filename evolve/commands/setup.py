"""``evolve setup``: the harness autocompact setting (and the SessionStart hooks) in ``.claude/settings.json``."""

from __future__ import annotations

import argparse
import os
import sys

from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--autocompact-pct", metavar="N", default=None, help="1-100, written as a string (default: 40)")
    p.add_argument("--no-autocompact", action="store_true", help="only silence the nudge (.claude/memory marker)")
    p.add_argument("--yes", action="store_true", help="never prompt; keep a valid value or use the default")
    p.add_argument("--hooks", action="store_true", help="also register the two SessionStart hooks (idempotent)")


def run(args: argparse.Namespace) -> int:
    from evolve.harness import autocompact

    autocompact.check_pct(args.autocompact_pct)  # a bad flag exits 2 before anything is read or written
    repo = repo_of(args)
    interactive = args.autocompact_pct is None and not args.yes and not args.no_autocompact and sys.stdin.isatty()
    ask = _ask if interactive else None
    result = autocompact.setup(
        repo,
        os.environ,
        pct=args.autocompact_pct,
        no_autocompact=args.no_autocompact,
        hooks=args.hooks,
        ask=ask,
    )
    for line in result.messages:
        print(line)
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if not result.wrote and not args.no_autocompact:
        print(f"{result.path} unchanged")
    return 0


def _ask(prompt: str) -> str:
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line
