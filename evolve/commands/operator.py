"""``evolve breaker reset`` and ``evolve requeue REF``: the operator undoes what a run of failures did.

An infrastructure failure (a missing binary, a wrong key) opens the breaker, and an item that kept
failing is parked by its attempt budget (docs/DESIGN.md §8). Once the cause is fixed, these put the
loop back without editing JSON by hand. Both change ``session-state.json``, which a fire rewrites
while it runs: they take the fire lock first (``--wait`` to wait for a running fire), so a fire
and an operator never write it at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from evolve import exitcodes
from evolve.commands._common import repo_of


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "breaker":
        p.description = "Close the failure breaker now (after fixing what opened it); the next fire runs."
        p.add_argument("action", choices=["reset"], help="reset: close the breaker and clear the failure count")
    else:
        p.description = "Put an item parked by its attempt budget back into selection, its attempts cleared."
        p.add_argument("ref", help="the item's work ref, as `evolve status` or the ledger shows it")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for a running fire to release the lock (default: do not wait)",
    )


def run(args: argparse.Namespace) -> int:
    from evolve.paths import Paths
    from evolve.store import session_state
    from evolve.store.dirfd import ensure_dir
    from evolve.store.ledger import Ledger
    from evolve.store.lock import FireLock

    paths = Paths.for_repo(repo_of(args))
    ensure_dir(paths.evolve_dir)
    lock = FireLock(paths.lock)
    if not lock.acquire(max(args.wait, 0.0)):
        print(
            "evolve: a fire is running (it holds the fire lock); run this again when it ends, or add --wait 600",
            file=sys.stderr,
        )
        return exitcodes.TEMPFAIL
    with lock:
        loaded = session_state.load(paths.state, Ledger(paths.ledger))
        st = loaded.state
        code = _reset(st) if args.command == "breaker" else _requeue(paths, st, args.ref)
        if code == exitcodes.OK:
            session_state.save(paths.state, st)
        return code


def _reset(st: Any) -> int:
    was = (f"open until {st.breaker_open_until}" if st.breaker_open_until else "closed") + (
        f", {st.consecutive_failures} failure(s) counted"
    )
    st.breaker_open_until, st.consecutive_failures = None, 0
    print(f"breaker closed (was {was}); the next fire runs")
    return exitcodes.OK


def _requeue(paths: Any, st: Any, ref: str) -> int:
    """Clear the item's attempts and parked mark, and unpark it in its source; exit 1 when nothing was parked."""
    from evolve.redact import current

    done: list[str] = []
    if st.attempts.pop(ref, None) is not None:
        done.append("attempt count cleared")
    if ref in st.parked_items:
        st.parked_items = [r for r in st.parked_items if r != ref]
        done.append("no longer listed as parked")
    try:
        where = _unpark_in_source(paths, ref)
    except Exception as exc:  # the tracker failed: say so, and keep the state unchanged
        print(f"evolve: could not requeue {ref} in its source: {current().text(str(exc))[:300]}", file=sys.stderr)
        return exitcodes.ERROR
    if where:
        done.append(where)
    if not done:
        print(
            f"evolve: {ref} is not parked (no attempts, not blocked in the queue): nothing to requeue", file=sys.stderr
        )
        return exitcodes.ERROR
    print(f"requeued {ref}: " + "; ".join(done))
    return exitcodes.OK


def _unpark_in_source(paths: Any, ref: str) -> str:
    """Unpark ``ref`` where it lives: a bead in the tracker, anything else in the harvested queue."""
    from evolve.childenv import work_env
    from evolve.configtrust import load_cfg
    from evolve.timeutil import utc_iso
    from evolve.work.beads import BeadsSource
    from evolve.work.harvested import HarvestedQueue

    if ref.startswith("bead:"):
        cfg = load_cfg(paths, os.environ)  # the tracker the repository names runs only once trusted
        env = work_env(os.environ, cfg.work.pass_env)
        BeadsSource(cfg.work.beads_command, paths.repo, timeout_s=cfg.work.probe_timeout_s, env=env).unpark(ref)
        return "bead reopened in the tracker"
    queue = HarvestedQueue(paths.nextwork, repo_names=(paths.repo.name,))
    return "unblocked in the queue" if paths.nextwork.exists() and queue.unpark(ref, utc_iso()) else ""
