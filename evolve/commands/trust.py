"""``evolve trust``: the operator trusts the repository's tracked config and agent settings, byte for byte.

Like ``direnv allow``: it prints what it trusts (each file, its sha256, what in it runs programs or widens what
evolve passes, then the rest) and records the hashes with who and when in the operator's record outside the
repository (docs/DESIGN.md §8.5). A change to a file needs trust again; ``--revoke`` forgets them all.
"""

from __future__ import annotations

import argparse

from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Trust the repository's tracked .agents/evolve/config.toml and agent settings files "
                     "(.claude/settings.json, .mcp.json, .codex/config.toml, the .env files Gemini reads) as they "
                     "are now: what they name runs from then on, until they change. Shows what it trusts.")
    p.add_argument("--show", action="store_true", help="show what would be trusted and what is; record nothing")
    p.add_argument("--revoke", action="store_true", help="forget every hash trusted for this repository")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from evolve import configtrust
    from evolve.paths import Paths
    from evolve.redact import current
    from evolve.status import term_safe

    paths = Paths.for_repo(repo_of(args), env=os.environ)
    r = current()

    def say(line: str) -> None:
        print(term_safe(r.text(line)))

    if args.revoke:
        gone = configtrust.revoke(paths)
        say(f"revoked: {', '.join(gone)}" if gone else "nothing was trusted")
        say(f"record: {paths.config_trust}")
        return 0
    # What else waits for the operator's word (DESIGN.md §8.5): refused changes, rewritten checks, a moved remote.
    from evolve.cycle import review

    def others() -> review.Waiting:
        return review.waiting(paths, configtrust.load_cfg(paths, os.environ))

    files = configtrust.owned_files(paths)
    waiting = others()
    if not files:
        say(f"{'nothing' if waiting.empty else 'no repository config'} to trust: neither {paths.config} nor an "
            "agent settings file is tracked in git here (an untracked config is yours and needs no trust)")
    for f in files:
        state = "trusted" if f.trusted else ("changed since trusted" if f.trusted_sha256 else "not trusted")
        say(f"{f.rel} ({'evolve config' if f.kind == configtrust.CONFIG else 'agent settings'}, tracked in git; "
            f"{state}) sha256 {f.sha256}")
        for line in configtrust.show(paths.repo / f.rel, f.kind):
            say(line)
    if files:
        say("  (! runs a program, sets the environment or credentials, or widens what evolve passes)")
    for line in waiting.lines():
        say(line)
    if args.show:
        return 0
    by = configtrust.who()
    if files:
        configtrust.trust(paths, files)
        say(f"trusted {len(files)} file(s) as they are now; a change needs `evolve trust` again")
        say(f"record: {paths.config_trust}")
        waiting = others()  # the config trusted now may name other gate commands
    if not waiting.empty:
        review.accept(paths, waiting, by)
        say(f"trusted what waited: {len(waiting.lines())} item(s); records in {paths.trust_dir}")
    sys.stdout.flush()
    return 0
