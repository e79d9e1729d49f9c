"""``evolve stop``, ``evolve kill`` and ``evolve resume``: the operator's halt markers, written and removed."""

from __future__ import annotations

import argparse

from evolve import exitcodes
from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "resume":
        p.add_argument("--kill", action="store_true", help="also remove the repo and global KILL markers")
    else:
        p.add_argument("--reason", default="", help="free text kept in the marker")


def run(args: argparse.Namespace) -> int:
    return run_resume(args) if args.command == "resume" else run_marker(args)


def run_marker(args: argparse.Namespace) -> int:
    """``stop`` writes STOP, ``kill`` writes KILL: the time, then the reason."""
    from evolve.paths import Paths
    from evolve.store.atomic import atomic_write_bytes
    from evolve.timeutil import utc_iso

    paths = Paths.for_repo(repo_of(args))
    target = paths.stop if args.command == "stop" else paths.kill
    text = f"{utc_iso()}\n{args.reason or 'operator ' + args.command}\n"
    atomic_write_bytes(target, text.encode())
    print(f"wrote {target}")
    return exitcodes.OK


def run_resume(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.store.markers import remove_marker

    paths = Paths.for_repo(repo_of(args))
    targets = [paths.stop] + ([paths.kill, paths.global_kill] if args.kill else [])
    for t in targets:
        print(f"removed {t}" if remove_marker(t) else f"absent  {t}")
    if not args.kill:
        for k in (paths.kill, paths.global_kill):
            if k.exists():
                print(f"note: {k} is present; it is removed only with `evolve resume --kill`")
    return exitcodes.OK
