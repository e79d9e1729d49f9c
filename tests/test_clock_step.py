"""Wall-clock steps (issue 15 item 7): the daemon re-plans on a step, a fire's budget ignores it.

The scheduler sleeps on the monotonic clock until the wall time it planned; these tests step an
injected wall clock (the monotonic one stays put) and check the plan the daemon's ticker leaves behind,
on a real APScheduler with a memory job store, paused so nothing runs.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from pathlib import Path

import pytest
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from evolve import cronexpr
from evolve.paths import Paths
from evolve.scheduler import CLOCK_CHECK_S, ClockWatch, Daemon, RepoJob, replan
from evolve.sdnotify import Notifier

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def trigger(expr: str):
    return RepoJob("t", Paths.for_repo(Path.cwd()), cronexpr.parse(expr), "UTC", 0).trigger()


# -- detection ------------------------------------------------------------------------------------


class Clocks:
    """A wall and a monotonic clock the test moves by hand."""

    def __init__(self, wall: float, mono: float = 1000.0) -> None:
        self.w, self.m = wall, mono

    def advance(self, s: float) -> None:  # time passes: both clocks move
        self.w += s
        self.m += s

    def step(self, s: float) -> None:  # the wall clock is set: only it moves
        self.w += s


def test_clock_watch_sees_steps_both_ways_and_ignores_slew() -> None:
    c = Clocks(wall=1_000_000.0)
    watch = ClockWatch(lambda: c.w, lambda: c.m)
    c.advance(30)
    assert watch.step() == 0.0
    c.advance(30)
    c.step(-3600)
    assert watch.step() == -3600
    c.advance(30)
    assert watch.step() == 0.0  # measured from the last look, not from the start
    c.step(7200)
    assert watch.step() == 7200
    c.advance(30)
    c.step(0.5)  # NTP-sized drift is no step
    assert watch.step() == 0.0


def test_fixed_time_follows_cron8() -> None:
    assert cronexpr.parse("0 3 * * *").fixed_time
    assert cronexpr.parse("0 3,15 * * 1-5").fixed_time
    assert cronexpr.parse("@daily").fixed_time
    assert not cronexpr.parse("*/30 * * * *").fixed_time
    assert not cronexpr.parse("@hourly").fixed_time
    assert not cronexpr.parse("*/10 0 3 * * *").fixed_time  # a wildcard seconds field


# -- the plan after a step (pure) ----------------------------------------------------------------


def test_backward_step_wildcard_job_follows_the_new_time() -> None:
    # 10:10, next run 10:30; the clock goes back 1 h to 09:10: next is 09:30, not an hour of silence.
    new, how = replan(trigger("*/30 * * * *"), at("2026-01-02T10:30"), at("2026-01-02T09:10"), -3600)
    assert (new, how) == (at("2026-01-02T09:30"), "replanned")


def test_backward_step_fixed_time_job_is_not_rerun_in_the_repeated_interval() -> None:
    # Ran at 03:00; at 03:30 the clock goes back 1 h: 03:00 today is not run again.
    new, how = replan(trigger("0 3 * * *"), at("2026-01-03T03:00"), at("2026-01-02T02:30"), -3600)
    assert (new, how) == (at("2026-01-03T03:00"), "kept")
    # 3 h or more is a correction: every job follows the new time.
    new, how = replan(trigger("0 3 * * *"), at("2026-01-03T03:00"), at("2026-01-01T23:30"), -4 * 3600)
    assert (new, how) == (at("2026-01-02T03:00"), "replanned")


def test_forward_step_catches_up_once_or_keeps_the_plan() -> None:
    # 10:10 -> 12:10 skipped 10:30 .. 12:00: one run now, whatever the number of slots skipped.
    assert replan(trigger("*/30 * * * *"), at("2026-01-02T10:30"), at("2026-01-02T12:10"), 7200) == (
        at("2026-01-02T12:10"), "catch_up")
    # 10:10 -> 10:12 skipped nothing: the plan stands.
    assert replan(trigger("*/30 * * * *"), at("2026-01-02T10:30"), at("2026-01-02T10:12"), 120) == (
        at("2026-01-02T10:30"), "kept")
    assert replan(trigger("*/30 * * * *"), None, at("2026-01-02T10:12"), 120) == (None, "paused")


# -- the daemon's ticker on a real scheduler ------------------------------------------------------


@pytest.fixture
def paused(tmp_path: Path):
    """A daemon with an injected wall clock and its job in a started, paused APScheduler."""
    repo = tmp_path / "repo"
    (repo / ".agents" / "evolve").mkdir(parents=True)
    job = RepoJob("r", Paths.for_repo(repo, {"HOME": str(tmp_path)}), cronexpr.parse("*/30 * * * *"), "UTC", 0)
    offset = [0.0]
    mono = [0.0]
    daemon = Daemon([job], grace_s=1, env={}, notifier=Notifier({}),
                    wall=lambda: time.time() + offset[0], mono=lambda: mono[0])
    sched = BackgroundScheduler(timezone="UTC", jobstores={"default": MemoryJobStore()})
    sched.add_job(lambda: None, trigger=job.trigger(), id=job.name, coalesce=True, max_instances=1)
    sched.start(paused=True)  # next run times are computed; nothing is ever run
    daemon._sched = sched  # type: ignore[assignment]  # what run() sets; the ticker reads it
    try:
        yield daemon, sched, offset
    finally:
        if sched.running:  # the ticker shuts it down itself on draining
            sched.shutdown(wait=False)


def test_ticker_replans_after_a_backward_step_of_an_hour(paused) -> None:
    daemon, sched, offset = paused
    daemon.tick()
    before = sched.get_job("r").next_run_time
    offset[0] = -3600.0  # the wall clock goes back 1 h; the monotonic clock does not move
    daemon.tick()
    now = dt.datetime.fromtimestamp(time.time() - 3600, UTC)
    after = sched.get_job("r").next_run_time
    # The next fire is within one interval of the new time, not an hour later.
    assert now - dt.timedelta(seconds=5) <= after <= now + dt.timedelta(minutes=30)
    assert after < before - dt.timedelta(minutes=29)


def test_ticker_catches_up_once_after_a_forward_step(paused) -> None:
    daemon, sched, offset = paused
    daemon.tick()
    offset[0] = 2 * 3600.0
    daemon.tick()
    now = dt.datetime.fromtimestamp(time.time() + 2 * 3600, UTC)
    after = sched.get_job("r").next_run_time
    # One run right away (the skipped slots coalesce into it); the plan after it is the new schedule.
    assert abs((after - now).total_seconds()) < 60
    follow = sched.get_job("r").trigger.get_next_fire_time(after, after)
    assert after < follow <= after + dt.timedelta(minutes=30)


def test_ticker_thread_checks_the_clock_without_a_watchdog(paused) -> None:
    daemon, sched, offset = paused
    daemon.check_s = 0.01  # no NOTIFY_SOCKET, no watchdog: the ticker still looks at the clock
    before = sched.get_job("r").next_run_time
    ticker = threading.Thread(target=daemon._ticker, args=(sched,), daemon=True)
    ticker.start()
    offset[0] = -3600.0
    deadline = time.monotonic() + 30
    while sched.get_job("r").next_run_time == before and time.monotonic() < deadline:
        time.sleep(0.01)
    after = sched.get_job("r").next_run_time
    daemon.draining.set()
    ticker.join(30)
    assert after < before - dt.timedelta(minutes=29)
    assert CLOCK_CHECK_S <= 30


# -- the real daemon under libfaketime ------------------------------------------------------------

LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))), None)


def faked_daemon(env, offset: Path):
    """``evolve daemon`` whose wall clock follows ``offset`` (read at every call); its monotonic clock
    stays real, as on a host whose clock is set. WATCHDOG_USEC without NOTIFY_SOCKET: the ticker looks
    every 0.2 s."""
    from test_daemon import start_daemon

    env.write_config(schedule={"cron": "*/30 * * * *"})
    offset.write_text("+0\n")
    site = env.root / "faketime-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SLEEP_SHIM, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return start_daemon(env, extra_env={
        "LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1", "WATCHDOG_USEC": "400000", "PYTHONPATH": path,
    })


# libfaketime 0.9.10 (Debian) with FAKETIME_DONT_FAKE_MONOTONIC=1 fails every
# clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) with EINVAL, and that is how Python 3.11's
# time.sleep waits. subprocess's wait with a timeout sleeps in a loop when git has closed its pipes but
# not yet exited, so any git call of the daemon's fire could die of it (a race: seen once in CI as
# "OSError: [Errno 22]" in Popen._wait). select's timeout is not faked: the daemon under the faked clock
# sleeps through it. Only this test's daemon gets the shim; a real host's time.sleep works.
SLEEP_SHIM = """import select
import time


