"""The stop an agent run polls (docs/DESIGN.md §4.4): the fire's own stop, or a KILL written meanwhile.

A separate event per agent run, because under the daemon the fire's stop event is shared by every
repository's fire and a KILL here must stop this one only; and no signal is needed from ``evolve
kill``, so no pid (the daemon's own, or a reused one) is ever at risk. Only KILL interrupts a running
agent; a STOP lets the cycle finish and is found again before the next one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from evolve.cycle import halt
from evolve.cycle import step1 as step1_shell
from evolve.cycle.context import FireContext

MARKER_POLL_S = 1.0  # while an agent runs, how often the fire looks for a KILL
STOP_POLL_S = 0.1  # how soon an agent run sees the fire's own stop event (a signal, the daemon's shutdown)


@contextlib.contextmanager
def agent_stop(
    ctx: FireContext, fire_stop: threading.Event, on_kill: Callable[[halt.Step1], None]
) -> Iterator[threading.Event]:
    """An event set when ``fire_stop`` is, or when a KILL appears (then ``on_kill`` is told)."""
    run_stop, done = threading.Event(), threading.Event()

    def watch() -> None:
        next_look = 0.0
        while not done.is_set():
            if fire_stop.is_set():
                run_stop.set()
                return
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + MARKER_POLL_S
                try:
                    d = step1_shell.operator_halt(ctx, ctx.clock())
                except Exception as exc:  # never let the watch die silently: say so and keep looking
                    ctx.log.warning("halt.watch_error", error=str(exc)[:200])
                    d = halt.Step1()
                if d.halt == halt.KILL:
                    run_stop.set()  # first: a notify command on_kill starts may be slow
                    on_kill(d)
                    return
            done.wait(STOP_POLL_S)

    watcher = threading.Thread(target=watch, name=f"evolve-stop-watch-{ctx.fire_id}", daemon=True)
    watcher.start()
    try:
        yield run_stop
    finally:
        done.set()
        watcher.join()
