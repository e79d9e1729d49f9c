"""``evolve init``: ``.agents/.gitignore`` and a commented ``config.toml``, then what to run next."""

from __future__ import annotations

import argparse

from evolve import exitcodes
from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    pass  # no options of its own; --repo is the top-level one


def run(args: argparse.Namespace) -> int:
    from evolve.init import init_repo, next_steps
    from evolve.paths import Paths

    paths = Paths.for_repo(repo_of(args))
    for line in [*init_repo(paths), *next_steps(paths)]:
        print(line)
    return exitcodes.OK
