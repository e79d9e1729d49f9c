"""Fire observers: notifications, the metrics textfile, and the fire journal the morning report reads.

``observers_for(cfg, paths)`` builds them from the config; ``evolve fire`` and ``evolve daemon`` pass
the list to :class:`evolve.cycle.fire.Fire`. Every observer is best effort: it logs what went wrong
and never changes a fire's outcome or exit code.

- **notify**: ``[notify] command`` (an argv, never a shell) runs on ``halt``, ``halt.end``,
  ``breaker.open``, ``handoff.written``, ``regression``, ``metronome.blocked`` (a stall starts: RESCOPE
  needed) and ``preflight.failed`` (the runner is misconfigured: the fire exits 78) with the event as
  one JSON object on stdin,
  in its own process group (tagged with the fire's id), killed after ``[notify] timeout_s``. Halts
  are notified on their edges (:func:`halt_edge`): when one starts or changes reason, and
  ``halt.end`` when a fire gets past Step 1 again; not at every fire that finds the same halt.
- **metrics**: with ``[metrics] textfile_dir`` set, the repository's textfile is rewritten after every fire.
- **journal**: one line per fire in ``.agents/evolve/fires.jsonl`` (when it ended, why, how many
  cycles, the halt and its detail), so the report can show fires that ran no cycle.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.childenv import BASE, FIRE
from evolve.childenv import child_env as allowed_env
from evolve.paths import Paths
from evolve.procgroup import FIRE_TAG, Limits, run_group
from evolve.store.atomic import read_json, write_json
from evolve.store.dirfd import open_file
from evolve.timeutil import utc_iso

Observer = Callable[[str, dict[str, Any]], None]
NOTIFY_EVENTS = frozenset(
    {"halt", "halt.end", "breaker.open", "handoff.written", "regression", "metronome.blocked", "preflight.failed",
     "guard.refused"}
)
MAX_STDIN = 64 * 1024
GRACE_S = 1.0  # TERM → KILL after a timeout: a notifier is a webhook call, nothing to shut down cleanly


def _say(level: str, event: str, **fields: Any) -> None:
    """Log, best effort: an observer must not fail because logging does."""
    try:
        from evolve import log

        getattr(log.get("evolve.notify"), level)(event, **fields)
    except Exception:
        pass


@dataclass(frozen=True)
class NotifyResult:
    ok: bool
    exit_code: int | None = None
    timed_out: bool = False
    error: str = ""


def run_notify(
    argv: Sequence[str], payload: Mapping[str, Any], *, timeout_s: float, cwd: Path | None = None,
    env: Mapping[str, str] | None = None, pass_env: Sequence[str] = (),
) -> NotifyResult:
    """Run ``argv`` with ``payload`` as JSON on stdin; kill its process group after ``timeout_s``.

    It runs like every other child of a fire (:func:`evolve.procgroup.run_group`): in its own group,
    which goes when it ends, and tagged with the fire's id, so a fire that dies meanwhile leaves
    nothing the next one cannot find.
    """
    # The sink: redacted before the cap, so a cut can never leave a secret's prefix behind.
    body = redact.current().json(orjson.loads(orjson.dumps(dict(payload), default=str)))
    data = orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)[:MAX_STDIN]
    # The event is on stdin; a webhook URL or token variable comes only when listed in [notify] pass_env.
    child_env = allowed_env(env, (*BASE, *FIRE), pass_env)
    child_env["EVOLVE_EVENT"] = str(payload.get("event", ""))
    if payload.get("repo"):
        child_env["EVOLVE_REPO"] = str(payload["repo"])
    if payload.get("fire_id"):
        child_env[FIRE_TAG] = str(payload["fire_id"])
    with tempfile.TemporaryDirectory(prefix="evolve-notify-") as tmp:
        tmp = os.path.realpath(tmp)  # our own private dir: canonical, so the no-symlink writers take it
        stdin, stderr = Path(tmp) / "stdin", Path(tmp) / "stderr"
        stdin.write_bytes(data)
        try:
            res = run_group(
                argv,
                cwd=cwd,
                env=child_env,
                limits=Limits(timeout_s=timeout_s, grace_s=GRACE_S, tail_bytes=0),
                stdin_path=stdin,
                stderr_path=stderr,
            )
        except (OSError, ValueError) as exc:
            return NotifyResult(False, error=f"{type(exc).__name__}: {exc}"[:300])
        err = stderr.read_bytes() if stderr.exists() else b""
    if res.timed_out:
        return NotifyResult(False, res.returncode, timed_out=True, error=f"timed out after {timeout_s:g}s")
    if res.returncode != 0:
        text = err.decode("utf-8", "replace").strip()[:300]
        return NotifyResult(False, res.returncode, error=text or f"exit {res.returncode}")
    return NotifyResult(True, 0)


def halt_edge(announced: str | None, event: str, payload: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(event to send or None, halt now announced)``: a halt is news when it starts, changes or ends.

    ``announced`` is the halt reason last notified (None: none is standing). A ``halt`` with that same
    reason is the same standing halt, seen again by the next tick: nothing to send. A fire that ends
    without a halt got past Step 1, so a standing halt is over: ``halt.end``. Other events pass through.
    """
    if event == "halt":
        reason = str(payload.get("reason") or "")
        return (None, announced) if reason == announced else ("halt", reason)
    if event == "fire.end":
        if str(payload.get("reason", "")).startswith("halt:") or announced is None:
            return None, announced
        return "halt.end", None
    return (event if event in NOTIFY_EVENTS else None), announced


