"""Atomic writes, files moved/saved aside, markers and the fire lock (docs/DESIGN.md §2)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from evolve.cycle.halt import sticky_state
from evolve.store import atomic
from evolve.store.atomic import atomic_write_bytes, move_aside, save_aside, write_json
from evolve.store.lock import FireLock, is_locked_by_other
from evolve.store.markers import MAX_MARKER_BYTES, Marker, read_marker, remove_marker


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- atomic_write_bytes ----------------------------------------------------------------------


def test_atomic_write_new_file_and_no_temp_left(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    atomic_write_bytes(target, b"hello")
    assert target.read_bytes() == b"hello"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert names(target.parent) == ["f.json"]


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755, 0o444])
def test_atomic_write_keeps_existing_mode(tmp_path: Path, mode: int) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    os.chmod(target, mode)
    ino = target.stat().st_ino
    atomic_write_bytes(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert target.stat().st_ino != ino  # replaced, not rewritten in place
    assert names(tmp_path) == ["f"]


def test_atomic_write_explicit_mode(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    os.chmod(target, 0o644)
    atomic_write_bytes(target, b"x", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_write_failure_mid_write_leaves_original(tmp_path: Path) -> None:
    target = tmp_path / "f"
    original = b"original \x00\xff bytes\n" * 100
    target.write_bytes(original)
    os.chmod(target, 0o640)
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == original
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert names(tmp_path) == ["f"]


def test_atomic_write_failure_at_replace_leaves_original(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    original = b'{"context_streak": 1}\n'
    target.write_bytes(original)

    def boom(src: object, dst: object, **_dir_fds: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == original
    assert names(tmp_path) == ["f"]


def test_atomic_write_failure_at_fsync_leaves_original(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"orig")

    def boom(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"orig"
    assert names(tmp_path) == ["f"]


def test_atomic_write_keyboard_interrupt_cleans_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"orig")

    def interrupt(fd: int, mode: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fchmod", interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"orig"
    assert names(tmp_path) == ["f"]


def test_write_json_is_pretty_with_trailing_newline(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    write_json(target, {"a": [1, 2], "b": None})
    data = target.read_bytes()
    assert data.endswith(b"}\n") and b"\n  " in data


# -- move_aside / save_aside ---------------------------------------------------------------


def test_move_aside_renames_with_utc_stamp(tmp_path: Path) -> None:
    f = tmp_path / "session-state.json"
    f.write_bytes(b"bad")
    moved = move_aside(f, "corrupt")
    assert not f.exists()
    assert moved.read_bytes() == b"bad"
    assert moved.parent == tmp_path
    assert re.fullmatch(r"session-state\.json\.corrupt-\d{8}T\d{6}Z", moved.name)


def test_move_aside_same_second_collisions_get_suffix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "utc_stamp", lambda ts=None: "20261129T191525Z")
    f = tmp_path / "s.json"
    moved = []
    for i in range(4):
        f.write_bytes(f"v{i}".encode())
        moved.append(move_aside(f, "corrupt"))
    assert [m.name for m in moved] == [
        "s.json.corrupt-20261129T191525Z",
        "s.json.corrupt-20261129T191525Z.1",
        "s.json.corrupt-20261129T191525Z.2",
        "s.json.corrupt-20261129T191525Z.3",
    ]
    assert [m.read_bytes() for m in moved] == [b"v0", b"v1", b"v2", b"v3"]


def test_save_aside_never_overwrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "utc_stamp", lambda ts=None: "20261129T191525Z")
    f = tmp_path / "s.json"
    f.write_bytes(b"live")
    existing = tmp_path / "s.json.invalid-20261129T191525Z"
    existing.write_bytes(b"older aside")
    a1 = save_aside(f, "invalid", b"first")
    a2 = save_aside(f, "invalid", b"\xffsecond")
    assert existing.read_bytes() == b"older aside"
    assert a1.name == "s.json.invalid-20261129T191525Z.1" and a1.read_bytes() == b"first"
    assert a2.name == "s.json.invalid-20261129T191525Z.2" and a2.read_bytes() == b"\xffsecond"
    assert f.read_bytes() == b"live"
    assert stat.S_IMODE(a1.stat().st_mode) == 0o600
    assert not [n for n in names(tmp_path) if n.endswith(".tmp")]


# -- markers ---------------------------------------------------------------------------------

NOW = 1_800_000_000.0  # integral, so mtimes set with os.utime compare exactly


def live(m: Marker, ttl_s: float) -> bool:
    """The halt gate's reading of a KILL/STOP marker (docs/DESIGN.md §2.2)."""
    return sticky_state(m, ttl_s) == "live"


def test_read_marker_absent(tmp_path: Path) -> None:
    m = read_marker(tmp_path / "KILL", NOW)
    assert not m.present and m.content == "" and m.age_s == 0.0
    assert not live(m, 10**9)
    assert not read_marker(tmp_path / "not-a-dir" / "KILL", NOW).present


