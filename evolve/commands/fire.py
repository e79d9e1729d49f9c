"""``evolve fire``: one fire (lock, step 1, cycles) — what cron, systemd and the daemon run."""

from __future__ import annotations

import argparse

from evolve.commands._common import config_flags, repo_of
from evolve.errors import UsageError


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--cycles", type=int, default=None, help="at most N cycles in this fire")
    p.add_argument("--dry-run", action="store_true", help="evaluate step 1 and selection; write nothing")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the lock")
    p.add_argument("--mode", choices=["burst", "loop"], default=None)
    p.add_argument("--quality", action="store_true", help="high, then medium severity findings first")
    p.add_argument("--beads-only", action="store_true", help="skip goals when selecting work")


def run(args: argparse.Namespace) -> int:
    import os
    import sys
    import time

    from evolve import config, configtrust, log, tty
    from evolve.cycle.fire import Fire, FireOptions
    from evolve.paths import Paths
    from evolve.redact import current

    if args.cycles is not None and args.cycles < 1:
        raise UsageError("--cycles must be at least 1")
    if args.wait < 0:
        raise UsageError("--wait must not be negative")
    paths = Paths.for_repo(repo_of(args))
    # A repository-tracked config the operator has not trusted: exit 78 here, before anything of it runs.
    log.configure()

    def refused(operators: config.Config, why: str) -> None:
        if not args.dry_run:
            from evolve.notify import config_refused

            config_refused(paths, operators, why)

    cfg = configtrust.load_for_fire(paths, os.environ, config_flags(args), on_refusal=refused)
    opts = FireOptions(cycles=args.cycles, dry_run=args.dry_run, wait_s=args.wait, mode=args.mode)
    observers = []
    if not args.dry_run:
        from evolve.notify import observers_for

        observers = observers_for(cfg, paths)
    started = time.monotonic()
    outcome = Fire(paths, cfg, opts, observers=observers).run()
    if not args.dry_run and sys.stdout.isatty():
        # A person at a terminal gets one line at the end (the logs above are for machines and journald).
        line = tty.fire_summary(outcome.entries, reason=outcome.reason, exit_code=outcome.exit_code,
                                cost_usd=outcome.cost_usd, elapsed_s=time.monotonic() - started)
        print(tty.colourize(current().text(line), tty.colour_on(sys.stdout, os.environ)), flush=True)
    if args.dry_run:
        import orjson

        from evolve import jsonsafe

        # The sink: the agent's argv, env and prompt, exactly as they would run, minus any secret.
        sys.stdout.buffer.write(jsonsafe.dumps(current().json(outcome.entries[0]), option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    return outcome.exit_code
