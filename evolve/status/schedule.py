"""When the next fire is due: the daemon's published record, the systemd timers, or this repo's crontab line.

The one writer here is :func:`publish_daemon` (``evolve daemon`` records its pid and next fire time in
``daemon.json``); everything else reads. ``subprocess`` and ``shutil`` are imported only when
systemd is actually running, so ``evolve status`` does not pay for them elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evolve.paths import Paths
from evolve.store.atomic import read_json
from evolve.timeutil import parse_iso, utc_iso


@dataclass(frozen=True)
class NextFire:
    """Who fires next and when; ``at`` is None when a daemon runs but published no time."""

    source: str  # "daemon" | "systemd" | "cron"
    at: Any  # an ISO time; for a daemon, whatever it published (None when it published none)
    in_s: int | None
    pid: Any = None  # daemon only: its pid, as published
    schedule: Any = None  # daemon only
    unit: str | None = None  # systemd only
    scope: str | None = None  # systemd only: "system" | "user"
    line: str | None = None  # cron only: the crontab line

    def as_json(self) -> dict[str, Any]:
        if self.source == "daemon":
            return {"source": "daemon", "pid": self.pid, "schedule": self.schedule, "at": self.at, "in_s": self.in_s}
        if self.source == "cron":
            return {"source": "cron", "line": self.line, "at": self.at, "in_s": self.in_s}
        return {"source": self.source, "unit": self.unit, "scope": self.scope, "at": self.at, "in_s": self.in_s}


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the daemon's record ---------------------------------------------------------------------


def publish_daemon(paths: Paths, *, next_fire_at: str | None, schedule: str = "", pid: int | None = None) -> None:
    """For ``evolve daemon``: record its pid and next fire time so ``status`` can show them."""
    from evolve.store.atomic import write_json

    info = {"pid": pid or os.getpid(), "next_fire_at": next_fire_at, "schedule": schedule, "updated_at": utc_iso()}
    old = read_json(paths.daemon)
    if isinstance(old, dict) and old.get("pid") == info["pid"] and old.get("started_at"):
        info["started_at"] = old["started_at"]
    else:
        info["started_at"] = info["updated_at"]
    write_json(paths.daemon, info)


def daemon_info(paths: Paths) -> dict[str, Any] | None:
    """The running daemon's record (None when there is none or its pid is gone)."""
    info = read_json(paths.daemon)
    if isinstance(info, dict) and pid_alive(info.get("pid")):
        return info
    return None


# -- systemd timers --------------------------------------------------------------------------


def systemd_booted() -> bool:
    """sd_booted(3): systemd is PID 1 (in containers it usually is not, and we skip systemctl)."""
    if not os.path.isdir("/run/systemd/system"):
        return False
    import shutil

    return shutil.which("systemctl") is not None


def _run(argv: Sequence[str], timeout: float = 2.0) -> str | None:
    import subprocess

    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def parse_timer_units(listing: str) -> list[str]:
    """Unit names (``*.timer``) from ``systemctl list-timers --all --plain --no-legend`` output."""
    units = []
    for line in listing.splitlines():
        for tok in line.split():
            if tok.endswith(".timer") and tok not in units:
                units.append(tok)
    return units


def parse_next_elapse(show: str) -> dict[str, float | None]:
    """``{unit: epoch | None}`` from ``systemctl show -p Id -p NextElapseUSecRealtime --timestamp=unix``."""
    out: dict[str, float | None] = {}
    unit = None
    for line in show.splitlines():
        key, _, value = line.partition("=")
        if key == "Id":
            unit = value.strip()
            out.setdefault(unit, None)
        elif key == "NextElapseUSecRealtime" and unit:
            v = value.strip().lstrip("@")
            try:
                out[unit] = float(v) if v and v not in ("0", "n/a") else None
            except ValueError:
                out[unit] = None
    return out


def systemd_timers() -> list[dict[str, Any]]:
    """``evolve*`` timers (system and user scope) with their next elapse time, when systemd runs."""
    if not systemd_booted():
        return []
    found = []
    for scope in ([], ["--user"]):
        listing = _run(["systemctl", *scope, "list-timers", "--all", "--plain", "--no-legend", "evolve*"])
        units = parse_timer_units(listing or "")
        if not units:
            continue
        show = _run(
            ["systemctl", *scope, "show", "-p", "Id", "-p", "NextElapseUSecRealtime", "--timestamp=unix", *units]
        )
        for unit, at in parse_next_elapse(show or "").items():
            found.append({"unit": unit, "scope": "user" if scope else "system", "at_epoch": at})
    return found


# -- cron --------------------------------------------------------------------------------------


def crontab_lines(env: Mapping[str, str]) -> list[str]:
    """The user's crontab (``crontab -l``), comments and blank lines dropped; [] when there is none."""
    import shutil
    import subprocess

    tool = shutil.which("crontab", path=env.get("PATH") or os.defpath)
    if tool is None:
        return []
    try:
        p = subprocess.run([tool, "-l"], capture_output=True, text=True, timeout=5, env=dict(env), check=False,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if p.returncode != 0:
        return []
    return [ln for ln in p.stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def cron_line_for(lines: Sequence[str], repo: str) -> str | None:
    """This repository's crontab line: the first that runs evolve and names the repository (doctor's rule)."""
    return next((ln for ln in lines if "evolve" in ln and repo in ln and "=" not in ln.split()[0]), None)


def cron_next(lines: Sequence[str], repo: str, now: float) -> tuple[str, float] | None:
    """``(line, epoch)`` of the next run of this repository's crontab line; None when none parses.

    Cron runs in the system's local time unless a ``CRON_TZ=`` line above says otherwise.
    """
    import datetime as dt

    from evolve import cronexpr

    line = cron_line_for(lines, repo)
    if line is None:
        return None
    words = line.split()
    expr = words[0] if words[0].startswith("@") else " ".join(words[:5])
    tz: Any = None
    for ln in lines[: list(lines).index(line)]:
        if ln.strip().startswith("CRON_TZ="):
            tz = ln.strip().split("=", 1)[1].strip().strip("'\"")
    try:
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(tz) if tz else dt.datetime.fromtimestamp(now).astimezone().tzinfo
        nxt = cronexpr.next_times(cronexpr.parse(expr), dt.datetime.fromtimestamp(now, zone), 1)
    except (ValueError, KeyError, OSError):
        return None
    return (line, nxt[0].timestamp()) if nxt else None


def next_fire(paths: Paths, now: float, env: Mapping[str, str] | None = None) -> NextFire | None:
    """When the next fire is due, if a daemon, a systemd timer or a crontab line says so; None when unknown."""
    d = daemon_info(paths)
    if d is not None:
        at = parse_iso(d.get("next_fire_at"))
        return NextFire(
            source="daemon",
            pid=d.get("pid"),
            schedule=d.get("schedule"),
            at=d.get("next_fire_at"),
            in_s=None if at is None else round(at - now),
        )
    timers = [t for t in systemd_timers() if t["at_epoch"]]
    if timers:
        t = min(timers, key=lambda x: x["at_epoch"])
        return NextFire(
            source="systemd",
            unit=t["unit"],
            scope=t["scope"],
            at=utc_iso(t["at_epoch"]),
            in_s=round(t["at_epoch"] - now),
        )
    cron = cron_next(crontab_lines(os.environ if env is None else env), str(paths.repo), now)
    if cron is not None:
        return NextFire(source="cron", line=cron[0][:300], at=utc_iso(cron[1]), in_s=round(cron[1] - now))
    return None
