"""Children in their own process groups: start, watch, kill, and find them again after a crash.

Every child a fire starts (the agent, gate commands, goal checks, the governor, notify commands,
generators and the tracker) is started by :func:`spawn` (most through :func:`run_group` or
:func:`run_capture`), with a hard timeout, and with the fire's environment, which carries
``EVOLVE_FIRE_ID``. Timeouts, interruption and shutdown kill the whole group (TERM, grace, KILL),
so a child's own children never outlive it. The group id is handed to ``on_start`` so it can be
recorded in session-state and reaped by a later fire if this one dies.

The process layer (docs/DESIGN.md §13): above ``store`` (run logs are opened through it), below
``work``, ``agent`` and ``cycle``, which all use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evolve.redact import Redactor, current
from evolve.sandbox import Sandbox
from evolve.store.atomic import open_artifact

FIRE_TAG = "EVOLVE_FIRE_ID"  # a fire's id, in the environment of every child it starts (see tagged_groups)
GRACE_S = 5.0
LINGER_S = 1.0  # output still read after the leader exits while its background children hold the pipe


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None
    timed_out: str | None  # "hard" | "idle" | None
    interrupted: bool
    duration_s: float
    output_tail: str


def _write_redacted(log: Any, data: bytes, redactor: Redactor) -> bytes:
    """Write the complete lines of ``data`` with secrets masked; return the unfinished rest.

    A private-key block spans lines: one begun but not yet ended waits (up to 256 KiB) for its end.
    """
    cut = data.rfind(b"\n") + 1
    if cut and len(data) < 1 << 18:
        pem = redactor.unclosed_pem(data[:cut].decode("utf-8", "surrogateescape"))
        if pem >= 0:
            cut = len(data[:cut].decode("utf-8", "surrogateescape")[:pem].encode("utf-8", "surrogateescape"))
    if cut == 0 and len(data) < 1 << 16:
        return data
    cut = cut or len(data)
    log.write(redactor.bytes(data[:cut]))
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


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a fire or the daemon the way SIGTERM does (docs/DESIGN.md §12.2).

    SIGHUP (the terminal or ssh session went away) is one of them: left at its default it would end
    evolve at once, with no ``interrupted`` entry and the agent, in a session of its own, still
    running and writing. A SIGHUP that was already ignored when evolve started (``nohup``) stays
    ignored: whoever started it asked for the hang-up to be survived.
    """
    sigs = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    return tuple(sigs)


def kill_group(pgid: int, grace_s: float = GRACE_S, reap: Callable[[], object] | None = None) -> None:
    """TERM the group, wait up to ``grace_s`` (see :func:`wait_group_gone`), then KILL whatever is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not wait_group_gone(pgid, grace_s, reap):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


STEP_GRACE_S = 60.0  # a step started near the end of a fire's budget still gets this long (a commit, a report)
# What is left of the running fire's budget (``fire.max_minutes``): every child started in this
# context gets no more than that plus STEP_GRACE_S, whatever its own timeout says (docs/DESIGN.md §12).
_REMAINING: contextvars.ContextVar[Callable[[], float] | None] = contextvars.ContextVar(
    "evolve_remaining", default=None
)
# The fire's ``[retention] run_log_max_mb``, in bytes (0 = none): the size a run log is kept under.
_LOG_CAP: contextvars.ContextVar[int] = contextvars.ContextVar("evolve_log_cap", default=0)
# Told whenever a child starts, beats (every Limits.heartbeat_s) or ends: the daemon's watchdog
# pings only while its fires make progress (docs/DESIGN.md §12).
_PROGRESS: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("evolve_progress", default=None)
# The sandbox the fire runs repository and agent code in (docs/DESIGN.md §8.6); None: unsandboxed.
_SANDBOX: contextvars.ContextVar[Sandbox | None] = contextvars.ContextVar("evolve_sandbox", default=None)


@contextlib.contextmanager
def sandboxed(box: Sandbox | None) -> Iterator[None]:
    """Children started in this context (this thread) with ``sandbox=contained()`` run inside ``box``."""
    token = _SANDBOX.set(box)
    try:
        yield
    finally:
        _SANDBOX.reset(token)


def contained() -> Sandbox | None:
    """The fire's sandbox for a child that runs repository or agent code (the agent, gate commands,
    workspace setup, the gate probe, goal checks); None outside a fire or when none is in force.
    A thread the fire starts asks in the fire's thread and passes the answer on."""
    return _SANDBOX.get()


