"""Goals: the operator's GOALS file, measuring its checks, and the snapshots and work items built from them.

``GOALS.md`` (v4: directives plus a gates table) wins over ``GOALS.yaml``/``GOALS.yml`` (v1–v3), as in the
agentops tooling (SPEC §6.3, spec notes §1.5 and §1.8). Each goal's ``check`` is a shell command from the
operator's own file; it runs as ``["bash", "-c", check]`` in its own process group with a sanitized
environment, so a check never sees API keys or evolve's own variables and never leaves a process behind.

A malformed file is a :class:`GoalsError` (a probe error, never "no work"); a measurement that could not
finish is a :class:`MeasureError`, and the caller keeps the last good snapshot.

Choices where the sources are silent:

* ``summary.score`` is the weighted pass percentage over passing+failing goals, rounded to 2 places; when
  nothing was scored (no goals, or every goal skipped) it is ``100.0``: nothing is failing, and an
  all-skipped run must not look like a collapse to a score-comparing regression check.
* Continuous goals also carry ``threshold`` in their snapshot entry (the agentops field), next to ``value``.
* A check whose leftover processes cannot be killed is recorded as ``fail`` (agentops: cleanup failure is
  an infrastructure failure and must not inherit a pass).
* A gates table is any markdown table whose header names at least ``ID``, ``Check`` and ``Weight``
  (``Description``, ``Tags`` and ``Type`` are optional); headings and tables inside code fences are ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from evolve import gitops
from evolve.store.atomic import write_json
from evolve.timeutil import utc_iso, utc_stamp
from evolve.work.item import SourceError, WorkItem, clean_text

GOALS_FILES = ("GOALS.md", "GOALS.yaml", "GOALS.yml")  # precedence order
GOAL_TYPES = ("health", "architecture", "quality", "meta")
SAFE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "TMPDIR", "TERM")
SKIP_EXIT = 77
OUTPUT_LIMIT = 500
OUTPUT_HEAD = 240
OUTPUT_TAIL = 240
KILL_GRACE_S = 2.0  # TERM → KILL; checks are short-lived and must not hold the fire up
CAPTURE_HEAD = 8192  # bytes of combined output kept from the start...
CAPTURE_TAIL = 8192  # ...and from the end; the middle is elided before the 500-char cap anyway
STDOUT_TAIL = 4096  # enough for the last line a continuous goal prints


class GoalsError(SourceError):
    """The GOALS file exists but is malformed: a probe error, never to be read as "no work"."""


class MeasureError(Exception):
    """The measurement as a whole failed (total timeout, cannot start bash): keep the last good snapshot."""


@dataclass(frozen=True)
class Goal:
    id: str
    description: str
    check: str
    weight: int
    type: str = "health"
    tags: tuple[str, ...] = ()
    continuous: dict[str, Any] | None = None  # {"metric": str, "threshold": float}


@dataclass(frozen=True)
class Directive:
    number: int
    title: str
    description: str = ""
    steer: str = ""
    directive_id: str = ""
    scenarios: str = ""


@dataclass(frozen=True)
class GoalsFile:
    path: Path
    era: str  # first 12 hex chars of sha256(file bytes): one era per content
    goals: tuple[Goal, ...]
    directives: tuple[Directive, ...]
    version: str


# --------------------------------------------------------------------------------------------------------------
# Loading


def load_goals(repo: Path) -> GoalsFile | None:
    """The repo's goals: ``GOALS.md`` first, then ``GOALS.yaml``/``.yml``; None when there is no file."""
    for name in GOALS_FILES:
        path = repo / name
        if path.exists() or path.is_symlink():
            return _load_file(path)
    return None


