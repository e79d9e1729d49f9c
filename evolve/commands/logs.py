"""``evolve logs [N]``: the run log of cycle N (the agent's output), as kept under ``.agents/evolve/runs/``."""

from __future__ import annotations

import argparse

from evolve.commands._common import repo_of
from evolve.errors import EvolveError, UsageError


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Print the run log of cycle N (default: the newest cycle that has one): what the agent and "
                     "evolve's steps wrote while it ran. Secrets are masked; on a terminal control characters are "
                     "shown as escapes.")
    p.add_argument("cycle", nargs="?", type=int, default=None, metavar="N", help="the cycle number")
    p.add_argument("--tail", type=int, default=None, metavar="LINES", help="only the last LINES lines")
    p.add_argument("--path", action="store_true", help="print the log's path only")


def _newest(runs: object) -> int | None:
    """The highest cycle number with a ``cycle-N.log`` in the runs directory."""
    import re
    from pathlib import Path

    found = [int(m.group(1)) for f in Path(str(runs)).glob("cycle-*.log")
             if (m := re.fullmatch(r"cycle-(\d+)\.log", f.name))]
    return max(found, default=None)


def run(args: argparse.Namespace) -> int:
    import collections
    import sys

    from evolve.paths import Paths
    from evolve.redact import current
    from evolve.status import term_safe

    if args.cycle is not None and args.cycle < 1:
        raise UsageError("N must be a cycle number (1 or more)")
    if args.tail is not None and args.tail < 1:
        raise UsageError("--tail must be at least 1")
    paths = Paths.for_repo(repo_of(args))
    cycle = args.cycle if args.cycle is not None else _newest(paths.runs_dir)
    if cycle is None:
        raise EvolveError(f"no run log yet in {paths.runs_dir} (a cycle that runs an agent writes one)")
    path = paths.runs_dir / f"cycle-{cycle}.log"
    if not path.is_file():
        others = sorted(p.name for p in paths.runs_dir.glob(f"cycle-{cycle}.*")) if paths.runs_dir.is_dir() else []
        kept = f"; kept for it: {', '.join(others)}" if others else ""
        raise EvolveError(f"no run log for cycle {cycle} at {path} (the cycle ran no agent, or retention pruned it "
                          f"after [retention] runs_max_age_days){kept}")
    if args.path:
        print(path)
        return 0
    r = current()
    tty = sys.stdout.isatty()
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = collections.deque(fh, maxlen=args.tail) if args.tail else fh
        for line in lines:
            text = r.text(line)  # the sink: a run log holds what the agent printed
            sys.stdout.write(term_safe(text) if tty else text)
    sys.stdout.flush()
    return 0