@contextlib.contextmanager
def progress_hook(hook: Callable[[], None]) -> Iterator[None]:
    """Call ``hook`` (cheap, never raising) at every start, heartbeat and end of a child run in this context."""
    token = _PROGRESS.set(hook)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def progressed() -> None:
    """Report progress to the context's hook, if any."""
    hook = _PROGRESS.get()
    if hook is not None:
        hook()


@contextlib.contextmanager
def fire_budget(remaining: Callable[[], float], *, log_max_bytes: int = 0) -> Iterator[None]:
    """Cap every child started in this context (this thread) by ``remaining()`` seconds plus the grace,
    and every run log it writes (:attr:`Limits.log_max_bytes` None) at ``log_max_bytes``."""
    tokens = (_REMAINING.set(remaining), _LOG_CAP.set(log_max_bytes))
    try:
        yield
    finally:
        _LOG_CAP.reset(tokens[1])
        _REMAINING.reset(tokens[0])


def capped(timeout_s: float | None) -> float:
    """``timeout_s`` (0 or None = none) limited by the fire's remaining budget; 0 when nothing limits it."""
    limit = timeout_s or float("inf")
    remaining = _REMAINING.get()
    if remaining is not None:
        limit = min(limit, max(remaining(), 0.0) + STEP_GRACE_S)
    return 0.0 if limit == float("inf") else limit


@dataclass(frozen=True)
class Limits:
    """How long a child may run and how it is stopped: one value, so every caller states them together."""

    timeout_s: float  # hard wall-clock limit; 0 = none
    idle_timeout_s: float = 0.0  # no output for this long ends the run; 0 = none
    grace_s: float = GRACE_S  # TERM → KILL
    heartbeat_s: float = 30.0
    tail_bytes: int = 16 * 1024  # of the output kept in ProcessResult.output_tail
    log_max_bytes: int | None = None  # the log's size cap (CappedLog); None = the fire's, 0 = none