def _load_file(path: Path) -> GoalsFile:
    """Read the bytes once so the era hash and the parsed content describe the same file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _err(path, f"cannot read: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _err(path, f"not UTF-8 ({e.reason} at byte {e.start})") from e
    era = hashlib.sha256(data).hexdigest()[:12]
    if path.suffix.lower() == ".md":
        goals, directives = _parse_markdown(path, text)
        return GoalsFile(path=path, era=era, goals=goals, directives=directives, version="4")
    version, goals = _parse_yaml(path, text)
    return GoalsFile(path=path, era=era, goals=goals, directives=(), version=version)


def _err(path: Path, reason: str) -> GoalsError:
    """One line naming the file: the message lands in logs and blocked.jsonl as is."""
    return GoalsError(f"{path}: {' '.join(reason.split())}")


def _parse_yaml(path: Path, text: str) -> tuple[str, tuple[Goal, ...]]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _err(path, f"invalid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise _err(path, "top level must be a mapping with version and goals")
    version = doc.get("version")
    if isinstance(version, str) and version.strip().isdigit():
        version = int(version)
    if isinstance(version, bool) or version not in (1, 2, 3):
        raise _err(path, f"unsupported version {version!r} (expected 1, 2 or 3)")
    raw = doc.get("goals")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise _err(path, "goals must be a list")
    goals = []
    for i, g in enumerate(raw):
        if not isinstance(g, dict):
            raise _err(path, f"goals[{i}] must be a mapping")
        goals.append(_yaml_goal(path, i, g))
    return str(version), _unique(path, goals)


def _yaml_goal(path: Path, i: int, g: Mapping[str, Any]) -> Goal:
    gid = _goal_id(path, g.get("id"), f"goals[{i}]")
    where = f"goal {gid!r}"
    check = g.get("check")
    if not isinstance(check, str) or not check.strip():
        raise _err(path, f"{where}: missing check")
    gtype = g.get("type") or "health"
    if gtype not in GOAL_TYPES:
        raise _err(path, f"{where}: invalid type {gtype!r} (expected one of {', '.join(GOAL_TYPES)})")
    description = g.get("description")
    return Goal(
        id=gid,
        description=str(description).strip() if description not in (None, "") else gid,
        check=check.strip(),
        weight=_weight(path, where, g.get("weight")),
        type=gtype,
        tags=_tags(path, where, g.get("tags")),
        continuous=_continuous(path, where, g.get("continuous")),
    )


def _goal_id(path: Path, raw: object, where: str) -> str:
    """Any non-empty single-line id: ids are data (refs, titles), never part of a command."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    if not isinstance(raw, str) or not raw.strip():
        raise _err(path, f"{where}: missing id")
    gid = raw.strip()
    if re.search(r"[\x00-\x1f\x7f]", gid):
        raise _err(path, f"{where}: id contains control characters")
    return gid


def _weight(path: Path, where: str, raw: object) -> int:
    if isinstance(raw, str) and re.fullmatch(r"\s*\d+\s*", raw):
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 10:
        raise _err(path, f"{where}: weight must be an integer 1-10, got {raw!r}")
    return raw


def _tags(path: Path, where: str, raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list) or not all(isinstance(t, str | int) and not isinstance(t, bool) for t in raw):
        raise _err(path, f"{where}: tags must be a list of strings")
    return tuple(s for s in (_unwrap_code(str(t).strip()) for t in raw) if s)


