"""Cron expressions, parsed once and rendered for every trigger, so the daemon, systemd and cron agree.

Pure: no I/O. A 5-field expression (minute hour day month weekday) or 6 with seconds first, or one
of the ``@hourly``-style macros. Weekday numbers follow cron (0 and 7 are Sunday). When both the day
of month and the weekday are restricted, cron fires when *either* matches (Vixie cron: a field is
unrestricted when it starts with ``*``). The daemon's trigger computes its fire times with
:func:`next_times` itself; systemd and cron get renderings below that keep the same rules.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, low, high, names offset by low) in the order of a 6-field expression.
FIELDS = (
    ("second", 0, 59, None),
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day", 1, 31, None),
    ("month", 1, 12, MONTHS),
    ("weekday", 0, 7, DAYS),
)
_PART = re.compile(r"^(\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(\d+))?$")
# systemd orders the week Monday first; cron numbers Sunday 0.
_SD_DAYS = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")
_MONDAY_FIRST = (1, 2, 3, 4, 5, 6, 0)


@dataclass(frozen=True)
class CronSpec:
    expr: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    day_star: bool  # the day-of-month field started with '*'
    weekday_star: bool
    # cron(8)'s fixed-time job: no seconds, minute or hour field starts with '*' (so not @hourly). On a
    # backward clock step under 3 h it is not re-run in the repeated interval (the daemon, §12.6).
    fixed_time: bool = False

    @property
    def either_day(self) -> bool:
        """Cron's OR rule: both day fields restricted, so a day matches when either does."""
        return not self.day_star and not self.weekday_star

    @property
    def has_seconds(self) -> bool:
        return self.seconds != (0,)

    def day_matches(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = (day.isoweekday() % 7) in self.weekdays
        return (in_days or in_weekdays) if self.either_day else (in_days and in_weekdays)


def _value(token: str, name: str, low: int, high: int, names: tuple[str, ...] | None) -> int:
    if names and token in names:
        return names.index(token) + (1 if name == "month" else 0)
    if not token.isdigit():
        raise ValueError(f"{name} field: {token!r} is not a number" + (" or a name" if names else ""))
    v = int(token)
    if not low <= v <= high:
        raise ValueError(f"{name} field: {v} is outside {low}-{high}")
    return v


def _field(text: str, name: str, low: int, high: int, names: tuple[str, ...] | None) -> tuple[int, ...]:
    out: set[int] = set()
    for part in text.lower().split(","):
        m = _PART.match(part)
        if not m:
            raise ValueError(f"{name} field: cannot read {part!r}")
        base, step_text = m.group(1), m.group(2)
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"{name} field: step must be at least 1 in {part!r}")
        if base == "*":
            a, b = low, high
        elif "-" in base:
            a, b = (_value(t, name, low, high, names) for t in base.split("-"))
            if name == "weekday" and b == 0 < a:
                b = 7  # "fri-sun": Sunday closes the week
            if a > b:
                raise ValueError(f"{name} field: range {part!r} runs backwards")
        else:
            a = _value(base, name, low, high, names)
            b = high if step_text else a  # "5/15" means 5, 20, 35, 50
        out.update(range(a, b + 1, step))
    if name == "weekday":
        out = {v % 7 for v in out}  # 7 is Sunday too
    return tuple(sorted(out))


def parse(expr: str) -> CronSpec:
    """Parse a cron expression; ValueError says which field is wrong."""
    text = " ".join(expr.split())
    text = MACROS.get(text.lower(), text)
    if text.startswith("@"):
        raise ValueError(f"unknown macro {text!r} (known: {', '.join(sorted(MACROS))})")
    fields = text.split(" ")
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise ValueError(f"expected 5 fields (or 6 with seconds first), got {len(fields)}")
    values = [_field(f, name, lo, hi, names) for f, (name, lo, hi, names) in zip(fields, FIELDS, strict=True)]
    spec = CronSpec(expr, *values, day_star=fields[3].startswith("*"), weekday_star=fields[5].startswith("*"),
                    fixed_time=not any(f.startswith("*") for f in fields[:3]))
    if next_times(spec, dt.datetime(2000, 1, 1, tzinfo=dt.UTC), 1, max_days=366 * 8) == []:
        raise ValueError(f"{expr!r} never fires (no such day)")
    return spec


