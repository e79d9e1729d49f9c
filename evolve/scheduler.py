"""`evolve daemon`: APScheduler 3.x fires each repository's ``schedule.cron`` in-process (docs/DESIGN.md §9).

Each job is one :class:`~evolve.cycle.fire.Fire`, the same code and the same kernel lock as
``evolve fire``, so a daemon and a cron line on one repo never overlap. SIGTERM/SIGINT/SIGHUP are handled
in the main thread, which is also the scheduler's loop: the handler only sets flags (stop claiming;
every running fire interrupts its agent's group). The daemon's ticker thread, which also sends
READY, WATCHDOG and STATUS, sees the flag and shuts the scheduler down without waiting; the loop
returns and the main thread waits a bounded grace for the fires to record ``interrupted``. Nothing
ever calls ``shutdown(wait=True)`` (no timeout, and fatal from a job thread).

Only APScheduler 3.x's public API: a :class:`BaseTrigger` subclass, job options, event listeners,
``Job.modify`` and ``wakeup`` (re-planning after a wall-clock step), ``remove_all_jobs`` and
``shutdown(wait=False)``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    EVENT_SCHEDULER_STARTED,
    JobEvent,
    SchedulerEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.base import BaseTrigger

from evolve import config, configtrust, exitcodes, sdnotify
from evolve import log as logmod
from evolve.cronexpr import CronSpec, max_interval_s, next_times
from evolve.cycle.fire import Fire, FireOptions
from evolve.notify import config_refused, observers_for
from evolve.paths import Paths
from evolve.procgroup import group_alive, progress_hook, stop_signals
from evolve.status import publish_daemon
from evolve.store import session_state
from evolve.store.ledger import Ledger

# SIGHUP stops the daemon as SIGTERM does, with the same 143 (see Fire._signals for why not 129).
SIGNAL_EXIT = {signal.SIGTERM: exitcodes.SIGTERM, signal.SIGINT: exitcodes.SIGINT, signal.SIGHUP: exitcodes.SIGTERM}
AFTER_KILL_S = 3.0  # after KILLing a late fire's agent: time for the fire to record `interrupted`
# The scheduler sleeps on the monotonic clock until the wall time it planned, so a wall-clock step
# leaves it asleep on a stale plan (a 1 h step back: an hour without fires). The ticker looks at least
# this often, watchdog or not, and re-plans on a step larger than CLOCK_STEP_S.
CLOCK_CHECK_S = 30.0
CLOCK_STEP_S = 60.0  # NTP slews far less than this between two looks; a suspend counts as a forward step
CRON_CORRECTION_S = 3 * 3600.0  # cron(8): a step of 3 h or more is a correction, followed by every job


@dataclass
class RepoJob:
    """One repository of the fleet: its own job, schedule and lock."""

    name: str
    paths: Paths
    spec: CronSpec
    timezone: str
    jitter_s: int
    last: str = ""

    def trigger(self) -> SpecTrigger:
        return SpecTrigger(self.spec, self.timezone, self.jitter_s)

    def misfire_grace_s(self) -> int:
        """At least one interval: after any pause the latest missed run is still inside it, so it runs (coalesced)."""
        return int(max_interval_s(self.spec, self.timezone)) + self.jitter_s + 1


class SpecTrigger(BaseTrigger):
    """An APScheduler trigger on :func:`evolve.cronexpr.next_times`, the calendar checked against systemd.

    One calendar for every zone: APScheduler 3.x's own ``CronTrigger`` skips days around a DST change
    (#606; e.g. Berlin midnight on 2026-03-30), and cron's day-of-month OR weekday rule and Sunday-is-0
    weekdays come for free instead of being translated.
    """

    __slots__ = ("jitter_s", "spec", "timezone")

    def __init__(self, spec: CronSpec, timezone: str, jitter_s: int = 0) -> None:
        self.spec = spec
        self.timezone = ZoneInfo(timezone)
        self.jitter_s = jitter_s

    def get_next_fire_time(self, previous_fire_time: dt.datetime | None, now: dt.datetime) -> dt.datetime | None:
        # APScheduler's CronTrigger rule: search from just past the previous fire, or from now if the
        # clock has gone back before it.
        start = now
        if previous_fire_time is not None:
            start = min(now, previous_fire_time + dt.timedelta(microseconds=1))
            if start == previous_fire_time:
                start += dt.timedelta(microseconds=1)
        # next_times is strictly after; fire times are whole seconds, so this is "at or after start".
        found = next_times(self.spec, start.astimezone(self.timezone) - dt.timedelta(microseconds=1), 1)
        if not found:
            return None
        if not self.jitter_s:
            return found[0]
        # Spread a fleet's fires (schedule.jitter_s): a uniform delay of up to jitter_s seconds.
        return found[0] + dt.timedelta(seconds=random.uniform(0, self.jitter_s))

    def __str__(self) -> str:
        return f"cron[{self.spec.expr} {self.timezone.key}]"

    def __repr__(self) -> str:
        return f"<SpecTrigger {self.spec.expr!r} {self.timezone.key} jitter_s={self.jitter_s}>"


STUCK_GRACE_S = 600.0  # beyond a fire's own bound, before its silence means it is stuck


def stuck_after_s(cfg: config.Config) -> float:
    """How long a fire may go without progress before the watchdog gives up on it.

    Every step is capped by what is left of ``fire.max_minutes`` (plus a grace), and progress is
    reported at every child's start, heartbeat and end, every git command and every fire event: a
    fire silent for longer than its whole budget plus a grace is stuck somewhere nothing bounds.
    Without ``max_minutes``, the longest single step any timeout allows stands in for the budget.
    """
    if cfg.fire.max_minutes:
        bound = cfg.fire.max_minutes * 60
    else:
        bound = max(cfg.agent.timeout_s, cfg.gate.timeout_s, cfg.work.goals_timeout_s, cfg.git.timeout_s,
                    cfg.halt.timeout_s, cfg.notify.timeout_s)
    return bound + STUCK_GRACE_S


class ClockWatch:
    """Notices wall-clock steps: how much more (or less) the wall clock moved than the monotonic one."""

    def __init__(self, wall: Callable[[], float], mono: Callable[[], float], threshold_s: float = CLOCK_STEP_S) -> None:
        self.wall, self.mono, self.threshold_s = wall, mono, threshold_s
        self._last = (wall(), mono())

    def step(self) -> float:
        """The step since the last look in seconds (negative = backward), 0.0 when within the threshold."""
        wall, mono = self.wall(), self.mono()
        last_wall, last_mono = self._last
        self._last = (wall, mono)
        delta = (wall - last_wall) - (mono - last_mono)
        return delta if abs(delta) > self.threshold_s else 0.0


def replan(
    trigger: BaseTrigger, planned: dt.datetime | None, now: dt.datetime, step_s: float
) -> tuple[dt.datetime | None, str]:
    """A job's next run time after a wall-clock step of ``step_s`` seconds to ``now``, and why.

    cron(8)'s rules, with the daemon's own catch-up: forward, a plan the step jumped over runs once,
    now (the skipped slots coalesce into that run, as after any pause); backward, a wildcard job
    follows the new time at once, and a fixed-time job keeps its plan (its slots in the repeated
    interval already ran) unless the step is 3 h or more, a correction every job follows.
    """
    if planned is None:
        return None, "paused"
    if step_s > 0:
        return (now, "catch_up") if planned <= now else (planned, "kept")
    spec = getattr(trigger, "spec", None)
    if spec is not None and spec.fixed_time and -step_s < CRON_CORRECTION_S:
        return planned, "kept"
    return trigger.get_next_fire_time(None, now), "replanned"


@dataclass
class Daemon:
    jobs: list[RepoJob]
    grace_s: float
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    notifier: sdnotify.Notifier = field(default_factory=sdnotify.Notifier)
    wall: Callable[[], float] = time.time  # injectable, with mono, so tests can step the clock
    mono: Callable[[], float] = time.monotonic
    check_s: float = CLOCK_CHECK_S  # the ticker's longest sleep

    def __post_init__(self) -> None:
        self.log = logmod.get("evolve.daemon")
        self.clock_watch = ClockWatch(self.wall, self.mono)
        self.stop = threading.Event()  # shared by every fire: set = interrupt the agent, record `interrupted`
        self.draining = threading.Event()
        self.force = threading.Event()
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self.signum: int | None = None
        self.signalled_at: float | None = None
        self._running: set[str] = set()
        self._idle = threading.Condition()
        self._ready_sent = False
        self._ticker_error: BaseException | None = None
        self._sched: BlockingScheduler | None = None
        # Each running fire's last progress and how long it may go without any (the watchdog's view).
        self._progress: dict[str, tuple[float, float]] = {}
        self._stuck_logged: set[str] = set()

    # -- start ------------------------------------------------------------------------------

    def build(self) -> BlockingScheduler:
        first_tz = self.jobs[0].timezone if self.jobs else "UTC"
        grace = {j.name: j.misfire_grace_s() for j in self.jobs}
        sched = BlockingScheduler(
            timezone=first_tz,
            jobstores={"default": MemoryJobStore()},  # rebuilt from config at every start: never shared
            executors={"default": ThreadPoolExecutor(max_workers=max(1, len(self.jobs)))},
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": max(grace.values(), default=60)},
        )
        for job in self.jobs:
            sched.add_job(
                self._run_fire,
                trigger=job.trigger(),
                args=[job],
                id=job.name,
                name=f"fire {job.paths.repo}",
                misfire_grace_time=grace[job.name],
                replace_existing=True,
            )
        sched.add_listener(
            self._on_event, EVENT_JOB_MISSED | EVENT_JOB_ERROR | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_SUBMITTED
        )
        sched.add_listener(self._on_started, EVENT_SCHEDULER_STARTED)
        self.log.info(
            "daemon.start",
            pid=os.getpid(),
            jobs=[
                {"name": j.name, "repo": str(j.paths.repo), "cron": j.spec.expr, "timezone": j.timezone,
                 "jitter_s": j.jitter_s, "misfire_grace_s": grace[j.name]}
                for j in self.jobs
            ],
            grace_s=self.grace_s,
            notify=self.notifier.enabled,
            watchdog_s=self.notifier.watchdog_interval_s,
        )
        return sched

    def run(self) -> int:
        """Block until a signal; the exit code is 143 (SIGTERM, SIGHUP) or 130 (SIGINT)."""
        if os.environ.get("EVOLVE_LOG_LEVEL", "").lower() == "debug":
            logging.getLogger("apscheduler").setLevel(logging.DEBUG)
        self._sched = self.build()
        with self._signals():
            self._sched.start()  # returns once the ticker has shut the scheduler down
            if self._ticker_error is not None:
                raise self._ticker_error  # as an error in the loop itself would
            return self._drain()

    @contextlib.contextmanager
    def _signals(self):
        old = {s: signal.signal(s, self._on_signal) for s in stop_signals()}  # SIGHUP unless under nohup
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Main thread, between two bytecodes: only set flags no code of this thread ever holds a lock on."""
        if self.signum is not None:
            self.force.set()  # a second signal: stop waiting for the grace
            return
        self.signum = signum
        self.signalled_at = time.monotonic()
        self.draining.set()  # stop claiming: no new fire starts
        self.stop.set()  # running fires TERM their agent's process group (KILL after a grace), record `interrupted`

    def stopping(self) -> None:
        """The ticker noticed the signal: say so (the handler itself must not write logs)."""
        name = signal.Signals(self.signum or signal.SIGTERM).name
        self.log.info("daemon.signal", signal=name, action="drain", running=sorted(self._running))
        self.notifier.stopping(f"stopping on {name}: {len(self._running)} fire(s) finishing")

    # -- the ticker (its own thread) ----------------------------------------------------------

    def _on_started(self, _event: SchedulerEvent) -> None:
        """The scheduler is running and its jobs have their next run times: start the ticker."""
        threading.Thread(target=self._ticker, args=(self._sched,), name="evolve-daemon-ticker", daemon=True).start()

    def _ticker(self, sched: BlockingScheduler) -> None:
        """READY, then WATCHDOG and STATUS every watchdog interval; on a signal, stop the scheduler.

        It sleeps on ``draining``, which the signal handler sets and no code of the main thread ever
        waits on, so a signal is acted on at once; between signals it wakes every watchdog interval
        and at least every ``check_s`` to look for a wall-clock step (:meth:`on_clock_step`). The
        handler cannot stop the scheduler itself: ``shutdown`` wakes the loop through a lock the main
        thread may be holding at that very moment.
        """
        try:
            if not self.draining.is_set():
                self.ready()
                # Every watchdog interval, and at least every CLOCK_CHECK_S to notice a clock step.
                every = min(self.notifier.watchdog_interval_s or self.check_s, self.check_s)
                while not self.draining.wait(every):
                    self.tick()
            self.stopping()
        except BaseException as exc:  # re-raised by run() on the main thread
            self._ticker_error = exc
        finally:
            # The loop makes one more pass after shutdown: with the jobs gone it hands nothing to the
            # stopped executor (which would refuse it with an error).
            sched.remove_all_jobs()
            sched.shutdown(wait=False)  # running fires are waited for by _drain, within the grace

    def ready(self) -> None:
        self.notifier.ready(self.status_line())
        for job in self.jobs:
            self.publish(job)
        self._ready_sent = True
        self.log.info("daemon.ready", notify=self.notifier.enabled)
        for job in self.jobs:
            # An operator who just started the daemon wants to know when something will happen.
            nxt = self._sched.get_job(job.name) if self._sched is not None else None
            when = getattr(nxt, "next_run_time", None)
            self.log.info("daemon.first_fire", job=job.name, repo=str(job.paths.repo), next_fire_at=_iso(when),
                          in_s=None if when is None else max(0, round(when.timestamp() - time.time())))

    def tick(self) -> None:
        """Re-plan after a wall-clock step; WATCHDOG and STATUS, the WATCHDOG only while every running fire
        makes progress.

        The status line reads the jobs under the scheduler's job-store lock, which its loop holds while
        it works through due jobs: a loop stuck there blocks this thread, the pings stop, and systemd's
        watchdog restarts the daemon. A fire silent past :func:`stuck_after_s` stops them too: a
        restart (its cgroup killed whole, the next fire reconciling this one) beats a daemon that
        looks alive while its repository never fires again.
        """
        step_s = self.clock_watch.step()
        if step_s:
            self.on_clock_step(step_s)
        line = self.status_line()
        stuck = self.stuck_fires()
        if stuck:
            self.notifier.status(f"stuck: {', '.join(stuck)}; watchdog pings stopped; {line}")
            return
        self.notifier.watchdog()
        self.notifier.status(line)

    def stuck_fires(self) -> list[str]:
        """The running fires silent for longer than their bound (each logged once per silence)."""
        now = self.mono()
        with self._idle:
            silent = {name: now - last for name, (last, limit) in self._progress.items() if now - last > limit}
        for name in sorted(silent.keys() - self._stuck_logged):
            self.log.error("daemon.fire_stuck", job=name, silent_s=round(silent[name], 1),
                           action="watchdog pings stopped: systemd restarts the daemon")
        self._stuck_logged = set(silent)
        return sorted(silent)

    def progressed(self, name: str) -> None:
        """A fire on ``name`` made progress (a child's start, beat or end, a git command, a fire event)."""
        with self._idle:
            if name in self._progress:
                self._progress[name] = (self.mono(), self._progress[name][1])

    def on_clock_step(self, step_s: float) -> None:
        """Re-plan every job from the new wall time (see :func:`replan`) and wake the loop to re-sleep."""
        sched = self._sched
        if sched is None:
            return
        now = dt.datetime.fromtimestamp(self.wall(), dt.UTC)
        plans = []
        for job in sched.get_jobs():
            planned = job.next_run_time
            new, how = replan(job.trigger, planned, now, step_s)
            if new is not None and new != planned:
                job.modify(next_run_time=new)  # public API: updates the store and wakes a running loop
            plans.append({"job": job.id, "how": how, "before": _iso(planned), "after": _iso(new)})
        sched.wakeup()  # its sleep was measured on the monotonic clock against the old wall time
        self.log.warning("daemon.clock_step", step_s=round(step_s, 3), now=_iso(now), jobs=plans)
        for repo_job in self.jobs:
            self.publish(repo_job)
        self.refresh_status()

    def refresh_status(self) -> None:
        """STATUS right when a count or the next fire changes (sent only when the line changed)."""
        if self._ready_sent and self.notifier.enabled:
            self.notifier.status(self.status_line())

    def publish(self, job: RepoJob) -> None:
        """Tell ``evolve status`` when this repo's next fire is (best effort: status only reads it)."""
        nxt = self._sched.get_job(job.name) if self._sched is not None else None
        when = getattr(nxt, "next_run_time", None)
        try:
            publish_daemon(job.paths, schedule=job.spec.expr,
                           next_fire_at=when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if when else None)
        except OSError as exc:
            self.log.warning("daemon.publish_failed", job=job.name, error=str(exc)[:200])

    def status_line(self) -> str:
        nxt = []
        if self._sched is not None:
            for job in self._sched.get_jobs():
                if job.next_run_time is not None:
                    nxt.append((job.next_run_time, job.id))
        parts = []
        if nxt:
            when, name = min(nxt)
            parts.append(f"next {name} {when.astimezone(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
        last = [j.last for j in self.jobs if j.last]
        if last:
            parts.append("last " + ", ".join(last))
        c = self.counts
        parts.append(
            f"fires {c['fires']} ok {c['ok']} busy {c['busy']} interrupted {c['interrupted']} failed {c['failed']}"
            f" errors {c['errors']} missed {c['missed']} max_instances {c['max_instances']}"
        )
        return "; ".join(parts)

    # -- a job (executor thread) -------------------------------------------------------------

    def _run_fire(self, job: RepoJob) -> int | None:
        if self.draining.is_set():
            return None  # submitted just before the signal: stop claiming
        with self._idle:
            self._running.add(job.name)
        self._count("fires")
        self.refresh_status()
        logmod.bind(daemon_job=job.name)
        started = time.monotonic()
        try:
            env = sdnotify.child_env(self.env)
            # Edits to the agent config apply at the next fire; an untrusted repository config refuses it (exit 78).
            cfg = configtrust.load_for_fire(job.paths, env,
                                            on_refusal=lambda c, why: config_refused(job.paths, c, why, env))
            observers = observers_for(cfg, job.paths, env)  # journal, notifications, metrics: as `evolve fire`
            with self._idle:
                self._progress[job.name] = (self.mono(), stuck_after_s(cfg))
            observers.append(lambda _event, _payload: self.progressed(job.name))
            with progress_hook(lambda: self.progressed(job.name)):
                outcome = Fire(job.paths, cfg, FireOptions(), env=env, stop=self.stop, observers=observers).run()
            code = outcome.exit_code
            kind = {exitcodes.OK: "ok", exitcodes.TEMPFAIL: "busy", exitcodes.SIGTERM: "interrupted",
                    exitcodes.SIGINT: "interrupted"}.get(code, "failed")
            self._count(kind)
            stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%SZ")
            job.last = f"{job.name} {outcome.reason or kind} (exit {code}) {stamp}"
            self.log.info("daemon.fire_done", job=job.name, exit_code=code, reason=outcome.reason,
                          cycles=outcome.cycles, duration_s=round(time.monotonic() - started, 3))
            self.notifier.status(self.status_line())
            self.publish(job)
            return code
        finally:
            logmod.unbind("daemon_job")
            with self._idle:
                self._running.discard(job.name)
                self._progress.pop(job.name, None)
                self._idle.notify_all()

    def _count(self, kind: str) -> None:
        with self._counts_lock:  # jobs and listeners run on several threads
            self.counts[kind] += 1

    def _on_event(self, event: JobEvent) -> None:
        """Log and count scheduler events (on the loop's thread, or a job's for missed and error)."""
        run_time = getattr(event, "scheduled_run_time", None)
        when = run_time.astimezone(dt.UTC).isoformat() if run_time else None
        if event.code == EVENT_JOB_SUBMITTED:
            times = [t.astimezone(dt.UTC).isoformat() for t in getattr(event, "scheduled_run_times", [])]
            self.log.info("daemon.job_submitted", job=event.job_id, scheduled=times)
        elif event.code == EVENT_JOB_MISSED:
            self._count("missed")
            self.log.warning("daemon.job_missed", job=event.job_id, scheduled=when)
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            self._count("max_instances")
            self.log.warning("daemon.job_max_instances", job=event.job_id, detail="the previous fire is still running")
        elif event.code == EVENT_JOB_ERROR:
            self._count("errors")
            exc = getattr(event, "exception", None)
            self.log.error("daemon.job_error", job=event.job_id, scheduled=when,
                           error=f"{type(exc).__name__}: {str(exc)[:300]}", traceback=getattr(event, "traceback", ""))
            for job in self.jobs:
                if job.name == event.job_id:
                    job.last = f"{job.name} error {type(exc).__name__}"
        self.refresh_status()  # submitted and max_instances moved the next fire; the others changed a count

    # -- shutdown (main thread) --------------------------------------------------------------

    def _drain(self) -> int:
        """Wait up to ``grace_s`` after the signal for running fires to record ``interrupted``; never longer."""
        started = self.signalled_at or time.monotonic()
        deadline = started + self.grace_s
        with self._idle:
            while self._running and not self.force.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.notifier.watchdog()  # still alive while draining
                self._idle.wait(min(left, 0.5))
            late = sorted(self._running)
        code = SIGNAL_EXIT.get(self.signum or signal.SIGTERM, exitcodes.SIGTERM)
        if late:
            # A fire did not finish in time (its agent ignores TERM, say): KILL the agent group ourselves.
            # The fire then sees its agent gone and records `interrupted` within moments; if even that
            # does not happen, leave anyway; the next fire reconciles this one as crashed.
            killed = [pg for j in self.jobs if j.name in late for pg in [self._agent_pgid(j)] if pg]
            for pgid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            self.log.error("daemon.grace_exceeded", running=late, killed_pgids=killed, grace_s=self.grace_s,
                           forced=self.force.is_set())
            with self._idle:
                self._idle.wait_for(lambda: not self._running, timeout=0 if self.force.is_set() else AFTER_KILL_S)
                late = sorted(self._running)
        shutdown_s = round(time.monotonic() - started, 3)
        self.log.info("daemon.stop", exit_code=code, shutdown_s=shutdown_s, unfinished=late, **dict(self.counts))
        if late:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # the executor's worker threads are not daemons and would block a normal exit
        return code

    def _agent_pgid(self, job: RepoJob) -> int | None:
        """The agent group of this daemon's own fire on ``job``, from the session state, if still alive."""
        try:
            # Read-only: a corrupt file is left for the fire (or the next one) to move aside.
            fire = session_state.load_readonly(job.paths.state, Ledger(job.paths.ledger)).fire
        except (OSError, ValueError):  # unreadable: nothing to KILL; the next fire reconciles this one
            return None
        pgid = fire.agent_pgid if fire is not None else None
        if pgid is not None and fire is not None and fire.pid == os.getpid() and group_alive(pgid):
            return pgid
        return None


def _iso(when: dt.datetime | None) -> str | None:
    return when.astimezone(dt.UTC).isoformat() if when is not None else None
