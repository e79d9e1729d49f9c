"""Run a child in its own process group, with a hard timeout and a no-output idle timeout.

Timeouts, interruption and shutdown kill the whole group (TERM, grace, KILL), so an agent's own
children never outlive it. The group id is handed to ``on_start`` so it can be recorded in
session-state and reaped by a later fire if this one dies.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.secrets import redact_bytes
from evolve.store.atomic import open_artifact

GRACE_S = 5.0
LINGER_S = 1.0  # output still read after the leader exits while its background children hold the pipe


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None
    timed_out: str | None  # "hard" | "idle" | None
    interrupted: bool
    duration_s: float
    output_tail: str


def _write_redacted(log: Any, data: bytes, values: Sequence[str]) -> bytes:
    """Write the complete lines of ``data`` with secrets masked; return the unfinished rest."""
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) < 1 << 16:
        return data
    cut = cut or len(data)
    log.write(redact_bytes(data[:cut], values))
    log.flush()
    return data[cut:]


def group_alive(pgid: int) -> bool:
    """Whether the group has a member that is not a zombie.

    An orphaned zombie waits on init, which may reap it late; it must not make a finished group look alive.
    Without /proc, any member counts, zombies included.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(state not in "ZX" for state in _group_states(pgid))


def _group_states(pgid: int) -> Iterator[str]:
    """States of the processes in ``pgid`` from /proc; without /proc, report one live member."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        yield "R"
        return
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            yield fields[0]


def wait_group_gone(pgid: int, limit_s: float, reap: Callable[[], object] | None = None) -> bool:
    """Wait up to ``limit_s`` for the group to have no live member; False when it still has one.

    ``reap`` (e.g. ``Popen.poll``) is called while waiting, so our own child is collected as soon as it exits.
    """
    deadline = time.monotonic() + limit_s
    while True:
        if reap:
            reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def tagged_groups(name: str, value: str) -> set[int]:
    """The process groups of this user's processes started with ``name=value`` in their environment.

    A fire puts its id in every child's environment, so after it dies its agents, gate commands and
    whatever they started (in any group) can be found even when their group id was never recorded:
    a fire killed between starting an agent and saving its group id leaves nothing else to go by.
    Linux only (``/proc/<pid>/environ``, as it was at exec); elsewhere nothing is found.
    """
    needle = f"{name}={value}".encode()
    mine = {os.getpid(), os.getpgrp()}
    groups: set[int] = set()
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return groups
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in "ZX" and int(fields[2]) not in mine:
            groups.add(int(fields[2]))
    return groups


def kill_group(pgid: int, grace_s: float = GRACE_S, reap: Callable[[], object] | None = None) -> None:
    """TERM the group, wait up to ``grace_s`` (see :func:`wait_group_gone`), then KILL whatever is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not wait_group_gone(pgid, grace_s, reap):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def run_group(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    idle_timeout_s: float,
    log_path: Path | None = None,
    stderr_path: Path | None = None,
    stdin_path: Path | None = None,
    on_start: Callable[[int], None] | None = None,
    on_output: Callable[[bytes], None] | None = None,
    on_heartbeat: Callable[[float], None] | None = None,
    heartbeat_s: float = 30.0,
    stop: threading.Event | None = None,
    grace_s: float = GRACE_S,
    tail_bytes: int = 16 * 1024,
    redact_values: Sequence[str] = (),
) -> ProcessResult:
    """Run ``argv`` (never through a shell) and wait for it under the timeouts."""
    start = time.monotonic()
    # Agent output: owner-only, and never written through a symlink planted in the runs directory.
    log = os.fdopen(open_artifact(log_path), "ab") if log_path else None
    err = os.fdopen(open_artifact(stderr_path), "ab") if stderr_path else None
    inp = open(stdin_path, "rb") if stdin_path else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=inp if inp else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err if err else subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        if log:
            log.close()
        raise
    finally:
        for fh in (err, inp):
            if fh:
                fh.close()  # the child holds its own copy
    pgid = proc.pid  # start_new_session: the child leads its own group
    if on_start:
        on_start(pgid)
    tail = bytearray()
    timed_out: str | None = None
    interrupted = False
    last_output = time.monotonic()
    pending = b""  # a partial line waits for its newline, so a secret split across reads is still masked
    next_beat = start + heartbeat_s
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    eof = False
    exited_at: float | None = None  # when the leader was first seen gone with the pipe still open
    try:
        while True:
            now = time.monotonic()
            if timeout_s and now - start >= timeout_s:
                timed_out = "hard"
                break
            if idle_timeout_s and now - last_output >= idle_timeout_s:
                timed_out = "idle"
                break
            if stop is not None and stop.is_set():
                interrupted = True
                break
            if on_heartbeat and now >= next_beat:
                next_beat = now + heartbeat_s
                on_heartbeat(now - start)
            if eof:
                if proc.poll() is not None:
                    break
                time.sleep(0.02)
                continue
            if proc.poll() is not None:
                # Something it started in the background (a dev server, a watcher) still holds the
                # pipe: the run is over all the same. Drain briefly, then the group is killed below.
                exited_at = exited_at or now
                if now - exited_at >= LINGER_S:
                    break
            for _key, _ in sel.select(timeout=0.1):
                try:
                    chunk = os.read(proc.stdout.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    eof = True
                    break
                last_output = time.monotonic()
                tail.extend(chunk)
                if len(tail) > tail_bytes:
                    del tail[: len(tail) - tail_bytes]
                if log:
                    pending = _write_redacted(log, pending + chunk, redact_values)
                if on_output:
                    on_output(chunk)
        if timed_out or interrupted:
            kill_group(pgid, grace_s, proc.poll)
        else:
            proc.wait()
            # The leader exited; whatever it left running in its group goes too.
            if group_alive(pgid):
                kill_group(pgid, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s + 1)
    finally:
        sel.close()
        proc.stdout.close()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait()
        if log:
            if pending:
                log.write(redact_bytes(pending, redact_values))
            log.close()
    return ProcessResult(
        returncode=proc.returncode,
        timed_out=timed_out,
        interrupted=interrupted,
        duration_s=time.monotonic() - start,
        output_tail=tail.decode("utf-8", "replace"),
    )
