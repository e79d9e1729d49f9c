"""Running one goal check as ``bash -c`` in its own process group with bounded output capture.

The group is killed (TERM, grace, KILL) when the check ends, times out or is aborted, so a check never leaves
a process behind; a group that survives the KILL is reported as a cleanup failure.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from evolve.procgroup import group_alive, kill_group, spawn, wait_group_gone
from evolve.sandbox import Sandbox
from evolve.work.goals.model import MeasureError

KILL_GRACE_S = 2.0  # TERM → KILL; checks are short-lived and must not hold the fire up
CAPTURE_HEAD = 8192  # bytes of combined output kept from the start...
CAPTURE_TAIL = 8192  # ...and from the end; the middle is elided before the 500-char cap anyway
STDOUT_TAIL = 4096  # enough for the last line a continuous goal prints


@dataclass
class Capture:
    """Bounded capture: head and tail of the combined stream, and the tail of stdout alone."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    stdout: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes, is_stdout: bool) -> None:
        self.total += len(chunk)
        if is_stdout:
            self.stdout.extend(chunk)
            del self.stdout[: max(0, len(self.stdout) - STDOUT_TAIL)]
        room = CAPTURE_HEAD - len(self.head)
        if room > 0:
            self.head.extend(chunk[:room])
            chunk = chunk[room:]
        if chunk:
            self.tail.extend(chunk)
            del self.tail[: max(0, len(self.tail) - CAPTURE_TAIL)]

    def combined(self) -> str:
        elided = self.total - len(self.head) - len(self.tail)
        middle = b"\n...\n" if elided > 0 else b""
        return (bytes(self.head) + middle + bytes(self.tail)).decode("utf-8", "replace")


@dataclass(frozen=True)
class CheckRun:
    returncode: int | None
    outcome: str  # "exited" | "timeout" | "aborted"
    duration_s: float
    output: str
    stdout_tail: str
    cleanup_failed: bool


def run_check(
    check: str, *, cwd: Path, env: Mapping[str, str], timeout_s: float, deadline: float, stop: threading.Event,
    sandbox: Sandbox | None = None,
) -> CheckRun:
    """One check as ``bash -c`` (argv, never a built string) in a new process group; the group dies with it."""
    start = time.monotonic()
    try:
        # stdout and stderr on pipes of their own: a continuous goal's value is stdout's last line.
        proc = spawn(["bash", "-c", check], cwd=cwd, env=env, sandbox=sandbox)
    except OSError as e:
        raise MeasureError(f"cannot start bash for goal checks in {cwd}: {e}") from e
    cap = Capture()
    outcome = "exited"
    try:
        with _Reader(proc) as reader:
            while proc.poll() is None:
                now = time.monotonic()
                if now - start >= timeout_s:
                    outcome = "timeout"
                    break
                if now >= deadline or stop.is_set():
                    outcome = "aborted"
                    break
                reader.pump(cap, 0.05)
            cleanup_failed = _reap_group(proc)
            reader.drain(cap, 1.0)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return CheckRun(
        returncode=proc.returncode,
        outcome=outcome,
        duration_s=time.monotonic() - start,
        output=cap.combined(),
        stdout_tail=bytes(cap.stdout).decode("utf-8", "replace"),
        cleanup_failed=cleanup_failed,
    )


def _reap_group(proc: subprocess.Popen[bytes]) -> bool:
    """Kill whatever is left of the check's group (TERM, grace, KILL); True when something survived."""
    pgid = proc.pid  # start_new_session: the check leads its own group
    if proc.poll() is None or group_alive(pgid):
        kill_group(pgid, KILL_GRACE_S, proc.poll)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    return not wait_group_gone(pgid, 1.0, proc.poll)


class _Reader:
    """Non-blocking reads of a child's stdout and stderr, interleaved as they arrive."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._sel = selectors.DefaultSelector()
        for stream, is_stdout in ((proc.stdout, True), (proc.stderr, False)):
            os.set_blocking(stream.fileno(), False)
            self._sel.register(stream, selectors.EVENT_READ, is_stdout)

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sel.close()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def pump(self, cap: Capture, timeout: float) -> None:
        if not self._sel.get_map():
            time.sleep(timeout)
            return
        for key, _ in self._sel.select(timeout=timeout):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                cap.add(chunk, key.data)
            else:
                self._sel.unregister(key.fileobj)

    def drain(self, cap: Capture, limit_s: float) -> None:
        """What the pipes still hold after the group is gone (bounded: an escaped daemon may keep them open)."""
        end = time.monotonic() + limit_s
        while self._sel.get_map() and time.monotonic() < end:
            self.pump(cap, 0.05)
