"""Prometheus metrics in the text exposition format, for node_exporter's textfile collector.

``evolve-<repo>-<hash>.prom`` (one file per repository, :func:`textfile_name`, so repositories that
share a textfile directory never overwrite each other) is written atomically (temp file in the same
directory, fsync, rename), with no timestamps inside: alert on ``node_textfile_mtime_seconds`` staleness and on
``time() - evolve_last_success_timestamp_seconds``.

Counters over the whole ledger are kept incrementally in ``metrics-cache.json`` (the byte offset read
so far and the sums): each rewrite reads only the ledger lines appended since the last one. A ledger
that shrank or changed before that offset is read again from the start.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.paths import Paths, operator_root
from evolve.results import UNSUCCESSFUL, is_idle_poll
from evolve.status.setaside import KINDS as SETASIDE_KINDS
from evolve.status.snapshot import load_config, read_snapshot
from evolve.store.atomic import atomic_write_bytes, write_json
from evolve.timeutil import parse_iso

TEXTFILE_NAME = "evolve.prom"  # before per-repository names: removed when it is this repository's
CACHE_VERSION = 2
PROBE_BYTES = 64
CHUNK = 1 << 20

RESULTS = ("improved", "regressed", "harvested", "unchanged", "scout", "context-handoff", "quarantined", "failed",
           "interrupted", "crashed")
DURATION_BUCKETS = (30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0)
HALT_MARKERS = (("KILL", ("KILL", "KILL(global)")), ("STOP", ("STOP",)))
# evolve_status_health: the status exit code, except DORMANT (exit 0, caught up) which gets its own value.
HEALTH_VALUE = {"healthy": 0, "degraded": 1, "dormant": 2, "halted": 75}


# -- ledger counters, kept incrementally ------------------------------------------------------


@dataclass
class LedgerCounts:
    ino: int = 0
    offset: int = 0
    probe: str = ""
    results: dict[str, int] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))
    duration_sum: float = 0.0
    duration_count: int = 0
    cost_total: float = 0.0
    malformed: int = 0
    last_cycle_ts: float | None = None
    last_success_ts: float | None = None
    idle_polls: int = 0
    last_idle_poll_ts: float | None = None

    def add(self, e: dict[str, Any]) -> None:
        if is_idle_poll(e):
            # "Nothing to do" is the loop polling, not a cycle: counted apart, so cycle counts mean work.
            self.idle_polls += 1
            ts = parse_iso(e.get("timestamp"))
            if ts is not None:
                self.last_idle_poll_ts = ts if self.last_idle_poll_ts is None else max(self.last_idle_poll_ts, ts)
            return
        result = e.get("result")
        result = result if isinstance(result, str) else "unknown"
        self.results[result] = self.results.get(result, 0) + 1
        d = e.get("duration_s")
        if isinstance(d, int | float) and not isinstance(d, bool) and math.isfinite(d) and d >= 0:
            self.duration_sum += float(d)
            self.duration_count += 1
            for i, le in enumerate(DURATION_BUCKETS):
                if d <= le:
                    self.buckets[i] += 1
        c = e.get("cost_usd")
        if isinstance(c, int | float) and not isinstance(c, bool) and math.isfinite(c) and c > 0:
            self.cost_total += float(c)
        ts = parse_iso(e.get("timestamp"))
        if ts is not None:
            self.last_cycle_ts = ts if self.last_cycle_ts is None else max(self.last_cycle_ts, ts)
            if result not in UNSUCCESSFUL:
                self.last_success_ts = ts if self.last_success_ts is None else max(self.last_success_ts, ts)

    def as_json(self) -> dict[str, Any]:
        return {"version": CACHE_VERSION, **self.__dict__}

    @classmethod
    def from_json(cls, obj: Any) -> LedgerCounts | None:
        if not isinstance(obj, dict) or obj.get("version") != CACHE_VERSION:
            return None
        try:
            out = cls(**{k: v for k, v in obj.items() if k != "version"})
        except TypeError:
            return None
        if not isinstance(out.buckets, list) or len(out.buckets) != len(DURATION_BUCKETS):
            return None
        return out


def _probe(fd: int, offset: int) -> str:
    start = max(0, offset - PROBE_BYTES)
    return os.pread(fd, offset - start, start).hex()


def ledger_counts(paths: Paths, *, save_cache: bool = True) -> LedgerCounts:
    """The whole ledger's counters, reading only what was appended since the cached offset."""
    cache_path = paths.metrics_cache
    try:
        fd = os.open(paths.ledger, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return LedgerCounts()
    try:
        st = os.fstat(fd)
        try:
            cached = LedgerCounts.from_json(orjson.loads(cache_path.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            cached = None
        counts = cached
        if (
            counts is None
            or counts.ino != st.st_ino
            or counts.offset > st.st_size
            or _probe(fd, counts.offset) != counts.probe
        ):
            counts = LedgerCounts(ino=st.st_ino)
        pos = counts.offset
        carry = b""
        while True:
            chunk = os.pread(fd, CHUNK, pos + len(carry))
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            for line in data[:cut].split(b"\n"):
                if not line.strip():
                    continue
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    counts.malformed += 1
                    continue
                if isinstance(obj, dict):
                    counts.add(obj)
                else:
                    counts.malformed += 1
            pos += cut + 1
            carry = data[cut + 1:]
        changed = pos != counts.offset or cached is None
        counts.offset = pos
        counts.probe = _probe(fd, pos)
    finally:
        os.close(fd)
    if save_cache and changed and paths.evolve_dir.is_dir():
        try:
            write_json(cache_path, counts.as_json())
        except OSError:
            pass  # a cache, nothing more
    return counts


# -- ready work --------------------------------------------------------------------------------


def ready_items(paths: Paths, cfg: Any, env: Mapping[str, str], *, beads: bool = True) -> dict[str, int]:
    """Selectable items per source: the harvested queue, the tracker's ready beads, failing goals.

    A source that cannot be read is left out (it is not zero).
    """
    out: dict[str, int] = {}
    try:
        from evolve.work.harvested import entry_items, item_selectable, read_entries

        out["harvested"] = sum(
            1 for obj in read_entries(paths.nextwork) for it in entry_items(obj) if item_selectable(obj, it)
        )
    except FileNotFoundError:
        out["harvested"] = 0
    except Exception:
        pass
    if beads:
        try:
            from evolve.childenv import work_env
            from evolve.work.beads import BeadsSource

            src = BeadsSource(cfg.work.beads_command, paths.repo, timeout_s=cfg.work.probe_timeout_s,
                              env=work_env(env, cfg.work.pass_env))
            out["beads"] = len(src.candidates())
        except Exception:
            pass
    try:
        snap = orjson.loads(paths.fitness_latest.read_bytes())
        failing = snap.get("summary", {}).get("failing") if isinstance(snap, dict) else None
        if isinstance(failing, int) and not isinstance(failing, bool):
            out["goals"] = failing
    except FileNotFoundError:
        out["goals"] = 0
    except Exception:
        pass
    return out


# -- the exposition format ---------------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


class Exposition:
    """Families in order, each ``# HELP``, ``# TYPE`` and its samples."""

    def __init__(self, base_labels: Mapping[str, str]) -> None:
        self.base = dict(base_labels)
        self.lines: list[str] = []
        self.redactor = redact.current()

    def _labels(self, labels: Mapping[str, str]) -> str:
        merged = {**self.base, **labels}
        if not merged:
            return ""
        return "{" + ",".join(f'{k}="{_escape(self.redactor.text(str(v)))}"' for k, v in merged.items()) + "}"

    def family(self, name: str, kind: str, help_text: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for sample_name, labels, value in samples:
            self.lines.append(f"{sample_name}{self._labels(labels)} {_num(value)}")

    def gauge(self, name: str, help_text: str, value: float, **labels: str) -> None:
        self.family(name, "gauge", help_text, [(name, labels, value)])

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(paths: Paths, cfg: Any, env: Mapping[str, str], *, beads: bool = True, now: float | None = None) -> str:
    now = time.time() if now is None else now
    counts = ledger_counts(paths)
    snap = read_snapshot(paths, recent=1, env=env, now=now, probe_schedule=False)
    x = Exposition({"repo": str(paths.repo)})

    results = dict.fromkeys(RESULTS, 0)
    results.update(counts.results)
    x.family("evolve_cycles_total", "counter", "Cycles recorded in the ledger, by result (idle polls apart).",
             [("evolve_cycles_total", {"result": r}, n) for r, n in sorted(results.items())])
    x.family("evolve_idle_polls_total", "counter", "Fires' passes that found no work (not counted as cycles).",
             [("evolve_idle_polls_total", {}, counts.idle_polls)])
    x.gauge("evolve_last_idle_poll_timestamp_seconds", "When the newest idle poll was recorded (0 = never).",
            counts.last_idle_poll_ts or 0)
    cumulative = [(_num(le), n) for le, n in zip(DURATION_BUCKETS, counts.buckets, strict=True)]
    x.family(
        "evolve_cycle_duration_seconds", "histogram", "Agent run time of the cycles that ran an agent.",
        [("evolve_cycle_duration_seconds_bucket", {"le": le}, n) for le, n in cumulative]
        + [("evolve_cycle_duration_seconds_bucket", {"le": "+Inf"}, counts.duration_count),
           ("evolve_cycle_duration_seconds_sum", {}, counts.duration_sum),
           ("evolve_cycle_duration_seconds_count", {}, counts.duration_count)],
    )
    x.family("evolve_agent_cost_usd_total", "counter", "Agent cost in USD as reported by the agent, all cycles.",
             [("evolve_agent_cost_usd_total", {}, round(counts.cost_total, 6))])
    x.gauge("evolve_last_cycle_timestamp_seconds", "When the newest ledger entry was recorded (0 = never).",
            counts.last_cycle_ts or 0)
    x.gauge("evolve_last_success_timestamp_seconds",
            "When the newest cycle that did not fail, crash, regress or get interrupted was recorded (0 = never).",
            counts.last_success_ts or 0)
    markers = snap.markers
    x.family(
        "evolve_halted", "gauge", "1 when this operator marker halts the next fire (KILL/STOP, fresh).",
        [("evolve_halted", {"marker": label}, int(any(n in markers and not markers[n].stale for n in names)))
         for label, names in HALT_MARKERS],
    )
    x.gauge("evolve_dormant", "1 while DORMANT is present: caught up, nothing to do (not a halt).",
            int("DORMANT" in markers))
    x.gauge("evolve_handoff_pending", "1 while a HANDOFF marker waits for the next fire.", int("HANDOFF" in markers))
    x.gauge("evolve_context_streak", "Consecutive context-heavy cycles in the current agent session.",
            snap.context_streak)
    x.gauge("evolve_context_streak_limit", "Heavy cycles that trigger a context hand-off.",
            snap.context_streak_limit)
    x.gauge("evolve_breaker_open", "1 while the failure breaker is open.", int(snap.breaker.state == "open"))
    x.gauge("evolve_consecutive_failures", "Failed cycles in a row (the breaker opens at its limit).",
            snap.consecutive_failures)
    x.gauge("evolve_status_health", "evolve status: 0 healthy, 1 degraded, 2 dormant (caught up), 75 halted.",
            HEALTH_VALUE.get(snap.health, snap.exit_code))
    x.gauge("evolve_metronome_blocked",
            "1 while the metronome blocks every fire (the same work repeated) until .agents/evolve/RESCOPE is written.",
            int(snap.metronome_blocked is not None))
    x.family("evolve_setaside_refs", "gauge",
             "Refs evolve set aside under refs/evolve/, by kind (`evolve setaside` lists them).",
             [("evolve_setaside_refs", {"kind": k}, len(snap.set_aside.get(k, []))) for k in SETASIDE_KINDS])
    x.gauge("evolve_setaside_needs_operator",
            "Set-aside refs only the operator can resolve (green work that did not land): status is degraded.",
            sum(1 for a in snap.set_aside_refs if a.needs_operator))
    x.gauge("evolve_ledger_malformed_lines", "Malformed ledger lines skipped by the metrics reader.", counts.malformed)
    landing = snap.landing or {}
    x.gauge("evolve_pending_cycles", "Cycles whose green commits wait to land (refs/evolve/pending/<branch>).",
            sum(len(w.get("cycles") or []) for w in landing.get("waiting") or []))
    x.gauge("evolve_push_failing", "Branches whose last landing [git] push has not published yet (retried each fire).",
            len(landing.get("push_failing") or []))
    x.gauge("evolve_operator_busy", "1 while the operator's checkout is detached or mid-rebase/merge/bisect.",
            int(bool(landing.get("operator_busy"))))
    ready = ready_items(paths, cfg, env, beads=beads)
    x.family("evolve_items_ready", "gauge", "Selectable work items by source (a source that failed is absent).",
             [("evolve_items_ready", {"source": s}, n) for s, n in sorted(ready.items())])
    return x.text()


def textfile_name(repo: Path) -> str:
    """``evolve-<dir name>-<8 hex of the path>.prom``: readable, and distinct for two repos of one name."""
    import hashlib
    import re

    slug = re.sub(r"[^A-Za-z0-9_-]", "_", repo.name)[:40] or "repo"
    return f"evolve-{slug}-{hashlib.sha256(os.fsencode(repo)).hexdigest()[:8]}.prom"


def _drop_legacy(directory: Path, repo: Path) -> None:
    """Remove the old shared ``evolve.prom`` once this repository writes its own file, when it is ours.

    Left in place it would keep exporting frozen values next to the live ones.
    """
    legacy = directory / TEXTFILE_NAME
    try:
        if f'repo="{_escape(str(repo))}"'.encode() in legacy.read_bytes()[:4096]:
            legacy.unlink()
    except OSError:
        pass


def write_repo_textfile(directory: Path, repo: Path, text: str) -> Path:
    """This repository's textfile in ``directory`` (:func:`textfile_name`)."""
    path = write_textfile(directory, text, textfile_name(repo))
    _drop_legacy(directory, repo)
    return path


def write_textfile(directory: Path, text: str, name: str = TEXTFILE_NAME) -> Path:
    """Replace ``directory/name`` atomically: readers see the old file or the new one."""
    target = directory / name
    # Created with 0o666 less the umask, a rewrite keeps the file's mode, owner and group (so
    # node_exporter's group can keep reading it); a symlink on the way is refused.
    atomic_write_bytes(target, text.encode("utf-8"))
    return target


def textfile_dir(paths: Paths, configured: str) -> Path:
    """``[metrics] textfile_dir``, relative paths taken from the repository root; resolved once when
    outside the repository, never under it (:func:`evolve.paths.operator_root`)."""
    return operator_root(Path(os.path.expanduser(configured)), paths.repo)


def update(paths: Paths, env: Mapping[str, str], directory: Path | None = None, *, cfg: Any = None,
           beads: bool = True) -> Path | None:
    """Recompute and rewrite this repository's textfile (into ``directory`` or ``[metrics] textfile_dir``)."""
    if cfg is None:
        cfg, _ = load_config(paths, env)
    if directory is None:
        if not cfg.metrics.textfile_dir:
            return None
        directory = textfile_dir(paths, cfg.metrics.textfile_dir)
    return write_repo_textfile(directory, paths.repo, render(paths, cfg, env, beads=beads))
