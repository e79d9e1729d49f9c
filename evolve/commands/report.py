"""``evolve report``: one self-contained HTML file for the morning (inline SVG, no scripts, no network)."""

from __future__ import annotations

import argparse
from pathlib import Path

from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Write one self-contained HTML file: a timeline of fires and cycles coloured by result, "
                     "hand-offs and halts marked, cost and context-% charts, the goals trajectory, the work done "
                     "and parked. No scripts, no external assets, no network.")
    p.add_argument("--since", default="24h", metavar="WHEN", help="window start: 90m, 24h, 7d or an ISO time "
                   "(default 24h)")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                   help="where to write it (default .agents/evolve/report.html; - for stdout)")


def run(args: argparse.Namespace) -> int:
    import os
    import sys
    import time

    from evolve.errors import UsageError
    from evolve.paths import Paths
    from evolve.report import build, render_html
    from evolve.status import parse_since
    from evolve.store.atomic import atomic_write_bytes

    now = time.time()
    try:
        since = parse_since(args.since, now)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if since >= now:
        raise UsageError("--since must be in the past")
    paths = Paths.for_repo(repo_of(args))
    data = build(paths, since=since, now=now, env=os.environ)
    if args.output is not None and str(args.output) == "-":
        sys.stdout.write(render_html(data))  # no place on disk: run logs are named, not linked
        sys.stdout.flush()
        return 0
    out = paths.report_html
    if args.output is not None:  # the operator's path: canonical once, no link followed below it
        from evolve.paths import operator_root

        out = operator_root(Path(os.path.abspath(args.output)).parent, paths.repo) / args.output.name
    html = render_html(data, links_from=out.parent)  # run logs linked relative to where the page is
    # 0o666 less the umask when new; a rewrite keeps the file's mode, owner and group
    atomic_write_bytes(out, html.encode("utf-8"))
    print(f"wrote {out}")
    return 0