def _continuous(path: Path, where: str, raw: object) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _err(path, f"{where}: continuous must be a mapping with metric and threshold")
    threshold = raw.get("threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)):
        raise _err(path, f"{where}: continuous.threshold must be a number")
    metric = raw.get("metric")
    return {"metric": "" if metric is None else str(metric), "threshold": threshold}


def _unique(path: Path, goals: list[Goal]) -> tuple[Goal, ...]:
    seen: set[str] = set()
    for g in goals:
        if g.id in seen:
            raise _err(path, f"duplicate goal id {g.id!r}")
        seen.add(g.id)
    return tuple(goals)


# GOALS.md (v4) --------------------------------------------------------------------------------------------------

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_DIRECTIVE = re.compile(r"^(\d+)\.\s+(.+)$")
_LABEL = re.compile(r"^(?:[-*]\s+)?\*\*\s*(steer|directive id|scenarios)\s*(?::\s*\*\*|\*\*\s*:)\s*(.*)$", re.I)
_SEPARATOR = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$")
_FENCE = re.compile(r"^(```|~~~)")


@dataclass
class _DirectiveDraft:
    number: int
    title: str
    body: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def build(self) -> Directive:
        return Directive(
            number=self.number,
            title=self.title,
            description="\n".join(self.body).strip(),
            steer=self.labels.get("steer", ""),
            directive_id=self.labels.get("directive id", ""),
            scenarios=self.labels.get("scenarios", ""),
        )


def _parse_markdown(path: Path, text: str) -> tuple[tuple[Goal, ...], tuple[Directive, ...]]:
    """One pass: gates tables anywhere, ``### N. Title`` blocks under ``## Directives``, the rest ignored."""
    lines = text.splitlines()
    goals: list[Goal] = []
    directives: list[Directive] = []
    draft: _DirectiveDraft | None = None
    section = ""
    fence: str | None = None
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        i += 1
        if fence is not None or _FENCE.match(s):
            fence = _track_fence(fence, s)
            if draft is not None:
                draft.body.append(lines[i - 1].rstrip())
            continue
        if s.startswith("|"):
            header = _split_row(s)
            if _gates_columns(header) is not None:
                i = _read_table(path, lines, i, header, goals)
                continue
        heading = _HEADING.match(s)
        if heading and len(heading.group(1)) <= 2:
            _flush(draft, directives)
            draft = None
            section = heading.group(2).strip().lower()
            continue
        if section != "directives":
            continue
        if heading and len(heading.group(1)) == 3 and (m := _DIRECTIVE.match(heading.group(2))):
            _flush(draft, directives)
            draft = _DirectiveDraft(number=int(m.group(1)), title=m.group(2).strip())
        elif draft is not None and (label := _LABEL.match(s)):
            draft.labels[label.group(1).lower()] = _unwrap_code(label.group(2).strip())
        elif draft is not None and s:
            draft.body.append(s)
    _flush(draft, directives)
    return _unique(path, goals), tuple(directives)


def _track_fence(fence: str | None, s: str) -> str | None:
    """Open a fence on ``` or ~~~, close it on the same marker; content inside is never structure."""
    m = _FENCE.match(s)
    if fence is None:
        return m.group(1) if m else None
    return None if m and m.group(1) == fence else fence


def _flush(draft: _DirectiveDraft | None, out: list[Directive]) -> None:
    if draft is not None:
        out.append(draft.build())


def _gates_columns(header: Sequence[str]) -> dict[str, int] | None:
    """Column positions when ``header`` is a gates-table header (names matched case-insensitively)."""
    names = [_unwrap_code(c.strip().strip("*").strip()).lower() for c in header]
    if not {"id", "check", "weight"} <= set(names):
        return None
    return {n: names.index(n) for n in ("id", "check", "weight", "description", "tags", "type") if n in names}


def _read_table(path: Path, lines: list[str], i: int, header: list[str], goals: list[Goal]) -> int:
    """Parse rows after the header line; returns the index of the first line after the table."""
    cols = _gates_columns(header)
    assert cols is not None
    while i < len(lines) and lines[i].strip().startswith("|"):
        s = lines[i].strip()
        i += 1
        if _SEPARATOR.match(s):
            continue
        cells = _split_row(s)
        if len(cells) != len(header):
            raise _err(path, f"line {i}: gates table row has {len(cells)} columns, the header has {len(header)}")
        goals.append(_table_goal(path, i, cells, cols))
    return i


def _table_goal(path: Path, lineno: int, cells: list[str], cols: Mapping[str, int]) -> Goal:
    def cell(name: str) -> str:
        return cells[cols[name]].strip() if name in cols else ""

    where = f"line {lineno}"
    gid = _goal_id(path, _unwrap_code(cell("id")), where)
    where = f"line {lineno}: goal {gid!r}"
    check = _unwrap_code(cell("check"))
    if not check:
        raise _err(path, f"{where}: missing check")
    gtype = cell("type").lower() or "health"
    if gtype not in GOAL_TYPES:
        raise _err(path, f"{where}: invalid type {gtype!r}")
    return Goal(
        id=gid,
        description=cell("description") or gid,
        check=check,
        weight=_weight(path, where, cell("weight")),
        type=gtype,
        tags=_tags(path, where, cell("tags") or None),
    )


def _split_row(row: str) -> list[str]:
    """Cells of a markdown table row: ``\\|`` is a literal pipe, and a ``|`` inside a code span never splits."""
    s = row.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and s.startswith("|", i + 1):
            cur.append("|")
            i += 2
        elif ch == "`":
            end = _code_span_end(s, i)
            cur.append(s[i:end].replace("\\|", "|") if end > i + 1 else "`")
            i = max(end, i + 1)
        elif ch == "|":
            cells.append("".join(cur).strip())
            cur = []
            i += 1
        else:
            cur.append(ch)
            i += 1
    cells.append("".join(cur).strip())
    return cells


def _code_span_end(s: str, i: int) -> int:
    """End index of the code span opened by the backtick run at ``i`` (``i + run`` when it never closes)."""
    run = len(s[i:]) - len(s[i:].lstrip("`"))
    j = i + run
    while (k := s.find("`" * run, j)) != -1:
        after = k + run
        if (k == 0 or s[k - 1] != "`") and (after >= len(s) or s[after] != "`"):
            return after
        j = after + len(s[after:]) - len(s[after:].lstrip("`"))
    return i + run if run > 1 else i + 1


def _unwrap_code(cell: str) -> str:
    """Drop the backticks only when the whole cell is one code span: two spans joined by ``&&`` stay as written."""
    run = len(cell) - len(cell.lstrip("`"))
    if run == 0 or len(cell) < 2 * run + 1 or not cell.endswith("`" * run) or cell.endswith("`" * (run + 1)):
        return cell
    inner = cell[run:-run]
    if "`" * run in inner and re.search(rf"(?<!`){'`' * run}(?!`)", inner):
        return cell
    if inner.startswith(" ") and inner.endswith(" ") and inner.strip():
        inner = inner[1:-1]
    return inner.strip()


# --------------------------------------------------------------------------------------------------------------
# Measuring


@dataclass
class _Capture:
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
class _Run:
    returncode: int | None
    outcome: str  # "exited" | "timeout" | "aborted"
    duration_s: float
    output: str
    stdout_tail: str
    cleanup_failed: bool


def measure(
    repo: Path,
    gf: GoalsFile,
    *,
    goal_timeout_s: float,
    total_timeout_s: float,
    env: Mapping[str, str] | None = None,
    parallel: int = 2,
    now: float | None = None,
) -> dict[str, Any]:
    """Run every check (meta goals first, one at a time; then the rest, ``parallel`` at once) into a snapshot.

    Raises MeasureError when the total timeout passes before every goal finished: a partial snapshot
    would read as a regression, so the caller keeps the last good one instead.
    """
    deadline = time.monotonic() + total_timeout_s
    stop = threading.Event()
    check_env = sanitized_env(env)
    results: list[_Run | None] = [None] * len(gf.goals)

    def run(i: int) -> _Run | None:
        if stop.is_set() or time.monotonic() >= deadline:
            return None  # the total budget is spent: do not start
        return _run_check(gf.goals[i].check, cwd=repo, env=check_env, timeout_s=goal_timeout_s,
                          deadline=deadline, stop=stop)

    try:
        for i, g in enumerate(gf.goals):
            if g.type == "meta":
                results[i] = run(i)
        with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="goal-check") as pool:
            try:
                futures = {i: pool.submit(run, i) for i, g in enumerate(gf.goals) if g.type != "meta"}
                for i, fut in futures.items():
                    results[i] = fut.result()
            finally:
                stop.set()  # on any exception, running checks kill their groups and pending ones never start
    finally:
        stop.set()
    finished = [r for r in results if r is not None and r.outcome != "aborted"]
    if len(finished) != len(results):
        unfinished = [g.id for g, r in zip(gf.goals, results, strict=True) if r is None or r.outcome == "aborted"]
        raise MeasureError(f"goal measurement exceeded the total timeout of {total_timeout_s:g}s; "
                           f"unfinished: {', '.join(unfinished[:10])}")
    entries = [_entry(g, r) for g, r in zip(gf.goals, finished, strict=True)]
    return {
        "timestamp": utc_iso(now),
        "git_sha": _git_sha(repo),
        "goals_era": gf.era,
        "goals": entries,
        "summary": _summary(entries),
    }