class NotifyObserver:
    def __init__(self, argv: Sequence[str], timeout_s: float, paths: Paths,
                 env: Mapping[str, str] | None = None, pass_env: Sequence[str] = ()) -> None:
        self.argv = list(argv)
        self.pass_env = tuple(pass_env)
        self.timeout_s = timeout_s
        self.paths = paths
        self.env = env

    def _announced(self) -> str | None:
        rec = read_json(self.paths.notify_state)
        halt = rec.get("halt") if isinstance(rec, dict) else None
        return halt if isinstance(halt, str) else None

    def _announce(self, halt: str | None) -> None:
        try:
            write_json(self.paths.notify_state, {"halt": halt, "since": utc_iso()})
        except OSError as exc:  # best effort: at worst the same halt is notified again
            _say("warning", "notify.state_failed", error=str(exc)[:200])

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        if event not in NOTIFY_EVENTS and event != "fire.end":
            return
        announced = self._announced() if event in ("halt", "fire.end") else None
        send, now = halt_edge(announced, event, payload)
        if send is None:
            if event == "halt":
                _say("info", "notify.suppressed", notify_event=event, reason=payload.get("reason"),
                     detail="the same halt was notified when it started")
            return
        if send == "halt.end":
            payload = {**payload, "event": "halt.end", "ended_halt": announced}
        event = send
        body = {"timestamp": utc_iso(), **payload}
        try:
            r = run_notify(self.argv, body, timeout_s=self.timeout_s, cwd=self.paths.repo, env=self.env,
                           pass_env=self.pass_env)
        except Exception as exc:  # never break a fire
            r = NotifyResult(False, error=f"{type(exc).__name__}: {exc}"[:300])
        if r.ok:
            _say("info", "notify.sent", notify_event=event)
            if now != announced:  # recorded once delivered: an undelivered edge is tried again next time
                self._announce(now)
        else:
            _say("warning", "notify.failed", notify_event=event, exit_code=r.exit_code, timed_out=r.timed_out,
                 error=r.error)


class MetricsObserver:
    """Rewrites the repository's textfile (``evolve-<repo>-<hash>.prom``) at the end of every fire."""

    def __init__(self, paths: Paths, cfg: Any, env: Mapping[str, str] | None = None) -> None:
        self.paths = paths
        self.cfg = cfg
        self.env = dict(os.environ if env is None else env)

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        if event != "fire.end":
            return
        from evolve import metrics

        try:
            path = metrics.update(self.paths, self.env, cfg=self.cfg)
        except Exception as exc:
            _say("warning", "metrics.failed", error=f"{type(exc).__name__}: {exc}"[:300])
            return
        if path is not None:
            _say("debug", "metrics.written", path=str(path))


