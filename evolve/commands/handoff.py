"""``evolve handoff continue`` and ``evolve handoff fork --purpose TEXT`` (docs/DESIGN.md §7)."""

from __future__ import annotations

import argparse
import os

from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    hs = p.add_subparsers(dest="handoff_mode", metavar="MODE", required=True)
    c = hs.add_parser("continue", help="the next cycle starts a fresh session from a hand-off summary")
    c.add_argument("--note", default="", help="free text for the artifact (open questions, decisions)")
    f = hs.add_parser("fork", help="the next cycle runs as a fork of the current session, for one purpose")
    f.add_argument("--purpose", required=True, help="one line: what the fork is for (required)")
    f.add_argument("--note", default="", help="free text for the artifact")


def run(args: argparse.Namespace) -> int:
    from evolve.errors import UsageError
    from evolve.harness import handoff
    from evolve.paths import Paths

    mode = args.handoff_mode
    purpose = getattr(args, "purpose", "") or ""
    if mode == handoff.FORK and not purpose.strip():
        raise UsageError("a fork needs a one-line --purpose")
    paths = Paths.for_repo(repo_of(args))
    req, notes = handoff.request(paths, mode, purpose=purpose, note=args.note, env=os.environ)
    print(f"wrote {req.artifact}")
    for line in notes:
        print(line)
    if mode == handoff.FORK:
        print(
            f"the next cycle runs as a fork of session {req.parent_session_id or '(none: fresh, seeded)'}; "
            "the artifact is deleted once used"
        )
    else:
        print("the next cycle starts a fresh agent session with this artifact as its prior-session summary")
    return 0