def sanitized_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Only locale, identity and PATH: a check must never see API keys or EVOLVE_* settings."""
    source = os.environ if env is None else env
    clean = {k: source[k] for k in SAFE_ENV_KEYS if k in source}
    clean.setdefault("PATH", os.defpath)
    return clean


def _git_sha(repo: Path) -> str | None:
    try:
        return gitops.head(repo)
    except OSError:
        return None


def _entry(goal: Goal, run: _Run) -> dict[str, Any]:
    output = run.output
    if run.outcome == "timeout":
        output = f"{output}\n[timed out; process group killed]".strip()
    if run.cleanup_failed:
        output = f"{output}\n[process-tree cleanup failed: processes left in the check's group]".strip()
    entry: dict[str, Any] = {
        "goal_id": goal.id,
        "result": _classify(run),
        "weight": goal.weight,
        "duration_s": round(run.duration_s, 3),
        "output": cap_output(output),
        "tags": list(goal.tags),
    }
    if goal.continuous is not None:
        entry["value"] = _parse_value(run.stdout_tail)
        entry["threshold"] = goal.continuous.get("threshold")
    return entry


def _classify(run: _Run) -> str:
    if run.cleanup_failed:
        return "fail"
    if run.outcome == "timeout" or run.returncode == SKIP_EXIT:
        return "skip"
    return "pass" if run.returncode == 0 else "fail"


def _summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the weighted pass percentage over scored (non-skipped) goals; 100.0 when none scored."""
    passing = [e for e in entries if e["result"] == "pass"]
    failing = [e for e in entries if e["result"] == "fail"]
    scored = sum(e["weight"] for e in passing) + sum(e["weight"] for e in failing)
    score = 100.0 if scored == 0 else round(100.0 * sum(e["weight"] for e in passing) / scored, 2)
    return {
        "total": len(entries),
        "passing": len(passing),
        "failing": len(failing),
        "skipped": len(entries) - len(passing) - len(failing),
        "score": score,
    }