class FireJournal:
    """Appends one line per fire to ``fires.jsonl`` (what the morning report shows as fires)."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self._fires: dict[str, dict[str, Any]] = {}

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        fid = str(payload.get("fire_id", ""))
        rec = self._fires.setdefault(fid, {"cycles_seen": [], "first_at": None, "halt_detail": None})
        if event == "halt":
            rec["halt_detail"] = payload.get("detail")
        elif event == "cycle.end":
            entry = payload.get("entry") or {}
            if isinstance(entry.get("cycle"), int):
                rec["cycles_seen"].append(entry["cycle"])
            if rec["first_at"] is None:
                rec["first_at"] = entry.get("timestamp")
        elif event == "handoff.written":
            rec["handoff_cycle"] = payload.get("cycle")
        elif event == "fire.end":
            self._fires.pop(fid, None)
            reason = str(payload.get("reason", ""))
            line = {
                "fire_id": fid,
                "ended_at": utc_iso(),
                "reason": reason,
                "halt": reason.split(":", 1)[1] if reason.startswith("halt:") else None,
                "halt_detail": rec["halt_detail"],
                "cycles": payload.get("cycles", 0),
                "exit_code": payload.get("exit_code"),
                "cost_usd": payload.get("cost_usd", 0.0),
                "first_cycle": min(rec["cycles_seen"]) if rec["cycles_seen"] else None,
                "last_cycle": max(rec["cycles_seen"]) if rec["cycles_seen"] else None,
                "first_cycle_at": rec["first_at"],
                "handoff_cycle": rec.get("handoff_cycle"),
                "pid": os.getpid(),
            }
            append_line(self.paths.fires, line)


def append_line(path: Path, obj: Mapping[str, Any]) -> None:
    """One ``os.write`` on an ``O_APPEND`` descriptor, then fsync (the ledger's discipline).

    After a torn last line (a fire killed mid-write) the new line starts on a line of its own, so only
    the torn one is lost, never the new one.
    """
    clean = redact.current().json(orjson.loads(orjson.dumps(dict(obj), default=str)))  # the sink (halt details)
    data = orjson.dumps(clean, option=orjson.OPT_APPEND_NEWLINE)
    # No symlink followed, at the file or on the way (docs/DESIGN.md §2.0); 0o666 less the umask.
    fd = open_file(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def config_refused(paths: Paths, cfg: Any, refusal: str, env: Mapping[str, str] | None = None) -> None:
    """A fire refused for an untrusted repository config (docs/DESIGN.md §8.5): the operator's own observers
    (``cfg`` holds only the operator's layers) hear ``preflight.failed`` and the fire's end, as for any exit 78."""
    import uuid

    base = {"repo": str(paths.repo), "fire_id": uuid.uuid4().hex[:12]}
    for obs in observers_for(cfg, paths, env):
        for event, extra in (("preflight.failed", {"check": "config_trust", "errors": [refusal],
                                                   "fix": "review it, then `evolve trust`"}),
                             ("fire.end", {"reason": "preflight:config_trust", "cycles": 0, "exit_code": 78,
                                           "cost_usd": 0.0})):
            try:
                obs(event, {"event": event, **base, **extra})
            except Exception as exc:  # best effort, as every observer
                _say("warning", "observer.error", observer_event=event, error=str(exc)[:200])


def observers_for(cfg: Any, paths: Paths, env: Mapping[str, str] | None = None) -> list[Observer]:
    """The observers a fire gets from the config: journal always, notify and metrics when configured."""
    out: list[Observer] = [FireJournal(paths)]
    if cfg.notify.command:
        out.append(NotifyObserver(cfg.notify.command, cfg.notify.timeout_s, paths, env,
                                  pass_env=cfg.notify.pass_env))
    if cfg.metrics.textfile_dir:
        out.append(MetricsObserver(paths, cfg, env))
    return out