# -- next fire times (wall clock in the schedule's zone) ---------------------------------------------


def next_times(spec: CronSpec, after: dt.datetime, n: int, *, max_days: int = 366 * 5) -> list[dt.datetime]:
    """The next ``n`` fire times strictly after ``after`` (aware), in ``after``'s zone.

    A wall time that does not exist (a spring-forward gap) is skipped; a repeated one fires once.
    """
    tz = after.tzinfo
    assert tz is not None, "after must be aware"
    out: list[dt.datetime] = []
    day = after.date()
    for _ in range(max_days):
        if spec.day_matches(day):
            for h in spec.hours:
                for m in spec.minutes:
                    for s in spec.seconds:
                        t = dt.datetime(day.year, day.month, day.day, h, m, s, tzinfo=tz)
                        if t.astimezone(dt.UTC).astimezone(tz).replace(fold=0) != t:
                            continue  # does not exist in this zone
                        if t > after:
                            out.append(t)
                            if len(out) == n:
                                return out
        day += dt.timedelta(days=1)
    return out


def max_interval_s(spec: CronSpec, timezone: str = "UTC", samples: int = 400) -> float:
    """The longest gap between consecutive fires over the next ``samples`` fires (a year for monthly ones)."""
    start = dt.datetime.now(ZoneInfo(timezone))
    times = next_times(spec, start, samples)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    return max(gaps) if gaps else 366 * 86400.0


# -- renderings -------------------------------------------------------------------------------------


def _runs(values: tuple[int, ...]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and runs[-1][1] == v - 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def _sd_numbers(values: tuple[int, ...], low: int, high: int) -> str:
    """systemd calendar syntax for a set: ``*``, ``a/n`` (to the end), ``a..b`` runs, or a list."""
    if values == tuple(range(low, high + 1)):
        return "*"
    if len(values) >= 2:
        step = values[1] - values[0]
        if values == tuple(range(values[0], high + 1, step)):
            return f"{values[0]:02d}/{step}"
    parts = []
    for a, b in _runs(values):
        parts.append(f"{a:02d}..{b:02d}" if b - a >= 2 else ",".join(f"{v:02d}" for v in range(a, b + 1)))
    return ",".join(parts)


def _sd_weekdays(values: tuple[int, ...]) -> str:
    ordered = tuple(i for i, d in enumerate(_MONDAY_FIRST) if d in values)
    parts = []
    for a, b in _runs(ordered):
        names = [_SD_DAYS[_MONDAY_FIRST[i]] for i in range(a, b + 1)]
        parts.append(f"{names[0]}..{names[-1]}" if b - a >= 2 else ",".join(names))
    return ",".join(parts)


def to_oncalendar(spec: CronSpec, timezone: str = "UTC") -> list[str]:
    """``OnCalendar=`` values (one, or two for cron's day-of-month OR weekday rule).

    A timer may list several ``OnCalendar=`` lines and fires on their union, which is exactly the OR.
    """
    clock = ":".join(
        (_sd_numbers(spec.hours, 0, 23), _sd_numbers(spec.minutes, 0, 59), _sd_numbers(spec.seconds, 0, 59))
    )
    months = _sd_numbers(spec.months, 1, 12)
    days = _sd_numbers(spec.days, 1, 31)
    all_weekdays = len(spec.weekdays) == 7
    zone = f" {timezone}" if timezone else ""
    if spec.either_day:
        return [
            f"{_sd_weekdays(spec.weekdays)} *-{months}-* {clock}{zone}",
            f"*-{months}-{days} {clock}{zone}",
        ]
    prefix = "" if all_weekdays else _sd_weekdays(spec.weekdays) + " "
    return [f"{prefix}*-{months}-{days} {clock}{zone}"]


def crontab_schedule(spec: CronSpec) -> str:
    """The 5-field form for cron and Kubernetes (minute resolution); ValueError for sub-minute schedules."""
    if spec.has_seconds:
        raise ValueError(f"{spec.expr!r} fires on seconds; cron and Kubernetes have minute resolution")
    fields = spec.expr.split()
    if len(fields) == 6:
        return " ".join(fields[1:])
    return " ".join(MACROS.get(spec.expr.strip().lower(), spec.expr).split())
