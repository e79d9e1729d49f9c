"""What evolve keeps of its own files: bounded run logs, ``runs/``, the fire journal, ``cron.log``, baselines,
and the work it set aside under ``refs/evolve/`` (``[git] setaside_keep_days``, :func:`prune_setaside`).

A fire's steps are bounded in time by :func:`bounded` (every child within ``fire.max_minutes``, see
:func:`evolve.procgroup.fire_budget`), and what they leave on disk by :func:`apply`, run at the end
of every fire under its lock (``[retention]``; docs/DESIGN.md §12). Nothing here follows a symlink:
directories are opened with :func:`evolve.store.dirfd.open_dir`, entries are examined with
``lstat`` and unlinked by name relative to that descriptor, and only regular files are removed or
rewritten. Retention is housekeeping: a failure is logged and never fails the fire.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from evolve.config import RetentionConfig
from evolve.git.run import run_git
from evolve.paths import Paths
from evolve.procgroup import fire_budget
from evolve.store.atomic import atomic_write_bytes
from evolve.store.dirfd import NOFOLLOW, open_dir, opened_dir

MB = 1 << 20
DAY_S = 86400.0
TRIM_TO = 0.75  # a journal over its cap keeps this share of it: not rewritten again at every fire
# The set-aside refs a fire drops once older than [git] setaside_keep_days (status.setaside.PRUNABLE, which
# this layer cannot import). Never pending/: green commits still to land are work, not leftovers.
SETASIDE_PRUNED = ("stranded", "interrupted", "unlanded", "uncommitted", "applied")


@contextlib.contextmanager
def bounded(ctx: Any, remaining: Callable[[], float]) -> Iterator[None]:
    """The fire's bounds: every child within ``remaining()`` (+ a grace), run logs capped while written,
    and the retention applied when the fire ends (still under its lock), however it ends."""
    rc: RetentionConfig = ctx.cfg.retention
    try:
        with fire_budget(remaining, log_max_bytes=int(rc.run_log_max_mb * MB)):
            yield
    finally:
        try:
            removed = apply(ctx.paths, rc, now=time.time())
            if removed:
                ctx.log.info("retention.applied", **removed)
        except Exception as exc:  # housekeeping must never turn a fire's outcome into a crash
            ctx.log.warning("retention.error", error=str(exc)[:300])
        try:
            prune_setaside(ctx.paths.repo, ctx.cfg.git.setaside_keep_days, now=time.time(), log=ctx.log)
        except Exception as exc:
            ctx.log.warning("retention.error", error=str(exc)[:300], what="set-aside refs")


def apply(paths: Paths, rc: RetentionConfig, *, now: float) -> dict[str, int]:
    """Prune everything ``[retention]`` bounds; returns what was removed or trimmed (non-zero counts only)."""
    out = {
        "runs_removed": prune_dir(paths.runs_dir, max_age_s=rc.runs_max_age_days * DAY_S,
                                  max_total=int(rc.runs_max_total_mb * MB), now=now),
        "baselines_removed": prune_baselines(paths.fitness_baselines, max_age_s=rc.baselines_max_age_days * DAY_S,
                                             max_count=rc.baselines_max_count, now=now),
        "fires_trimmed": int(trim_lines(paths.fires, int(rc.fires_max_mb * MB), atomic=True)),
        # cron's shell holds cron.log open with O_APPEND: rewritten in place, so its writes still land.
        "cron_log_trimmed": int(trim_lines(paths.evolve_dir / "cron.log", int(rc.cron_log_max_mb * MB),
                                           atomic=False)),
    }
    return {k: v for k, v in out.items() if v}


def expired(refs: list[tuple[str, str, float | None]], *, now: float, keep_s: float) -> list[tuple[str, str]]:
    """(ref, sha) of the set-aside refs to drop (pure): a pruned kind, its commit older than ``keep_s``.

    ``refs``: (ref, sha, committer time) as ``for-each-ref`` lists them; 0 keeps everything, and a ref whose
    date is unknown is kept.
    """
    if keep_s <= 0:
        return []
    kinds = tuple(f"refs/evolve/{k}/" for k in SETASIDE_PRUNED)
    return [(ref, sha) for ref, sha, at in refs if ref.startswith(kinds) and at is not None and now - at > keep_s]


def prune_setaside(repo: Path, keep_days: float, *, now: float, log: Any) -> int:
    """Drop the set-aside refs older than ``keep_days`` (by the commit's committer date), each logged.

    Compare-and-swap on the sha read: a ref that moved since (re-used by a new cycle) is left alone.
    """
    if keep_days <= 0:
        return 0
    proc = run_git(repo, "for-each-ref", "--format=%(refname) %(objectname) %(committerdate:unix)", "refs/evolve/")
    if proc.returncode != 0:
        return 0
    listed = []
    for line in proc.stdout.splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            listed.append((parts[0], parts[1], float(parts[2]) if parts[2].isdigit() else None))
    dates = {ref: at for ref, _, at in listed}
    dropped = 0
    for ref, sha in expired(listed, now=now, keep_s=keep_days * DAY_S):
        if run_git(repo, "update-ref", "-d", ref, sha).returncode == 0:
            dropped += 1
            log.info("setaside.dropped", ref=ref, sha=sha, by="retention",
                     age_days=round((now - (dates[ref] or now)) / DAY_S, 1), keep_days=keep_days)
    return dropped


def _files(dfd: int) -> list[tuple[str, os.stat_result]]:
    """The regular files directly in the directory ``dfd`` (lstat: a link is never one)."""
    out = []
    for name in os.listdir(dfd):
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out.append((name, st))
    return out


def prune_dir(directory: Path, *, max_age_s: float, max_total: int, now: float) -> int:
    """Remove files older than ``max_age_s``, then the oldest until the rest fit ``max_total``; 0 = no limit."""
    try:
        dfd = open_dir(directory, create=False)
    except FileNotFoundError:
        return 0
    try:
        files = sorted(_files(dfd), key=lambda f: f[1].st_mtime, reverse=True)  # newest first
        total, removed = 0, 0
        for name, st in files:
            total += st.st_size
            too_old = max_age_s > 0 and now - st.st_mtime > max_age_s
            too_big = max_total > 0 and total > max_total
            if too_old or too_big:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)
                    removed += 1
        return removed
    finally:
        os.close(dfd)


def prune_baselines(directory: Path, *, max_age_s: float, max_count: int, now: float) -> int:
    """Remove old era baselines (``goals-<era>/``), by age and beyond the newest ``max_count``.

    The newest era is always kept: it is most likely the current one, and a baseline removed there
    would be captured again from a later (possibly worse) measurement.
    """
    try:
        dfd = open_dir(directory, create=False)
    except FileNotFoundError:
        return 0
    try:
        eras = []
        for name in os.listdir(dfd):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    eras.append((name, st.st_mtime))
        eras.sort(key=lambda e: e[1], reverse=True)
        removed = 0
        for i, (name, mtime) in enumerate(eras):
            if i == 0:
                continue
            if (max_age_s > 0 and now - mtime > max_age_s) or (max_count > 0 and i >= max_count):
                removed += _remove_era(dfd, name)
        return removed
    finally:
        os.close(dfd)


def _remove_era(dfd: int, name: str) -> int:
    """Unlink an era directory's regular files, then the directory if that emptied it; 1 when it went."""
    with _sub(dfd, name) as sub:
        for fname, _st in _files(sub):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fname, dir_fd=sub)
    try:
        os.rmdir(name, dir_fd=dfd)
    except OSError:  # something else in it (not ours to judge): left alone
        return 0
    return 1


@contextlib.contextmanager
def _sub(dfd: int, name: str) -> Iterator[int]:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=dfd)
    try:
        yield fd
    finally:
        os.close(fd)


def trim_lines(path: Path, max_bytes: int, *, atomic: bool) -> bool:
    """Keep the newest whole lines of ``path`` (a share of ``max_bytes``) once it is over ``max_bytes``.

    ``atomic``: a temp file renamed over it (readers never see it torn); otherwise it is rewritten in
    place, for a file a running writer holds open with ``O_APPEND`` (a rename would orphan its writes).
    """
    if max_bytes <= 0:
        return False
    try:
        with opened_dir(path.parent, create=False) as dfd:
            # O_APPEND: the kept lines are written at the end, never over a line a writer just added.
            fd = os.open(path.name, os.O_RDWR | os.O_APPEND | NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes:
            return False
        keep = int(max_bytes * TRIM_TO)
        tail = os.pread(fd, keep, st.st_size - keep)
        cut = tail.find(b"\n") + 1  # the first, partial line goes
        data = tail[cut:] if cut else b""
        if atomic:
            atomic_write_bytes(path, data)
        else:
            os.ftruncate(fd, 0)
            os.write(fd, data)
        return True
    finally:
        os.close(fd)