def _sleep(seconds):
    select.select([], [], [], max(0.0, seconds))


time.sleep = _sleep
"""


needs_faketime = pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime (Debian package faketime) is missing")


@needs_faketime
def test_daemon_process_replans_when_its_clock_goes_back_an_hour(env) -> None:
    offset = env.root / "faketime"
    d = faked_daemon(env, offset)
    try:
        d.wait_for(lambda ev: any(e["event"] == "daemon.ready" for e in ev))
        offset.write_text("-1h\n")
        d.wait_for(lambda ev: any(e["event"] == "daemon.clock_step" for e in ev), timeout=60)
    finally:
        code, _ = d.stop()
    assert code == 143
    step = d.named("daemon.clock_step")[0]
    assert -3600 - 60 < step["step_s"] < -3600 + 60
    (job,) = step["jobs"]
    now = dt.datetime.fromisoformat(step["now"])
    before, after = dt.datetime.fromisoformat(job["before"]), dt.datetime.fromisoformat(job["after"])
    assert job["how"] == "replanned"
    assert now <= after <= now + dt.timedelta(minutes=30)  # not an hour of silence
    assert after < before - dt.timedelta(minutes=29)


@needs_faketime
def test_daemon_process_catches_up_once_when_its_clock_jumps_two_hours(env) -> None:
    offset = env.root / "faketime"
    d = faked_daemon(env, offset)
    try:
        d.wait_for(lambda ev: any(e["event"] == "daemon.ready" for e in ev))
        offset.write_text("+2h\n")
        d.wait_for(lambda ev: any(e["event"] == "daemon.fire_done" for e in ev), timeout=60)
    finally:
        code, _ = d.stop()
    assert code == 143
    (step,) = d.named("daemon.clock_step")
    assert 7200 - 60 < step["step_s"] < 7200 + 60 and step["jobs"][0]["how"] == "catch_up"
    # Four slots were skipped; one run stands for them all.
    submitted = d.named("daemon.job_submitted")
    assert submitted and len(submitted[0]["scheduled"]) == 1
    assert submitted[0]["scheduled"][0] == step["jobs"][0]["after"]