_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def strip_control(text: str) -> str:
    """Printable text with newlines and tabs kept: escape sequences and other controls removed."""
    return _CONTROL.sub("", _ANSI.sub("", text.replace("\r\n", "\n")))


def cap_output(text: str) -> str:
    """At most OUTPUT_LIMIT characters: the head names the failure, the tail often says how to fix it."""
    s = strip_control(text).strip()
    if len(s) <= OUTPUT_LIMIT:
        return s
    return s[:OUTPUT_HEAD] + "…" + s[-OUTPUT_TAIL:]


def _parse_value(stdout_tail: str) -> float | None:
    """A continuous goal's value: its stdout's last non-empty line as a finite float, else None."""
    lines = [ln.strip() for ln in stdout_tail.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        value = float(lines[-1])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _run_check(
    check: str, *, cwd: Path, env: Mapping[str, str], timeout_s: float, deadline: float, stop: threading.Event
) -> _Run:
    """One check as ``bash -c`` (argv, never a built string) in a new process group; the group dies with it."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", "-c", check],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise MeasureError(f"cannot start bash for goal checks in {cwd}: {e}") from e
    cap = _Capture()
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
    return _Run(
        returncode=proc.returncode,
        outcome=outcome,
        duration_s=time.monotonic() - start,
        output=cap.combined(),
        stdout_tail=bytes(cap.stdout).decode("utf-8", "replace"),
        cleanup_failed=cleanup_failed,
    )


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

    def pump(self, cap: _Capture, timeout: float) -> None:
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

    def drain(self, cap: _Capture, limit_s: float) -> None:
        """What the pipes still hold after the group is gone (bounded: an escaped daemon may keep them open)."""
        end = time.monotonic() + limit_s
        while self._sel.get_map() and time.monotonic() < end:
            self.pump(cap, 0.05)


def _reap_group(proc: subprocess.Popen[bytes]) -> bool:
    """Kill whatever is left of the check's group (TERM, grace, KILL); True when something survived."""
    pgid = proc.pid  # start_new_session: the check leads its own group
    if proc.poll() is None or _group_live(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        if not _wait_for(lambda: proc.poll() is not None and not _group_live(pgid), KILL_GRACE_S):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    return not _wait_for(lambda: proc.poll() is not None and not _group_live(pgid), 1.0)


def _wait_for(cond: Callable[[], bool], limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


def _group_live(pgid: int) -> bool:
    """Whether the group has a member that is not a zombie (an orphaned zombie waits on init, not on us)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(state not in "ZX" for state in _proc_group_states(pgid))


def _proc_group_states(pgid: int) -> Iterator[str]:
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
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            yield fields[0]


# --------------------------------------------------------------------------------------------------------------
# Snapshots and baselines


def snapshot_path(evolve_dir: Path) -> Path:
    return evolve_dir / "fitness-latest.json"


def write_snapshot(path: Path, snap: dict[str, Any]) -> None:
    """Atomic: a reader (or a crash) sees the previous snapshot or this one, never half of one."""
    write_json(path, snap)


def read_snapshot(path: Path) -> dict[str, Any] | None:
    """The snapshot, or None when it is missing or not one (not JSON, or ``goals`` not a list)."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("goals"), list):
        return None
    return obj


def capture_baseline(evolve_dir: Path, gf: GoalsFile, snap: dict[str, Any]) -> Path | None:
    """The era's first snapshot, kept as its baseline; None (nothing written) when the era already has one."""
    era_dir = evolve_dir / "fitness-baselines" / f"goals-{gf.era}"
    if era_dir.is_dir() and any(era_dir.glob("*.json")):
        return None
    path = era_dir / f"{utc_stamp()}.json"
    write_json(path, snap)
    return path


# --------------------------------------------------------------------------------------------------------------
# Work items


def _results(snap: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    goals = snap.get("goals") if isinstance(snap, Mapping) else None
    if not isinstance(goals, list):
        return {}
    return {str(e["goal_id"]): e for e in goals if isinstance(e, dict) and "goal_id" in e}


def failing_goals(snap: dict[str, Any], gf: GoalsFile) -> list[Goal]:
    """Goals of the current file whose latest result is ``fail``, heaviest first, then by id."""
    latest = _results(snap)
    failing = [g for g in gf.goals if latest.get(g.id, {}).get("result") == "fail"]
    return sorted(failing, key=lambda g: (-g.weight, g.id))


def severity_for(weight: int) -> str:
    return "high" if weight >= 7 else "medium" if weight >= 4 else "low"


def goal_item(goal: Goal, snap_entry: dict[str, Any] | None) -> WorkItem:
    """A failing goal as work: the agent gets the check to make pass and what it printed last time."""
    output = snap_entry.get("output") if isinstance(snap_entry, dict) else None
    parts = [f"Make the goal check pass (exit 0): {goal.check}"]
    if isinstance(output, str) and output.strip():
        parts.append(f"Last output:\n{cap_output(output)}")
    return WorkItem(
        source="goal",
        ref=f"goal:{goal.id}",
        title=clean_text(f"Fix failing goal {goal.id}: {goal.description}"),
        description="\n\n".join(parts),
        type="goal",
        severity=severity_for(goal.weight),
        data={"goal_id": goal.id, "weight": goal.weight, "check": goal.check},
    )


def directive_item(d: Directive, era: str) -> WorkItem:
    """A GOALS.md directive as work; ``era`` ties it to the file content it was read from."""
    parts = [strip_control(d.description).strip()]
    if d.steer:
        parts.append(f"Steer: {d.steer}")
    if d.scenarios:
        parts.append(f"Scenarios: {d.scenarios}")
    return WorkItem(
        source="directive",
        ref=f"directive:{d.directive_id or d.number}",
        title=clean_text(f"Directive {d.number}: {d.title}"),
        description="\n\n".join(p for p in parts if p),
        type="directive",
        data={"number": d.number, "era": era, "directive_id": d.directive_id, "steer": d.steer,
              "scenarios": d.scenarios},
    )
