"""``evolve setup``: the harness autocompact setting (and the SessionStart hooks) in ``.claude/settings.json``.

With ``[agent] runner = "codex"`` or ``"gemini"`` it handles that CLI's own compaction setting
instead (:mod:`evolve.harness.compaction`)."""

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
    if _other_cli(args, repo):
        return 0
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


def _other_cli(args: argparse.Namespace, repo) -> bool:
    """Codex and Gemini keep their compaction threshold in their own settings; True when handled here."""
    from evolve import configtrust
    from evolve.paths import Paths

    cfg = configtrust.load_cfg(Paths.for_repo(repo, env=os.environ), os.environ)
    if cfg.agent.runner not in ("codex", "gemini") or args.no_autocompact:
        return False
    from evolve.harness import compaction

    pct = int(args.autocompact_pct) if args.autocompact_pct is not None else cfg.context.autocompact_pct
    done = compaction.setup(cfg.agent.runner, os.environ, pct=pct, keep=args.autocompact_pct is None,
                            context_window=cfg.context.context_window)
    for line in done.messages:
        print(line)
    return True


def _ask(prompt: str) -> str:
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line
