"""``evolve doctor``: preflight checks, each an OK / WARN / FAIL line with the fix (exit 1 on any FAIL)."""

from __future__ import annotations

import argparse

from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = "Check the setup. Each line is OK, WARN or FAIL with the fix; exit 1 when anything FAILs."
    p.add_argument("--json", action="store_true", help="a JSON array of {check, level, message, fix}")
    p.add_argument("--trust-git-config", action="store_true",
                   help="approve the program-valued keys the repository's own git config sets now (git-crypt,"
                        " git lfs install --local): evolve's git runs them from then on; shown one by one")


def run(args: argparse.Namespace) -> int:
    import os
    import sys
    from pathlib import Path

    from evolve.doctor import diagnose, exit_code
    from evolve.errors import UsageError

    try:
        repo = repo_of(args)
    except UsageError:
        repo = (args.repo if args.repo is not None else Path.cwd()).resolve()
        if not repo.is_dir():
            raise
    from evolve.redact import current

    findings = []
    if args.trust_git_config:
        from evolve.doctor import approve_git_config
        from evolve.paths import Paths
        from evolve.status.snapshot import load_config

        paths = Paths.for_repo(repo, env=os.environ)
        findings += approve_git_config(paths, load_config(paths, os.environ)[0])
    findings += diagnose(repo, os.environ)
    r = current()  # the sink: a finding may quote the config (a notify URL) or the environment
    if args.json:
        import orjson

        body = r.json([f.as_json() for f in findings])
        sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from evolve.status import term_safe
        from evolve.tty import colour_on, colourize

        on = colour_on(sys.stdout, os.environ)
        for f in findings:
            print(colourize(term_safe(r.text(f.line())), on))
        fails = sum(f.level == "FAIL" for f in findings)
        warns = sum(f.level == "WARN" for f in findings)
        print(f"\n{fails} FAIL, {warns} WARN, {len(findings) - fails - warns} OK")
    sys.stdout.flush()
    return exit_code(findings)