def test_read_marker_absent_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    assert not read_marker(tmp_path / "file" / "KILL", NOW).present


def test_read_marker_present_reads_content_and_age(tmp_path: Path) -> None:
    p = tmp_path / "STOP"
    p.write_bytes("2026-11-29T19:15:25Z\noperator stop ✓\n".encode())
    os.utime(p, (NOW - 120, NOW - 120))
    m = read_marker(p, NOW)
    assert m.present and m.path == p
    assert m.age_s == 120
    assert m.content == "2026-11-29T19:15:25Z\noperator stop ✓\n"


def test_read_marker_empty_binary_and_huge(tmp_path: Path) -> None:
    p = tmp_path / "HANDOFF"
    p.write_bytes(b"")
    assert read_marker(p, NOW).present and read_marker(p, NOW).content == ""
    p.write_bytes(b"\xff\xfeok")
    assert read_marker(p, NOW).content == "\ufffd\ufffdok"
    p.write_bytes(b"a" * (MAX_MARKER_BYTES + 10))
    assert len(read_marker(p, NOW).content) == MAX_MARKER_BYTES


def test_read_marker_directory_counts_as_present(tmp_path: Path) -> None:
    p = tmp_path / "KILL"
    p.mkdir()
    m = read_marker(p, NOW)
    assert m.present and m.content == ""


def test_read_marker_future_mtime_is_age_zero(tmp_path: Path) -> None:
    p = tmp_path / "KILL"
    p.write_bytes(b"x")
    os.utime(p, (NOW + 3600, NOW + 3600))
    assert read_marker(p, NOW).age_s == 0.0


@pytest.mark.parametrize(
    ("age", "fresh"),
    [(0, True), (1, True), (7 * 86400 - 1, True), (7 * 86400, True), (7 * 86400 + 1, False), (30 * 86400, False)],
)
def test_marker_fresh_compares_seconds(tmp_path: Path, age: int, fresh: bool) -> None:
    ttl = 7 * 86400
    p = tmp_path / "KILL"
    p.write_bytes(b"x")
    os.utime(p, (NOW - age, NOW - age))
    m = read_marker(p, NOW)
    assert m.age_s == age
    assert live(m, ttl) is fresh


def test_marker_fresh_small_ttl(tmp_path: Path) -> None:
    """Seconds, not rounded days: with a 10 s TTL, 11 s is stale."""
    p = tmp_path / "STOP"
    p.write_bytes(b"x")
    os.utime(p, (NOW - 11, NOW - 11))
    assert not live(read_marker(p, NOW), 10)
    os.utime(p, (NOW - 10, NOW - 10))
    assert live(read_marker(p, NOW), 10)


def test_remove_marker(tmp_path: Path) -> None:
    p = tmp_path / "HANDOFF"
    assert remove_marker(p) is False
    p.write_bytes(b"x")
    assert remove_marker(p) is True
    assert not p.exists()


