"""`evolve daemon`: fire one repository, or a fleet, on its ``schedule.cron`` until SIGTERM/SIGHUP/SIGINT.

Only the standard library at import time: APScheduler is imported inside ``run``, once the arguments
are parsed.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from evolve.commands._common import repo_of
from evolve.errors import ConfigError, UsageError


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Fire each repository on its own schedule.cron until SIGTERM/SIGHUP/SIGINT (exit 143/143/130). "
                     "Without --repos/--fleet: the --repo repository (or the cwd's).")
    p.add_argument("--repos", nargs="+", type=Path, default=[], metavar="PATH", help="repositories to drive")
    p.add_argument("--fleet", type=Path, default=None, metavar="FILE",
                   help="a file listing repositories, one path a line (# comments; relative to the file)")


def read_fleet(path: Path) -> list[Path]:
    r"""Repository paths from a fleet file: one a line, ``#`` comments, relative to the file's directory.

    A line ends at ``\n`` only (and a ``\r`` before it, for a CRLF file). Python's ``splitlines`` also
    breaks at ``\v``, ``\f``, NEL, U+2028 and more, which an editor or ``cat`` shows inside one line, so
    a file reviewed as N entries could smuggle in more: any control character but a tab, and a tab
    inside an entry, is refused with the line number instead. Bytes, not ``read_text``: its universal
    newlines would turn a lone ``\r`` (which hides the text before it on a terminal) into a line break.
    """
    from evolve.deploy import CONTROL, shown

    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"--fleet {path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"--fleet {path}: not UTF-8 (byte {exc.start})") from exc
    out = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.removesuffix("\r")
        entry = line.split("#", 1)[0].strip(" \t")
        # Tabs may pad an entry or a comment, never sit inside a path.
        bad = CONTROL.search(line.replace("\t", " "))
        at = bad.start() if bad else line.index(entry) + entry.index("\t") if "\t" in entry else -1
        if at >= 0:
            raise UsageError(f"--fleet {path}: line {number}: control character U+{ord(line[at]):04X} "
                             f"in {shown(line, at)}")
        if entry:
            p = Path(os.path.expanduser(entry))
            out.append(p if p.is_absolute() else path.parent / p)
    if not out:
        raise UsageError(f"--fleet {path}: lists no repository")
    return out


def _job_name(repo: Path, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", repo.name) or "repo"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def run(args: argparse.Namespace) -> int:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from evolve import configtrust, cronexpr, log
    from evolve.git.toplevel import git_toplevel
    from evolve.paths import Paths
    from evolve.scheduler import Daemon, RepoJob

    starts = list(args.repos) + (read_fleet(args.fleet) if args.fleet else [])
    if not starts:
        repos = [repo_of(args)]
    else:
        repos = []
        for start in starts:
            if not start.is_dir():
                raise UsageError(f"{start}: not a directory")
            top = git_toplevel(start).resolve()
            if top not in repos:
                repos.append(top)
    log.configure()
    jobs, taken, grace = [], set(), 0.0
    for repo in repos:
        paths = Paths.for_repo(repo)
        cfg = configtrust.load_cfg(paths, os.environ)  # its fires refuse an untrusted repository config
        sched = cfg.schedule
        try:
            spec = cronexpr.parse(sched.cron)
        except ValueError as exc:
            raise ConfigError(f"{paths.config}: schedule.cron {sched.cron!r}: {exc}") from exc
        try:
            ZoneInfo(sched.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(f"{paths.config}: schedule.timezone {sched.timezone!r}: unknown time zone") from exc
        jobs.append(RepoJob(_job_name(repo, taken), paths, spec, sched.timezone, sched.jitter_s))
        grace = max(grace, cfg.daemon.grace_s)
    return Daemon(jobs, grace_s=grace).run()