class CappedLog:
    """A run log that never grows past ``max_bytes``: its head is kept, and after it the newest output.

    One runaway cycle once wrote a 1 GB log. When a write would cross the cap the file is cut back
    to its head (half the cap), a marker line says so, and the newest output (up to a quarter of the
    cap, at most 1 MiB, kept in memory) follows; appends go on from there. The file stays readable
    while written (``tail -f``), and no more than the cap is ever on disk.
    """

    def __init__(self, fh: Any, max_bytes: int) -> None:
        self.fh = fh
        self.max = max_bytes
        self.size = os.fstat(fh.fileno()).st_size  # appending to a log an earlier run began
        self.keep = min(max_bytes // 4, 1 << 20)
        self.recent = bytearray()
        self.head_end: int | None = None  # where the kept head (and its marker) ends, once cut

    def write(self, data: bytes) -> None:
        self.recent += data
        if len(self.recent) > self.keep:
            del self.recent[: len(self.recent) - self.keep]
        if self.size + len(data) <= self.max:
            self.fh.write(data)
            self.size += len(data)
            return
        self.fh.flush()
        if self.head_end is None:
            head = min(self.size, self.max // 2)
            mark = f"\n[evolve: output cut here; this log keeps its first {head} bytes and the newest]\n".encode()
            os.ftruncate(self.fh.fileno(), head)
            self.fh.write(mark)  # O_APPEND: lands at the new end
            self.head_end = head + len(mark)
        else:
            os.ftruncate(self.fh.fileno(), self.head_end)
        self.fh.write(bytes(self.recent))  # the newest output, this write's included
        self.fh.flush()
        self.size = self.head_end + len(self.recent)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path | None,
    env: Mapping[str, str],
    stdin: Any = subprocess.DEVNULL,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
    sandbox: Sandbox | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (never through a shell) as the leader of a new process group.

    The one place evolve starts a child it must be able to stop: its own session makes the group id
    the child's pid, so :func:`kill_group` reaches everything it starts, and ``env`` (a fire's, with
    ``EVOLVE_FIRE_ID``) lets :func:`tagged_groups` find its leftovers after a crash. With ``sandbox``
    the child starts inside it (bwrap leads the group; it keeps no session of its own, §8.6).
    """
    return subprocess.Popen(
        sandbox.wrap(argv) if sandbox is not None else list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        close_fds=True,
    )


def _start(
    argv: Sequence[str],
    cwd: Path | None,
    env: Mapping[str, str],
    log: Any,
    stderr_path: Path | None,
    stdin_path: Path | None,
    sandbox: Sandbox | None = None,
) -> subprocess.Popen[bytes]:
    """:func:`spawn` with stdout on a pipe, stderr to ``stderr_path`` (or stdout), stdin from ``stdin_path``."""
    err = os.fdopen(open_artifact(stderr_path), "ab") if stderr_path else None
    inp = open(stdin_path, "rb") if stdin_path else None  # noqa: SIM115 - closed below
    try:
        return spawn(
            argv,
            cwd=cwd,
            env=env,
            stdin=inp if inp else subprocess.DEVNULL,
            stderr=err if err else subprocess.STDOUT,
            sandbox=sandbox,
        )
    except OSError:
        if log:
            log.close()
        raise
    finally:
        for fh in (err, inp):
            if fh:
                fh.close()  # the child holds its own copy


class _Output:
    """What a run's stdout becomes: a bounded tail, the redacted log, the caller's ``on_output``."""

    def __init__(
        self, log: Any, tail_bytes: int, redactor: Redactor, on_output: Callable[[bytes], None] | None
    ) -> None:
        self.log = log
        self.tail_bytes = tail_bytes
        self.redactor = redactor
        self.on_output = on_output
        self.tail = bytearray()
        self.last = time.monotonic()  # when output last arrived (the idle timeout)
        self.pending = b""  # a partial line waits for its newline, so a secret split across reads is still masked

    def read(self, sel: selectors.BaseSelector, fd: int) -> bool:
        """Read what is ready (waiting up to 0.1 s); True at end of file."""
        for _key, _ in sel.select(timeout=0.1):
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return True
            self.last = time.monotonic()
            self.tail.extend(chunk)
            if len(self.tail) > self.tail_bytes:
                del self.tail[: len(self.tail) - self.tail_bytes]
            if self.log:
                self.pending = _write_redacted(self.log, self.pending + chunk, self.redactor)
            if self.on_output:
                self.on_output(chunk)
        return False

    def close(self) -> None:
        if self.log:
            if self.pending:
                self.log.write(self.redactor.bytes(self.pending))  # the run log's one sink
            self.log.close()


def _watch(
    proc: subprocess.Popen[bytes],
    out: _Output,
    start: float,
    limits: Limits,
    stop: threading.Event | None,
    on_heartbeat: Callable[[float], None] | None,
) -> tuple[str | None, bool]:
    """Pump the output until the run ends: ``(timed_out, interrupted)`` ("hard" | "idle" | None)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    next_beat = start + limits.heartbeat_s
    eof = False
    exited_at: float | None = None  # when the leader was first seen gone with the pipe still open
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if limits.timeout_s and now - start >= limits.timeout_s:
                return "hard", False
            if limits.idle_timeout_s and now - out.last >= limits.idle_timeout_s:
                return "idle", False
            if stop is not None and stop.is_set():
                return None, True
            if now >= next_beat:
                next_beat = now + limits.heartbeat_s
                progressed()  # the watch is alive, and the child bounded by its (capped) timeout
                if on_heartbeat:
                    on_heartbeat(now - start)
            if eof:
                if proc.poll() is not None:
                    return None, False
                time.sleep(0.02)
                continue
            if proc.poll() is not None:
                # Something it started in the background (a dev server, a watcher) still holds the
                # pipe: the run is over all the same. Drain briefly, then the group is killed after.
                exited_at = exited_at or now
                if now - exited_at >= LINGER_S:
                    return None, False
            eof = out.read(sel, fd)


def run_group(
    argv: Sequence[str],
    *,
    cwd: Path | None,
    env: Mapping[str, str],
    limits: Limits,
    log_path: Path | None = None,
    stderr_path: Path | None = None,
    stdin_path: Path | None = None,
    on_start: Callable[[int], None] | None = None,
    on_output: Callable[[bytes], None] | None = None,
    on_heartbeat: Callable[[float], None] | None = None,
    stop: threading.Event | None = None,
    redactor: Redactor | None = None,
    sandbox: Sandbox | None = None,
) -> ProcessResult:
    """Run ``argv`` (never through a shell) in its own process group and wait for it under ``limits``.

    Stdout (and stderr, unless ``stderr_path``) is kept as a tail and written, redacted, to ``log_path``.
    """
    start = time.monotonic()
    limits = replace(limits, timeout_s=capped(limits.timeout_s))  # no child outlives the fire's budget
    # Agent output: owner-only, and never written through a symlink planted in the runs directory.
    log: Any = os.fdopen(open_artifact(log_path), "ab") if log_path else None
    cap = _LOG_CAP.get() if limits.log_max_bytes is None else limits.log_max_bytes
    if log is not None and cap > 0:
        log = CappedLog(log, cap)
    proc = _start(argv, cwd, env, log, stderr_path, stdin_path, sandbox)
    pgid = proc.pid  # start_new_session: the child leads its own group
    progressed()
    out = _Output(log, limits.tail_bytes, redactor or current(), on_output)
    assert proc.stdout is not None
    try:
        if on_start:  # inside: when recording the group fails (a full disk), the child is killed below
            on_start(pgid)
        timed_out, interrupted = _watch(proc, out, start, limits, stop, on_heartbeat)
        if timed_out or interrupted:
            kill_group(pgid, limits.grace_s, proc.poll)
        else:
            proc.wait()
            # The leader exited; whatever it left running in its group goes too.
            if group_alive(pgid):
                kill_group(pgid, limits.grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=limits.grace_s + 1)
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait()
        out.close()
        progressed()
    return ProcessResult(
        returncode=proc.returncode,
        timed_out=timed_out,
        interrupted=interrupted,
        duration_s=time.monotonic() - start,
        output_tail=out.tail.decode("utf-8", "replace"),
    )


class CaptureError(Exception):
    """A captured command could not run, timed out or failed; the message says which (for a log line)."""


def run_capture(argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout_s: float) -> bytes:
    """Stdout of a short command (a probe) run in its own process group; any failure is a CaptureError."""
    with tempfile.TemporaryDirectory(prefix="evolve-probe-") as tmp:
        d = Path(tmp).resolve()  # our private dir, canonical: the writers follow no link (TMPDIR may be one)
        out, err = d / "out", d / "err"
        try:
            res = run_group(
                argv,
                cwd=cwd,
                env=env,
                # Never capped: a probe's output is parsed whole (a cut JSON list is no list).
                limits=Limits(timeout_s=timeout_s, grace_s=1.0, tail_bytes=0, log_max_bytes=0),
                log_path=out,
                stderr_path=err,
            )
        except OSError as exc:
            raise CaptureError(f"cannot run {argv[0]}: {exc}") from exc
        if res.timed_out:
            raise CaptureError(f"{argv[0]} timed out after {timeout_s:g}s")
        if res.returncode != 0:
            detail = err.read_bytes()[-300:].decode(errors="replace").strip() if err.exists() else ""
            raise CaptureError(f"{' '.join(argv[:2])} exited {res.returncode}: {detail}".strip())
        return out.read_bytes() if out.exists() else b""