# -- fire lock -------------------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from evolve.store.lock import FireLock

    lock = FireLock(Path(sys.argv[1]))
    assert lock.acquire(0)
    print("locked", flush=True)
    hold = float(sys.argv[2])
    if hold < 0:
        sys.stdin.readline()
    else:
        time.sleep(hold)
    lock.release()
    print("released", flush=True)
    """
)


def start_holder(lock_path: Path, hold: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_path), str(hold)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked", proc.stderr.read() if proc.stderr else ""
    return proc


def test_lock_same_process_second_lock_cannot_acquire(tmp_path: Path) -> None:
    path = tmp_path / "evolve" / "fire.lock"
    a, b = FireLock(path), FireLock(path)
    assert path.parent.is_dir()
    assert a.acquire() and a.held
    assert not b.acquire() and not b.held
    assert not b.acquire(0.2)
    a.release()
    assert not a.held
    assert path.exists()  # never deleted
    assert b.acquire() and b.held
    assert not a.acquire()
    b.release()
    assert path.exists()


def test_lock_acquire_waits_for_release_within_wait(tmp_path: Path) -> None:
    path = tmp_path / "fire.lock"
    a, b = FireLock(path), FireLock(path)
    assert a.acquire()
    timer = threading.Timer(0.3, a.release)
    timer.start()
    try:
        t0 = time.monotonic()
        assert b.acquire(5.0)
        waited = time.monotonic() - t0
    finally:
        timer.join()
        b.release()
    assert 0.2 <= waited < 5.0


def test_lock_context_manager_releases(tmp_path: Path) -> None:
    path = tmp_path / "fire.lock"
    lock = FireLock(path)
    assert lock.acquire()
    with lock:
        assert is_locked_by_other(path)
    assert not lock.held
    assert not is_locked_by_other(path)
    lock.release()  # releasing twice is harmless
    assert path.exists()


def test_lock_other_process_blocks_us(tmp_path: Path) -> None:
    path = tmp_path / "fire.lock"
    proc = start_holder(path, -1)
    try:
        ino = path.stat().st_ino
        mine = FireLock(path)
        assert not mine.acquire()
        assert not mine.acquire(0.3)
        assert is_locked_by_other(path)
        assert proc.stdin is not None
        proc.stdin.write("release\n")
        proc.stdin.flush()
        assert proc.stdout is not None and proc.stdout.readline().strip() == "released"
        assert mine.acquire()
        assert path.stat().st_ino == ino  # same inode: the file was never deleted
        mine.release()
    finally:
        proc.kill()
        proc.wait()
    assert path.exists()


def test_lock_acquire_wait_succeeds_when_other_process_releases(tmp_path: Path) -> None:
    path = tmp_path / "fire.lock"
    proc = start_holder(path, 0.5)
    try:
        mine = FireLock(path)
        assert not mine.acquire()
        t0 = time.monotonic()
        assert mine.acquire(10.0)
        assert time.monotonic() - t0 < 10.0
        mine.release()
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert path.exists()


def test_lock_released_when_holder_process_dies(tmp_path: Path) -> None:
    path = tmp_path / "fire.lock"
    proc = start_holder(path, -1)
    assert is_locked_by_other(path)
    proc.kill()
    proc.wait()
    assert not is_locked_by_other(path)
    assert path.exists()
    mine = FireLock(path)
    assert mine.acquire()
    mine.release()


def test_other_process_cannot_take_our_lock(tmp_path: Path) -> None:
    path = tmp_path / "fire.lock"
    mine = FireLock(path)
    assert mine.acquire()
    try:
        code = "import sys; from pathlib import Path; from evolve.store.lock import FireLock, is_locked_by_other\n" \
               "p = Path(sys.argv[1]); print(FireLock(p).acquire(0.2), is_locked_by_other(p))"
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["False", "True"]
    finally:
        mine.release()


def test_is_locked_by_other_absent_file_does_not_create_it(tmp_path: Path) -> None:
    path = tmp_path / "nodir" / "fire.lock"
    assert is_locked_by_other(path) is False
    assert not path.exists()
    path.parent.mkdir()
    path.write_bytes(b"")
    assert is_locked_by_other(path) is False
    assert path.exists()


def test_sweep_temps_removes_only_old_temps_of_dead_writers(tmp_path: Path) -> None:
    from evolve.store.atomic import sweep_temps

    old = time.time() - 600
    names = {
        ".session-state.json.ab12cd_9.tmp": True,  # a dead writer's: removed
        ".next-work.jsonl.zz99yy00.tmp": True,
        ".cycle-state.json.abcdefgh.tmp": False,  # fresh: a write may be in progress
        "session-state.json": True,  # not a temp file
        ".session-state.json.short.tmp": True,  # not mkstemp's name
    }
    for name, aged in names.items():
        p = tmp_path / name
        p.write_text("x")
        if aged:
            os.utime(p, (old, old))
    (tmp_path / ".dir.abcdefgh.tmp").mkdir()  # not a regular file
    os.utime(tmp_path / ".dir.abcdefgh.tmp", (old, old))
    removed = sweep_temps(tmp_path, older_than_s=60)
    assert sorted(removed) == [".next-work.jsonl.zz99yy00.tmp", ".session-state.json.ab12cd_9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".cycle-state.json.abcdefgh.tmp", ".dir.abcdefgh.tmp", ".session-state.json.short.tmp", "session-state.json"]
    (tmp_path / ".x.jsonl.abcdefgh.tmp").write_text("x")
    os.utime(tmp_path / ".x.jsonl.abcdefgh.tmp", (old, old))
    assert sweep_temps(tmp_path, older_than_s=60, only="next-work.jsonl") == []
    assert sweep_temps(tmp_path / "missing", older_than_s=60) == []


def test_a_crashpoint_kills_at_the_chosen_occurrence_and_is_inert_otherwise(tmp_path: Path) -> None:
    import signal

    code = (
        "import sys\n"
        "from evolve import crashpoint\n"
        "for n in range(1, 4):\n"
        "    crashpoint.reached('other')\n"
        "    crashpoint.reached('point', lambda: open(sys.argv[1], 'a').write(f'mark {n}\\n'))\n"
        "    print(n, flush=True)\n"
    )
    marks = tmp_path / "marks"
    env = {k: v for k, v in os.environ.items() if k != "EVOLVE_CRASHPOINT"}
    p = subprocess.run([sys.executable, "-c", code, str(marks)], capture_output=True, text=True,
                       env={**env, "EVOLVE_CRASHPOINT": "point:2"})
    assert p.returncode == -signal.SIGKILL and p.stdout.split() == ["1"]
    assert marks.read_text() == "mark 2\n"
    p = subprocess.run([sys.executable, "-c", code, str(marks)], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and p.stdout.split() == ["1", "2", "3"]
