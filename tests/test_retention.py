"""``[retention]``: run logs capped while written; runs/, fires.jsonl, cron.log, baselines pruned at fire end."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import orjson
import pytest
from support import Env, entry, improved_step

from evolve import log, procgroup
from evolve.config import RetentionConfig
from evolve.cycle import retention
from evolve.cycle.fire import Fire, FireOptions
from evolve.errors import UnsafePathError

MB = 1 << 20
DAY = 86400.0
# 50 MB of numbered lines, in 1 MB writes: the first and the last line are recognisable.
WRITER = (
    "import sys\n"
    "out = sys.stdout.buffer\n"
    "for i in range(50):\n"
    "    out.write(b''.join(b'%08d %s\\n' % (i * 16384 + j, b'x' * 54) for j in range(16384)))\n"
    "out.write(b'THE END\\n')\n"
)


def test_a_50mb_run_log_is_capped_while_written(tmp_path: Path) -> None:
    logfile = tmp_path / "runs" / "cycle-1.log"
    logfile.parent.mkdir()
    sizes: list[int] = []
    res = procgroup.run_group(
        [sys.executable, "-c", WRITER], cwd=tmp_path, env=dict(os.environ),
        limits=procgroup.Limits(timeout_s=600, log_max_bytes=MB),
        log_path=logfile,
        on_output=lambda _chunk: sizes.append(logfile.stat().st_size),
    )
    assert res.returncode == 0
    data = logfile.read_bytes()
    assert len(data) <= MB and max(sizes) <= MB  # never more than the cap on disk, at any time
    assert data.startswith(b"00000000 ") and data.endswith(b"THE END\n")  # its head and its newest output
    assert b"[evolve: output cut here" in data


def test_run_logs_take_the_fires_cap_and_probes_are_never_cut(tmp_path: Path) -> None:
    logfile = tmp_path / "cycle-2.log"
    small = "import sys; sys.stdout.write('y' * 300000 + '\\nlast\\n')"
    with procgroup.fire_budget(lambda: 1e9, log_max_bytes=100_000):
        procgroup.run_group([sys.executable, "-c", small], cwd=tmp_path, env=dict(os.environ),
                            limits=procgroup.Limits(timeout_s=600), log_path=logfile)
        probe = procgroup.run_capture([sys.executable, "-c", small], cwd=tmp_path, env=dict(os.environ),
                                      timeout_s=600)
    assert logfile.stat().st_size <= 100_000 and logfile.read_bytes().endswith(b"last\n")
    assert len(probe) == 300006  # parsed whole by its caller: no cap


def _file(path: Path, size: int, age_days: float, now: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"z" * size)
    os.utime(path, (now - age_days * DAY, now - age_days * DAY))
    return path


def test_runs_are_pruned_by_age_then_by_total_size(env: Env) -> None:
    now = time.time()
    runs = env.paths.runs_dir
    old = _file(runs / "cycle-1.log", 10, 40, now)
    mid = [_file(runs / f"cycle-{i}.log", MB, 10 - i, now) for i in range(2, 6)]  # 8..5 days old
    new = _file(runs / "cycle-6.log", MB, 0, now)
    outside = _file(env.root / "outside.log", 10, 400, now)
    (runs / "cycle-0.log").symlink_to(outside)  # a link is never a run log to remove, nor followed
    rc = RetentionConfig(runs_max_age_days=30, runs_max_total_mb=3.5)
    removed = retention.apply(env.paths, rc, now=now)
    assert removed["runs_removed"] == 3
    assert not old.exists() and not mid[0].exists() and not mid[1].exists()
    assert mid[2].exists() and mid[3].exists() and new.exists()
    assert outside.exists() and (runs / "cycle-0.log").is_symlink()


def test_fires_journal_beyond_its_size_keeps_its_newest_lines(env: Env) -> None:
    fires = env.paths.fires
    fires.parent.mkdir(parents=True, exist_ok=True)
    lines = [orjson.dumps({"n": i, "pad": "p" * 100}) + b"\n" for i in range(30000)]  # ~3.4 MB
    fires.write_bytes(b"".join(lines))
    ino = fires.stat().st_ino
    assert retention.apply(env.paths, RetentionConfig(fires_max_mb=1), now=time.time())["fires_trimmed"] == 1
    kept = fires.read_bytes()
    assert MB * 0.5 < len(kept) <= MB
    recs = [orjson.loads(line) for line in kept.splitlines()]  # every kept line whole
    assert recs[-1]["n"] == 29999 and [r["n"] for r in recs] == list(range(recs[0]["n"], 30000))
    assert fires.stat().st_ino != ino  # replaced atomically: a reader sees the old file or the new
    assert "fires_trimmed" not in retention.apply(env.paths, RetentionConfig(fires_max_mb=1), now=time.time())


def test_cron_log_is_trimmed_in_place_so_the_running_writer_still_lands(env: Env) -> None:
    cron = env.paths.evolve_dir / "cron.log"
    cron.parent.mkdir(parents=True, exist_ok=True)
    cron.write_bytes(b"".join(b"line %d\n" % i for i in range(300000)))
    with open(cron, "ab") as writer:  # cron's `>> cron.log`, still open
        retention.apply(env.paths, RetentionConfig(cron_log_max_mb=1), now=time.time())
        writer.write(b"after the trim\n")
    data = cron.read_bytes()
    assert len(data) <= MB + 100 and data.endswith(b"line 299999\nafter the trim\n")
    assert data.split(b"\n", 1)[0].startswith(b"line ")


def test_old_baselines_go_and_the_newest_era_stays(env: Env) -> None:
    now = time.time()
    base = env.paths.fitness_baselines
    eras = []
    for i, age in enumerate((200, 150, 100, 5, 1)):
        _file(base / f"goals-{i}" / "20260101T000000Z.json", 10, age, now)
        os.utime(base / f"goals-{i}", (now - age * DAY, now - age * DAY))
        eras.append(base / f"goals-{i}")
    removed = retention.apply(env.paths, RetentionConfig(baselines_max_age_days=90, baselines_max_count=1), now=now)
    assert removed["baselines_removed"] == 4
    assert [e.exists() for e in eras] == [False, False, False, False, True]


def test_a_linked_runs_directory_is_refused_not_followed(env: Env, tmp_path: Path) -> None:
    now = time.time()
    elsewhere = tmp_path / "elsewhere"
    victim = _file(elsewhere / "precious.log", 10, 400, now)
    env.paths.runs_dir.parent.mkdir(parents=True, exist_ok=True)
    env.paths.runs_dir.symlink_to(elsewhere)
    with pytest.raises(UnsafePathError):
        retention.apply(env.paths, RetentionConfig(), now=now)
    assert victim.exists()


def test_retention_runs_at_the_end_of_every_fire(env: Env) -> None:
    now = time.time()
    stale = _file(env.paths.runs_dir / "cycle-0.log", 10, 365, now)
    env.queue(entry("a"))
    env.steps([improved_step()])
    with open(env.root / "log.jsonl", "ab") as fh:
        log.configure(json=True, stream=fh)
        Fire(env.paths, env.cfg(), FireOptions(cycles=1), env=env.env()).run()
    assert not stale.exists()
    assert b"retention.applied" in (env.root / "log.jsonl").read_bytes()
