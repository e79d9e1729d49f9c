"""``evolve stop``, ``evolve kill`` and ``evolve resume``: the operator's halt markers, written and removed.

A marker written here carries ``written-by: evolve <cmd>`` and so never goes stale by the TTL; it
holds until ``evolve resume`` unless ``--for``/``--until`` recorded an expiry (docs/DESIGN.md §2.2).
A running fire re-reads KILL and STOP between cycles, before each agent start and, for KILL, while
its agent runs (§4.4): no signal is sent, so a reused pid or the daemon's own pid is never at risk.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING

from evolve import exitcodes
from evolve.commands._common import repo_of
from evolve.errors import UsageError

if TYPE_CHECKING:
    from evolve.paths import Paths

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "resume":
        p.add_argument("--kill", action="store_true", help="also remove the repo and global KILL markers")
        return
    p.add_argument("--reason", default="", help="free text kept in the marker")
    until = p.add_mutually_exclusive_group()
    until.add_argument("--for", dest="for_", metavar="DURATION", help="expire after this long (8h, 1d12h, 90m)")
    until.add_argument("--until", metavar="ISO_TIME", help="expire at this time (UTC unless it has an offset)")


def parse_duration(text: str) -> float:
    """``8h``, ``1d12h``, ``90m``, ``45s`` → seconds; anything else is a usage error."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip() or not text.strip():
        raise UsageError(f"--for {text!r}: expected a duration like 8h, 1d12h, 90m")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"--for {text!r}: must be longer than 0s")
    return float(seconds)


def expiry(args: argparse.Namespace, now: float) -> float | None:
    from evolve.timeutil import parse_iso

    if getattr(args, "for_", None):
        return now + parse_duration(args.for_)
    if getattr(args, "until", None):
        at = parse_iso(args.until)
        if at is None:
            raise UsageError(f"--until {args.until!r}: not an ISO-8601 time")
        if at <= now:
            raise UsageError(f"--until {args.until!r}: already past")
        return at
    return None


def run(args: argparse.Namespace) -> int:
    return run_resume(args) if args.command == "resume" else run_marker(args)


def run_marker(args: argparse.Namespace) -> int:
    """``stop`` writes STOP, ``kill`` writes KILL: the time, the reason, then evolve's records."""
    from evolve.paths import Paths
    from evolve.store.atomic import atomic_write_bytes
    from evolve.store.markers import marker_text
    from evolve.timeutil import utc_iso

    now = time.time()
    expires = expiry(args, now)
    paths = Paths.for_repo(repo_of(args))
    target = paths.stop if args.command == "stop" else paths.kill
    text = marker_text(now, args.reason or "operator " + args.command, f"evolve {args.command}", expires)
    atomic_write_bytes(target, text.encode())
    lasts = f"until {utc_iso(expires)}" if expires is not None else "until `evolve resume" + (
        " --kill`" if args.command == "kill" else "`")
    print(f"wrote {target} (holds {lasts})")
    print(running_fire_note(paths, args.command))
    return exitcodes.OK


def running_fire_note(paths: Paths, command: str) -> str:
    """What the fire now holding the lock (if any) will do about the new marker (docs/DESIGN.md §4.4)."""
    from evolve.status.snapshot import read_snapshot

    try:
        snap = read_snapshot(paths, recent=1, probe_schedule=False)
    except Exception as exc:  # a status that cannot be read must not hide that the marker was written
        return f"could not tell whether a fire is running ({type(exc).__name__}: {str(exc)[:100]})"
    step1 = "halts in Step 1" if command == "kill" else "halts in Step 1 (user_halt)"
    if not snap.running or snap.current is None:
        return f"no fire is running; the next fire {step1}"
    cur = snap.current
    where = f"cycle {cur.cycle}" if cur.cycle is not None else "between cycles"
    phase = f" ({cur.phase})" if cur.phase and cur.cycle is not None else ""
    head = f"a fire (pid {cur.pid}) is running {where}{phase}"
    if command == "kill":
        return (f"{head}; it interrupts its agent or gate within seconds and lands nothing of that cycle (recorded "
                "`interrupted`, its claim released, its edits kept under refs/evolve/interrupted/), and starts "
                "no new cycle")
    return (f"{head}; it finishes that cycle (gate and landing included) and starts no new cycle"
            if cur.cycle is not None else f"{head}; it starts no new cycle")


def run_resume(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.store.markers import remove_marker

    paths = Paths.for_repo(repo_of(args))
    targets = [paths.stop] + ([paths.kill, *paths.global_kills] if args.kill else [])
    for t in targets:
        print(f"removed {t}" if remove_marker(t) else f"absent  {t}")
    if not args.kill:
        for k in (paths.kill, *paths.global_kills):
            if k.exists():
                print(f"note: {k} is present; it is removed only with `evolve resume --kill`")
    return exitcodes.OK
