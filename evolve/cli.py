"""The ``evolve`` command line. Heavy modules are imported per command, so ``status`` starts fast."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from evolve import __version__, exitcodes
from evolve.errors import EvolveError, UsageError

# Modules under evolve/commands/ that register their own subcommands (missing ones are skipped).
COMMAND_MODULES = (
    "evolve.commands.daemon",
    "evolve.commands.install",
    "evolve.commands.setup",
    "evolve.commands.hook",
    "evolve.commands.handoff",
    "evolve.commands.report",
    "evolve.commands.metrics",
    "evolve.commands.doctor",
)


def _register_modules(sub: Any) -> None:
    import importlib
    import importlib.util

    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(sub)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="evolve",
        description="Run a coding agent unattended against a git repository, across its context limits.",
    )
    ap.add_argument("--repo", type=Path, default=None, help="repository (default: git top level of the cwd)")
    ap.add_argument("--version", action="version", version=f"evolve {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    f = sub.add_parser("fire", help="one fire: lock, step 1, cycles (what cron/systemd run)")
    f.add_argument("--cycles", type=int, default=None, help="at most N cycles in this fire")
    f.add_argument("--dry-run", action="store_true", help="evaluate step 1 and selection; write nothing")
    f.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the lock")
    f.add_argument("--mode", choices=["burst", "loop"], default=None)
    f.add_argument("--quality", action="store_true", help="high, then medium severity findings first")
    f.add_argument("--beads-only", action="store_true", help="skip goals when selecting work")

    s = sub.add_parser(
        "status",
        help="what the loop is doing and why (exit 0 healthy, 1 degraded, 75 halted)",
        description="What the loop is doing and why. Exit 0 healthy, 1 degraded (breaker open, last cycle "
        "failed, invalid config), 75 halted (KILL, STOP, DORMANT, goal regression).",
    )
    s.add_argument("--json", action="store_true", help="one JSON object for machines")

    h = sub.add_parser("history", help="ledger entries, newest last, with sparklines (or JSONL with --json)")
    h.add_argument("--limit", type=int, default=20, help="at most N entries (default 20)")
    h.add_argument("--since", default=None, metavar="WHEN", help="only entries newer than 90m, 24h, 7d or an ISO time")
    h.add_argument("--result", action="append", default=[], metavar="RESULT",
                   help="only these results (repeat or comma-separate), e.g. failed,regressed")
    h.add_argument("--json", action="store_true", help="the matching ledger lines as they are (JSONL)")

    for name, text in (("stop", "write STOP (halt until `evolve resume`)"), ("kill", "write KILL")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--reason", default="", help="free text kept in the marker")

    r = sub.add_parser("resume", help="remove STOP (and KILL with --kill)")
    r.add_argument("--kill", action="store_true", help="also remove the repo and global KILL markers")

    sub.add_parser("init", help="write .agents/.gitignore and a commented config.toml, and say what next")

    d = sub.add_parser("demo", help="a throwaway repo, a scripted agent, and a context hand-off, narrated")
    d.add_argument("--dir", type=Path, default=None, help="where to create the demo repo (default: a temp dir)")
    d.add_argument("--keep", action="store_true", help="keep the demo repo (always kept with --dir)")
    _register_modules(sub)
    return ap


def repo_of(args: argparse.Namespace) -> Path:
    """The repository a command acts on: ``--repo`` or the git top level of the cwd."""
    return _repo(args)


def _repo(args: argparse.Namespace) -> Path:
    from evolve.gitops import git_toplevel

    start = args.repo if args.repo is not None else Path.cwd()
    if not start.is_dir():
        raise UsageError(f"--repo {start}: not a directory")
    return git_toplevel(start)


def _flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    flags: dict[str, dict[str, Any]] = {}
    if getattr(args, "mode", None):
        flags.setdefault("fire", {})["mode"] = args.mode
    if getattr(args, "quality", False):
        flags.setdefault("work", {})["quality"] = True
    if getattr(args, "beads_only", False):
        flags.setdefault("work", {})["beads_only"] = True
    return flags


def cmd_fire(args: argparse.Namespace) -> int:
    from evolve import config, log
    from evolve.cycle.fire import Fire, FireOptions
    from evolve.paths import Paths

    if args.cycles is not None and args.cycles < 1:
        raise UsageError("--cycles must be at least 1")
    if args.wait < 0:
        raise UsageError("--wait must not be negative")
    paths = Paths.for_repo(_repo(args))
    cfg = config.load(paths.config, os.environ, _flags(args))
    log.configure()
    opts = FireOptions(cycles=args.cycles, dry_run=args.dry_run, wait_s=args.wait, mode=args.mode)
    observers = []
    if not args.dry_run:
        from evolve.notify import observers_for

        observers = observers_for(cfg, paths)
    outcome = Fire(paths, cfg, opts, observers=observers).run()
    if args.dry_run:
        import orjson

        from evolve import jsonsafe

        sys.stdout.buffer.write(jsonsafe.dumps(outcome.entries[0], option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    return outcome.exit_code


def cmd_status(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.status import render_status, status

    paths = Paths.for_repo(_repo(args))
    info = status(paths)
    if args.json:
        import orjson

        from evolve import jsonsafe

        sys.stdout.buffer.write(jsonsafe.dumps(info, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        sys.stdout.write(render_status(info))
    sys.stdout.flush()
    return int(info["exit_code"])


def cmd_history(args: argparse.Namespace) -> int:
    import time

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
    paths = Paths.for_repo(_repo(args))
    rows, malformed = history(Ledger(paths.ledger), limit=args.limit, since=since, results=results)
    if args.json:
        for raw, _ in rows:
            sys.stdout.buffer.write(raw + b"\n")
    else:
        sys.stdout.write(render_history([e for _, e in rows], malformed))
    sys.stdout.flush()
    return exitcodes.OK


def cmd_marker(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.store.atomic import atomic_write_bytes
    from evolve.timeutil import utc_iso

    paths = Paths.for_repo(_repo(args))
    target = paths.stop if args.command == "stop" else paths.kill
    text = f"{utc_iso()}\n{args.reason or 'operator ' + args.command}\n"
    atomic_write_bytes(target, text.encode())
    print(f"wrote {target}")
    return exitcodes.OK


def cmd_resume(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.store.markers import remove_marker

    paths = Paths.for_repo(_repo(args))
    targets = [paths.stop] + ([paths.kill, paths.global_kill] if args.kill else [])
    for t in targets:
        print(f"removed {t}" if remove_marker(t) else f"absent  {t}")
    if not args.kill:
        for k in (paths.kill, paths.global_kill):
            if k.exists():
                print(f"note: {k} is present; it is removed only with `evolve resume --kill`")
    return exitcodes.OK


def cmd_init(args: argparse.Namespace) -> int:
    from evolve.init import init_repo, next_steps
    from evolve.paths import Paths

    paths = Paths.for_repo(_repo(args))
    for line in [*init_repo(paths), *next_steps(paths)]:
        print(line)
    return exitcodes.OK


def cmd_demo(args: argparse.Namespace) -> int:
    from evolve.demo import run_demo

    return run_demo(args.dir, keep=args.keep or args.dir is not None)


COMMANDS = {
    "fire": cmd_fire,
    "status": cmd_status,
    "history": cmd_history,
    "stop": cmd_marker,
    "kill": cmd_marker,
    "resume": cmd_resume,
    "init": cmd_init,
    "demo": cmd_demo,
}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return exitcodes.USAGE
    try:
        if hasattr(args, "run"):
            return int(args.run(args))
        return COMMANDS[args.command](args)
    except EvolveError as exc:
        # One line, whatever a hostile key or path contains.
        print("evolve: " + " ".join(str(exc).split("\n")), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return exitcodes.SIGINT
    except BrokenPipeError:
        return exitcodes.OK
    except Exception as exc:
        # The fire has already logged ``fire.error`` with the traceback; one line here.
        print(f"evolve: unexpected error: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        if os.environ.get("EVOLVE_LOG_LEVEL", "").lower() == "debug":
            import traceback

            traceback.print_exc()
        return exitcodes.ERROR
