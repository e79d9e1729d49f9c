"""``evolve metrics``: Prometheus text format on stdout, or this repo's textfile written atomically into a directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Print the metrics in the Prometheus text format, or write DIR/evolve-<repo>-<hash>.prom "
                     "atomically (temp file + rename) for node_exporter's textfile collector. With [metrics] "
                     "textfile_dir set, every fire rewrites it too.")
    p.add_argument("--textfile", type=Path, default=None, metavar="DIR",
                   help="write DIR/evolve-<repo>-<hash>.prom (one per repository) atomically instead of printing")
    p.add_argument("--no-beads", action="store_true", help="do not run the tracker to count ready beads")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from evolve import metrics
    from evolve.paths import Paths
    from evolve.status import load_config

    paths = Paths.for_repo(repo_of(args))
    cfg, _ = load_config(paths, os.environ)
    if args.textfile is not None:
        from evolve.paths import operator_root

        # relative to the cwd, as typed; then canonical like [metrics] textfile_dir (no link below it)
        directory = operator_root(Path(os.path.abspath(args.textfile)), paths.repo)
        text = metrics.render(paths, cfg, os.environ, beads=not args.no_beads)
        path = metrics.write_repo_textfile(directory, paths.repo, text)
        print(f"wrote {path}")
    else:
        sys.stdout.write(metrics.render(paths, cfg, os.environ, beads=not args.no_beads))
        sys.stdout.flush()
    return 0
