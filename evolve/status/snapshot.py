"""The status read model: one typed, read-only snapshot of a repository's loop.

``evolve status`` (text and ``--json``), the metrics, the morning report and ``evolve doctor`` all
read :class:`StatusSnapshot`. Reading imports no structlog or APScheduler and only the ledger's tail
(backwards, in blocks), so its cost does not grow with the ledger's length. Nothing here writes.

Health, and the exit code of ``evolve status``:

- **halted** (75): a fresh KILL or STOP, or an unacknowledged goal regression — the next fire would
  stop in Step 1 (decided by :func:`evolve.cycle.halt.evaluate`) until an operator acts;
- **degraded** (1): the failure breaker is open (`evolve breaker reset` closes it), the last cycle
  failed or crashed (a failed commit adds "commit failed: <why>; <remedy>"), a fire died without
  being reconciled yet, the config is invalid or the runner preflight fails (the next fire would
  exit 78), the last fire found the worktree not ready (its setup failed, or the gate would test the
  checkout's code: exit 78 too, §8.4), the metronome blocks every fire until RESCOPE is written, or
  green work that did not land waits under ``refs/evolve/unlanded/`` and no later cycle finalized its
  item (docs/DESIGN.md §8.3:
  ``evolve setaside apply|drop``; stranded, interrupted and uncommitted refs are warnings, their items
  are retried), or the last fire could not make its workspace (the cause and the fix, from
  ``workspace-health.json``; docs/DESIGN.md §8.3);
- **dormant** (0): DORMANT is present and nothing above holds: caught up, nothing to do; the next
  fire clears it by itself as soon as any work appears (no operator needed, so not a halt);
- **healthy** (0): anything else.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evolve.cycle import halt as step1
from evolve.harness import autocompact
from evolve.paths import PROBE_FILE, SETUP_FILE, Paths
from evolve.results import COMMIT_FAILED, FAILURES, is_idle_poll
from evolve.status import landing, setaside
from evolve.status.schedule import NextFire, next_fire
from evolve.store.atomic import read_json
from evolve.store.ledger import Ledger
from evolve.store.markers import Marker, read_marker
from evolve.store.session_state import SessionState, load_readonly
from evolve.timeutil import human_s, parse_iso, utc_iso

HEALTHY, DEGRADED, HALTED, DORMANT = "healthy", "degraded", "halted", "dormant"
EXIT_FOR = {HEALTHY: 0, DEGRADED: 1, HALTED: 75, DORMANT: 0}

TODAY_SCAN_CAP = 20_000  # entries: "cost today" never reads more than this
SESSION_SCAN_CAP = 2_000  # entries searched for the agent session's first cycle
MODE_SCAN_CAP = 200  # entries searched for the last agent mode

MARKERS: tuple[tuple[str, str, bool, str], ...] = (
    # name, Paths attribute, sticky, what it does
    ("KILL(global)", "global_kill", True, "halts every fire (kill) until an operator removes it"),
    ("KILL", "kill", True, "halts every fire (kill) until `evolve resume --kill`"),
    ("STOP", "stop", True, "halts every fire (user_halt) until `evolve resume`"),
    ("DORMANT", "dormant", False, "halts (dormant); the next fire clears it as soon as any work exists"),
    ("HANDOFF", "handoff", False, "context hand-off; the next fire clears it and starts a fresh session"),
    ("RESCOPE", "rescope", False, "operator directive; consumed by the cycle that uses it"),
    ("ACK-REGRESSION", "ack_regression", False, "acknowledges a goal regression; consumed by the next fire"),
)
STALE_EFFECT = "ignored: older than the TTL (not deleted)"
EXPIRED_EFFECT = "ignored: past its recorded expiry (not deleted)"

# Status answers Step 1's lazy needs without running anything: DORMANT halts while it exists (the
# next fire may clear it, but status probes no work source), and no governor command is run.
_NEED_ANSWERS: dict[str, dict[str, Any]] = {
    step1.NEED_DORMANT_PROBE: {"dormant_probe": "empty"},
    step1.NEED_GOVERNOR: {"governor_exit": 0},
}


# -- the snapshot ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Halt:
    reason: str  # an evolve.cycle.halt reason: kill, user_halt, dormant, goal_regression
    detail: str


@dataclass(frozen=True)
class MarkerInfo:
    path: str
    age_s: int
    content: str  # stripped, at most 500 characters
    sticky: bool
    effect: str
    ttl_s: int | None = None  # sticky markers only, like the two below
    ttl_left_s: int | None = None  # None also when the TTL does not apply (written by evolve, or an expiry)
    stale: bool = False  # stale or expired: ignored
    written_by: str | None = None  # the marker's ``written-by:`` record
    expires_in_s: int | None = None  # the marker's ``expires:`` record, from now

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path, "age_s": self.age_s, "content": self.content, "sticky": self.sticky,
            "effect": self.effect,
        }
        if self.sticky:
            out.update(ttl_s=self.ttl_s, ttl_left_s=self.ttl_left_s, stale=self.stale,
                       written_by=self.written_by, expires_in_s=self.expires_in_s)
        return out


@dataclass(frozen=True)
class Current:
    """What the fire holding the lock is doing."""

    pid: Any
    fire_id: Any
    fire_started_at: Any
    fire_elapsed_s: int | None
    cycle: Any
    work_ref: Any = None
    title: Any = None
    phase: Any = None
    agent_elapsed_s: int | None = None


@dataclass(frozen=True)
class Breaker:
    state: str  # "closed" | "open" | "half-open"
    open_until: str | None
    eta_s: int | None
    consecutive_failures: int
    max_consecutive_failures: int
    cooldown_minutes: float


@dataclass(frozen=True)
class Session:
    """The agent session from session-state.json, plus what the ledger says about it."""

    record: dict[str, Any]  # as stored: id, runner, started_cycle, last_cycle, ended_heavy, ...
    last_mode: str | None
    started_at: str | None
    age_s: int | None

    def as_json(self) -> dict[str, Any]:
        return {**self.record, "last_mode": self.last_mode, "started_at": self.started_at, "age_s": self.age_s}


@dataclass(frozen=True)
class StatusSnapshot:
    repo: str
    health: str  # HEALTHY | DEGRADED | HALTED | DORMANT
    exit_code: int
    reasons: tuple[str, ...]
    halt: Halt | None
    running: bool  # a fire holds the lock
    pid: Any
    current: Current | None
    fire: dict[str, Any] | None
    active_cycle: dict[str, Any] | None  # cycle-state.json
    claimed_work: dict[str, Any] | None
    last_logged_cycle: int
    last_result: str | None
    context_streak: int
    context_streak_limit: int
    parked_work: list[Any]
    idle_streak: int
    consecutive_failures: int
    breaker_open_until: str | None
    breaker: Breaker
    agent_session: Session | None
    markers: dict[str, MarkerInfo]  # present markers only, in MARKERS order
    next_fire: NextFire | None
    cycles_today: int  # cycles of work: idle polls are counted apart
    idle_polls_today: int
    cost_today_usd: float
    cost_today_partial: bool
    autocompact: dict[str, Any]
    recent: list[dict[str, Any]]  # the newest ledger entries, oldest first
    malformed_lines_seen: int
    warnings: tuple[str, ...]
    config_error: str | None
    generated_at: str
    set_aside: dict[str, list[str]] = field(default_factory=dict)  # refs/evolve/<kind>/... (§8.3)
    landing: dict[str, Any] = field(default_factory=dict)  # waiting work, failing pushes, a busy checkout
    last_red: dict[str, Any] | None = None  # the newest red cycle in the tail: its command and output tail
    parked_items: tuple[str, ...] = ()  # refs parked by the attempt budget (`evolve requeue REF`)
    metronome_blocked: dict[str, Any] | None = None  # a stall: every fire blocked until RESCOPE is written
    set_aside_refs: tuple[setaside.Aside, ...] = ()  # each set-aside ref: its item, superseded, needs you
    workspace: dict[str, Any] | None = None  # workspace-health.json: why the last fire had no workspace, pinned keys
    trust: dict[str, Any] | None = None  # the repository's config and agent settings the operator has not trusted
    sandbox: dict[str, Any] | None = None  # which sandbox is in force (sandbox.json, as the last fire found it, §8.6)

    def as_json(self) -> dict[str, Any]:
        """What ``evolve status --json`` prints (its keys and their order are a published schema)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out.update(
            reasons=list(self.reasons),
            halt=None if self.halt is None else {"reason": self.halt.reason, "detail": self.halt.detail},
            current=None if self.current is None else dict(self.current.__dict__),
            breaker=dict(self.breaker.__dict__),
            agent_session=None if self.agent_session is None else self.agent_session.as_json(),
            markers={name: m.as_json() for name, m in self.markers.items()},
            next_fire=None if self.next_fire is None else self.next_fire.as_json(),
            warnings=list(self.warnings),
            parked_items=list(self.parked_items),
            set_aside_refs=[a.as_json() for a in self.set_aside_refs],
        )
        return out


# -- small readers ---------------------------------------------------------------------------


def _lock_held(paths: Paths) -> bool:
    try:
        fd = os.open(paths.lock, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def load_config(paths: Paths, env: Mapping[str, str]) -> tuple[Any, str | None]:
    """The config (its layers, the repository's left out while untrusted: evolve/configtrust.py), or the defaults
    plus the error text when a file (or env) is invalid."""
    from evolve.config import Config
    from evolve.configtrust import load_cfg
    from evolve.errors import ConfigError

    try:
        return load_cfg(paths, env), None
    except ConfigError as exc:
        return Config(), " ".join(str(exc).split())[:300]


def trust_info(paths: Paths, cfg: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """What of the repository's needs the operator's trust (docs/DESIGN.md §8.5): the JSON, the degraded reasons
    (the next fire would exit 78) and the warnings (left out of the agent's run)."""
    from evolve import configtrust
    from evolve.agent import settings as agentsettings

    owned = configtrust.repo_config(paths)
    settings = agentsettings.for_config(paths, cfg)
    untrusted = ([owned] if owned is not None and not owned.trusted else []) + list(settings.untrusted)
    info = {"config": None if owned is None else {"path": owned.rel, "trusted": owned.trusted},
            "agent_settings": settings.describe(),
            "untrusted": [{"path": u.rel, "kind": u.kind, "why": u.why()} for u in untrusted]}
    degraded = [owned.why() + " (fires exit 78 until then)"] if owned is not None and not owned.trusted else []
    warnings: list[str] = []
    if settings.refusal:
        degraded.append(settings.refusal + " (fires exit 78 until then)")
    elif settings.untrusted:
        warnings.append(f"agent settings: {settings.describe()}")
    return info, degraded, warnings


def _shown(value: Any, cap: int = 200) -> str:
    """A detector value as a short string that encodes (a settings file may hold a lone surrogate)."""
    text = str(value)
    text = text if len(text) <= cap else text[: cap - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def autocompact_info(repo: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """CONFIGURED / INVALID / ABSENT from :func:`evolve.harness.autocompact.status_info` (advisory).

    ``unknown`` when the detector fails: an advisory line must never break ``status`` or ``doctor``.
    """
    try:
        info = autocompact.status_info(repo, env)
    except Exception as exc:
        return {"state": "unknown", "detail": f"autocompact detector failed: {type(exc).__name__}: {str(exc)[:120]}"}
    out: dict[str, Any] = {"state": _shown(info["status"], 40)}
    for key in ("value", "source", "path", "line"):
        if info.get(key) is not None:
            out[key] = _shown(info[key])
    out["nudge_off"] = info["nudge_off"]
    return out


def _read_markers(paths: Paths, now: float, ttl_s: float) -> dict[str, Marker]:
    """Every marker of MARKERS, present or not, read once (for the view and for Step 1); the global
    KILL is the one of its two paths that decides, as in the fire (``step1.first_kill``)."""
    found = {name: read_marker(getattr(paths, attr), now) for name, attr, _, _ in MARKERS}
    if paths.home_kill is not None:
        found["KILL(global)"] = step1.first_kill([found["KILL(global)"], read_marker(paths.home_kill, now)], ttl_s)
    return found


def _marker_infos(found: Mapping[str, Marker], ttl_s: float) -> dict[str, MarkerInfo]:
    out: dict[str, MarkerInfo] = {}
    for name, _, sticky, effect in MARKERS:
        m = found[name]
        if not m.present:
            continue
        info = MarkerInfo(str(m.path), round(m.age_s), m.content.strip()[:500], sticky, effect)
        if sticky:
            state = step1.sticky_state(m, ttl_s)
            stale = state in ("stale", "expired")
            ttl_applies = m.expires_in_s is None and not m.author  # docs/DESIGN.md §2.2
            left = ttl_s - min(m.age_s, m.written_age_s if m.written_age_s is not None else m.age_s)
            info = replace(
                info, ttl_s=round(ttl_s), ttl_left_s=round(left) if ttl_applies else None, stale=stale,
                effect={"stale": STALE_EFFECT, "expired": EXPIRED_EFFECT}.get(state, effect),
                written_by=m.author or None,
                expires_in_s=None if m.expires_in_s is None else round(m.expires_in_s),
            )
        out[name] = info
    return out


def _scan_back(ledger: Ledger, now: float, session: dict[str, Any] | None) -> dict[str, Any]:
    """One bounded backward pass: today's cycles and cost, the last agent mode, the session's start."""
    midnight = now - now % 86400
    cost = 0.0
    cycles = idle = 0
    partial = False
    last_mode = None
    started_cycle = (session or {}).get("started_cycle")
    started_at = None
    today_done = False
    for n, e in enumerate(ledger.scan_back()):
        ts = parse_iso(e.get("timestamp"))
        if not today_done:
            if ts is not None and ts < midnight:
                today_done = True
            elif n >= TODAY_SCAN_CAP:
                today_done = partial = True
            elif ts is not None and is_idle_poll(e):
                idle += 1
            elif ts is not None:
                cycles += 1
                cost += _num(e.get("cost_usd")) or 0.0
        if last_mode is None and isinstance(e.get("agent_mode"), str):
            last_mode = e["agent_mode"]
        c = e.get("cycle")
        if started_at is None and isinstance(started_cycle, int) and isinstance(c, int):
            if c == started_cycle:
                started_at = e.get("timestamp")
            elif c < started_cycle:
                started_at = ""  # not found: stop looking
        session_done = started_at is not None or not isinstance(started_cycle, int) or n >= SESSION_SCAN_CAP
        if today_done and session_done and (last_mode is not None or n >= MODE_SCAN_CAP):
            break
    return {
        "cycles_today": cycles,
        "idle_polls_today": idle,
        "cost_today_usd": round(cost, 6),
        "cost_today_partial": partial,
        "last_agent_mode": last_mode,
        "session_started_at": started_at or None,
    }


# -- the parts of the snapshot -----------------------------------------------------------------


def _current(fire: dict[str, Any] | None, cycle_state: dict[str, Any] | None, now: float) -> Current:
    """The running fire, and its cycle from cycle-state.json when there is one."""
    fire = fire or {}
    started = parse_iso(fire.get("started_at"))
    cur = Current(
        pid=fire.get("pid"),
        fire_id=fire.get("fire_id"),
        fire_started_at=fire.get("started_at"),
        fire_elapsed_s=None if started is None else round(now - started),
        cycle=fire.get("cycle"),
    )
    if cycle_state:
        written = parse_iso(cycle_state.get("written_at"))
        cur = replace(
            cur,
            cycle=cycle_state.get("cycle", cur.cycle),
            work_ref=cycle_state.get("work_ref"),
            title=cycle_state.get("title"),
            phase=cycle_state.get("phase"),
            agent_elapsed_s=round(now - written) if cycle_state.get("phase") == "agent" and written is not None
            else None,
        )
    return cur


def _breaker(st: SessionState, cfg: Any, now: float) -> Breaker:
    until = parse_iso(st.breaker_open_until)
    if until is not None and until > now:
        state = "open"
    elif until is not None:
        state = "half-open"
    else:
        state = "closed"
    return Breaker(
        state=state,
        open_until=st.breaker_open_until,
        eta_s=round(until - now) if state == "open" and until is not None else None,
        consecutive_failures=st.consecutive_failures,
        max_consecutive_failures=cfg.breaker.max_consecutive_failures,
        cooldown_minutes=cfg.breaker.cooldown_minutes,
    )


def _session(record: Any, scan: Mapping[str, Any], now: float) -> Session | None:
    if not isinstance(record, dict):
        return None
    t0 = parse_iso(scan["session_started_at"])
    return Session(
        record=dict(record),
        last_mode=scan["last_agent_mode"],
        started_at=scan["session_started_at"],
        age_s=None if t0 is None else round(now - t0),
    )


def _halt(found: Mapping[str, Marker], ttl_s: float, now: float, tail: list[dict[str, Any]], acked: int
          ) -> Halt | None:
    """Whether the next fire would halt in Step 1, asked of :func:`evolve.cycle.halt.evaluate`.

    No breaker is passed: an open breaker makes status *degraded*, not halted.
    """
    snap = step1.HaltSnapshot(
        now=now, kill_ttl_s=ttl_s, global_kill=found["KILL(global)"], local_kill=found["KILL"],
        stop=found["STOP"], dormant=found["DORMANT"], handoff=found["HANDOFF"],
        ack_regression=found["ACK-REGRESSION"], ledger_tail=tail, ack_regression_cycle=acked,
    )
    decision = step1.evaluate(snap)
    while decision.need is not None:
        snap = replace(snap, **_NEED_ANSWERS[decision.need])
        decision = step1.evaluate(snap)
    if decision.halt in (step1.KILL, step1.USER_HALT):
        name = "STOP" if decision.halt == step1.USER_HALT else "KILL(global)"
        if decision.halt == step1.KILL and step1.sticky_state(found[name], ttl_s) != "live":
            name = "KILL"
        text = " ".join(found[name].content.strip()[:500].split())[:200]
        return Halt(decision.halt, f"{name} present: {text}")
    if decision.halt == step1.DORMANT:
        return Halt(step1.DORMANT, "DORMANT present; cleared by the next fire once any work exists")
    if decision.halt == step1.GOAL_REGRESSION:
        return Halt(step1.GOAL_REGRESSION, decision.detail + "; write .agents/evolve/ACK-REGRESSION to go on")
    return None if decision.halt is None else Halt(decision.halt, decision.detail)


def _degraded(breaker: Breaker, last: dict[str, Any] | None, fire: dict[str, Any] | None, running: bool,
              config_error: str | None) -> list[str]:
    out: list[str] = []
    if breaker.state == "open":
        out.append(f"breaker open for {human_s(breaker.eta_s)} more; `evolve breaker reset` closes it once the"
                   " cause is fixed")
    if last and isinstance(last.get("result"), str) and last["result"] in FAILURES:
        cls = f" ({last['error_class']})" if last.get("error_class") else ""
        out.append(f"last cycle {last.get('cycle')} {last.get('result')}{cls}")
        if last.get("error_class") == COMMIT_FAILED:
            out.append(_commit_failed(last))
    if fire and not running:
        out.append(f"fire pid {fire.get('pid')} died mid-fire; the next fire reconciles it")
    if config_error:
        out.append(f"config invalid (fires exit 78): {config_error}")
    return out


def _preflight(cfg: Any, env: Mapping[str, str]) -> list[str]:
    """The runner preflight every fire runs (agent/preflight.py), seen from this environment."""
    from evolve.agent import preflight

    problems, _ = preflight.check(cfg.agent, env, worktree=cfg.git.isolation == "worktree")
    return [f"agent preflight fails (fires exit 78 before claiming work): {p.message}; fix: {p.fix}"
            for p in problems]


def _workspace(paths: Paths, cfg: Any) -> list[str]:
    """What the last fire found wrong with the worktree (docs/DESIGN.md §8.4), while the config it
    was found with still holds: a failed setup, or a gate that would test your checkout's code."""
    out = []
    stamp = read_json(paths.evolve_dir / SETUP_FILE)
    if (isinstance(stamp, dict) and stamp.get("ok") is False and stamp.get("phase") == "before_claim"
            and not stamp.get("interrupted") and cfg.workspace.setup):
        failed = stamp.get("failed") if isinstance(stamp.get("failed"), dict) else {}
        tail = " ".join(str(failed.get("output") or "").split())[-200:]
        out.append(f"workspace setup failed (fires exit 78 before claiming work): {failed.get('command')!r} "
                   f"{failed.get('detail')}{': ' + tail if tail else ''}; fix it (output in "
                   "runs/workspace-setup.log), the next fire runs it again")
    rec = read_json(paths.evolve_dir / PROBE_FILE)
    if not (isinstance(rec, dict) and cfg.workspace.probe and rec.get("problems")):
        return out
    from evolve.cycle.probe import config_key  # only with a problem to show: a start-up path (bench/status_startup.py)

    if rec.get("config") == config_key(cfg.gate.commands, cfg.workspace):
        first = rec["problems"][0] if isinstance(rec["problems"][0], dict) else {}
        out.append(f"the gate would not test the worktree's code (fires exit 78 before claiming work): "
                   f"{first.get('message')}; fix: {first.get('fix')}")
    return out


def _commit_failed(last: dict[str, Any]) -> str:
    """The reason and the way out: the work is not lost, git needs a hand (issue 15)."""
    why = " ".join(str(last.get("error") or "unknown").split())[:200]
    ref = last.get("uncommitted_ref")
    short = str(ref).removeprefix(setaside.PREFIX)
    kept = (f"the change is saved at {ref} (`evolve setaside apply {short}` takes it back)" if ref
            else "the change is left uncommitted in the work tree")
    return f"commit failed: {why}; run `evolve doctor`, fix git, then the next fire retries the item; {kept}"


def _warnings(markers: Mapping[str, MarkerInfo], malformed: int, last: dict[str, Any] | None,
              parked: list[str]) -> list[str]:
    out = [
        f"{name} {'has expired' if m.effect == EXPIRED_EFFECT else 'is older than its TTL'} and ignored"
        for name, m in markers.items() if m.stale
    ]
    if malformed:
        out.append(f"{malformed} malformed ledger line(s) near the end")
    if last and last.get("error_class") == "limit":
        out.append(f"rate limited at cycle {last.get('cycle')}; the next fire retries")
    if parked:
        shown = ", ".join(parked[-5:]) + (f" (+{len(parked) - 5} more)" if len(parked) > 5 else "")
        out.append(f"{len(parked)} item(s) parked after failed attempts: {shown};"
                   " `evolve requeue REF` puts one back")
    return out


METRONOME_SOURCE = "metronome-gate-blocked"  # cycle.side.METRONOME_SOURCE (not imported: status stays light)


def _stall(entries: list[dict[str, Any]], rescope: bool) -> dict[str, Any] | None:
    """A metronome stall: the newest entry is a hard block and no RESCOPE waits to lift it (issue 16).

    ``cycle`` is where the stall began: the oldest of the trailing run of blocks (within the tail read).
    """
    run = 0
    while run < len(entries) and entries[-1 - run].get("selected_source") == METRONOME_SOURCE:
        run += 1
    if not run or rescope:
        return None
    first, last = entries[-run], entries[-1]
    return {
        "cycle": first.get("cycle"),
        "blocked_fires": run,
        "mode": last.get("mode"),
        "reason": " ".join(str(last.get("reason") or "same work repeated; RESCOPE needed").split())[:200],
        "remedy": "write .agents/evolve/RESCOPE with the new direction",
        "since": first.get("timestamp"),
    }


def _last_red(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest entry of the tail that went red at the gate, with why (issue 16: the reason is kept)."""
    for e in reversed(entries):
        if e.get("gate_detail"):
            keys = ("cycle", "timestamp", "work_ref", "target", "result", "gate_detail", "gate_output", "run_log")
            return {k: e.get(k) for k in keys}
    return None
def _still_pinned(health: dict[str, Any], trust: Any) -> set[str]:
    """The keys the last fire left pinned that are not approved as they were then (approved since: gone)."""
    keys = trust.get("keys") if isinstance(trust, dict) else None
    approved = keys if isinstance(keys, dict) else {}
    waiting = health.get("unapproved")
    return {str(k) for k, v in waiting.items() if approved.get(k) != v} if isinstance(waiting, dict) else set()


def workspace_error(health: Any, trust: Any) -> tuple[str, str] | None:
    """``(cause, fix)`` when the last fire could not make its workspace (pure); once the filter that
    failed is approved, the fix says the next fire retries."""
    err = health.get("error") if isinstance(health, dict) else None
    if not isinstance(err, dict):
        return None
    name = err.get("filter")
    waiting = health.get("unapproved") if isinstance(health.get("unapproved"), dict) else {}
    mine = {str(k) for k in waiting if isinstance(name, str) and str(k).startswith(f"filter.{name}.")}
    if mine and not mine & _still_pinned(health, trust):
        return _shown(err.get("cause"), 300), "its filter is approved now: the next fire retries"
    return _shown(err.get("cause"), 300), _shown(err.get("fix"), 300)


def workspace_lines(health: Any, trust: Any) -> tuple[list[str], list[str]]:
    """What the last fire recorded about its workspace (``workspace-health.json``, §8.3): a fire that
    could not make it is DEGRADED with the cause and the fix; the repository's own git keys evolve's
    git leaves pinned (not approved, or never approvable) are a warning. Keys approved since (the
    record, ``git-trust.json``, read as it is now) are not named again. (Pure.)"""
    if not isinstance(health, dict):
        return [], []
    warnings: list[str] = []
    failed = workspace_error(health, trust)
    degraded = [f"{failed[0]}; {failed[1]}"] if failed else []
    still = _still_pinned(health, trust)
    if still:
        names = sorted(still)
        shown = ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
        warnings.append(f"the repository's own git config sets {_shown(shown, 300)}: evolve's git does not run them"
                        " until the operator approves (`evolve doctor` shows them, `evolve doctor --trust-git-config`"
                        " approves)")
    never = health.get("refused")
    if isinstance(never, dict) and never:
        key = sorted(never)[0]
        warnings.append(f"evolve's git never runs {_shown(key, 120)} from the repository's own config:"
                        f" {_shown(never[key], 200)}; set it in your global config or move the program")
    return degraded, warnings


def _guarded(paths: Paths) -> list[str]:
    """A change the guard refused that is still there (§8.5): every fire refuses until the operator looks."""
    from evolve.cycle import guard

    left = guard.outstanding(paths)
    return [f"every fire refuses: {guard.describe(left)}"] if left else []


def state_of(halt: Halt | None, degraded: list[str]) -> str:
    """An operator's halt wins, then anything degraded; DORMANT alone is its own, untroubled state."""
    if halt is not None and halt.reason != step1.DORMANT:
        return HALTED
    if degraded:
        return DEGRADED
    return DORMANT if halt is not None else HEALTHY


# -- reading it all --------------------------------------------------------------------------


def read_snapshot(
    paths: Paths,
    *,
    recent: int = 5,
    env: Mapping[str, str] | None = None,
    now: float | None = None,
    probe_schedule: bool = True,
    config: tuple[Any, str | None] | None = None,
) -> StatusSnapshot:
    """Everything ``evolve status`` shows; ``probe_schedule=False`` skips the daemon/systemd lookup.

    ``config`` is :func:`load_config`'s answer when the caller has it already (the report needs it too).
    """
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    cfg, config_error = load_config(paths, env) if config is None else config
    ledger = Ledger(paths.ledger)
    tail = ledger.tail(max(recent, 20))
    st = load_readonly(paths.state, ledger)
    # The typed records, as the JSON objects the snapshot reports.
    records = (st.agent_session, st.claimed_work, st.fire)
    session, claimed, fire = (r.to_json() if r is not None else None for r in records)
    running = _lock_held(paths)
    ttl_s = cfg.halt.kill_ttl_days * 86400
    found = _read_markers(paths, now, ttl_s)
    markers = _marker_infos(found, ttl_s)
    cycle_state = read_json(paths.cycle_state)
    cycle_state = cycle_state if isinstance(cycle_state, dict) else None
    scan = _scan_back(ledger, now, session)
    breaker = _breaker(st, cfg, now)
    halt = _halt(found, ttl_s, now, tail.entries, st.ack_regression_cycle)
    last = tail.entries[-1] if tail.entries else None
    degraded = _degraded(breaker, last, fire, running, config_error)
    set_aside = setaside.evolve_refs(paths.repo)
    aside = setaside.assess(set_aside, setaside.entries_for(ledger, set_aside)) if set_aside else []
    waiting = {ref: setaside.waiting_commits(paths.repo, ref) for ref in set_aside.get("pending", [])}
    aside_degraded, aside_warnings = setaside.health(aside, waiting, cfg.git.setaside_keep_days)
    degraded += aside_degraded
    land_degraded, land_warnings, landing_info = landing.lines(paths)
    degraded += land_degraded
    stall = _stall(tail.entries, "RESCOPE" in markers)
    if stall is not None:
        degraded.append(f"metronome blocked since cycle {stall['cycle']} ({stall['reason']}): every fire stops"
                        f" before working; {stall['remedy']}")
    trust, trust_degraded, trust_warnings = trust_info(paths, cfg)
    degraded += trust_degraded
    if config_error is None:
        degraded += _preflight(cfg, env)
    ws_health = read_json(paths.workspace_health)
    ws_degraded, ws_warnings = workspace_lines(ws_health, read_json(paths.git_trust))
    degraded += ws_degraded
    degraded += _guarded(paths)
    if config_error is None:
        degraded += _workspace(paths, cfg)
    box = sandbox_info(paths, cfg if config_error is None else None)
    if box.get("refused"):
        degraded.append(f"sandbox: {box['refused']}")
    health = state_of(halt, degraded)
    return StatusSnapshot(
        repo=str(paths.repo),
        health=health,
        exit_code=EXIT_FOR[health],
        reasons=tuple(([f"{halt.reason}: {halt.detail}"] if halt else []) + degraded),
        halt=halt,
        running=running,
        pid=(fire or {}).get("pid") if running else None,
        current=_current(fire, cycle_state, now) if running else None,
        fire=fire,
        active_cycle=cycle_state,
        claimed_work=claimed,
        last_logged_cycle=ledger.last_cycle(),
        last_result=st.last_result,
        context_streak=st.context_streak,
        context_streak_limit=cfg.context.streak_limit,
        parked_work=st.parked_work,
        idle_streak=st.idle_streak,
        consecutive_failures=st.consecutive_failures,
        breaker_open_until=st.breaker_open_until,
        breaker=breaker,
        agent_session=_session(session, scan, now),
        markers=markers,
        next_fire=next_fire(paths, now, env) if probe_schedule else None,
        cycles_today=scan["cycles_today"],
        idle_polls_today=scan["idle_polls_today"],
        cost_today_usd=scan["cost_today_usd"],
        cost_today_partial=scan["cost_today_partial"],
        autocompact=autocompact_info(paths.repo, env),
        recent=tail.entries[-recent:] if recent > 0 else [],
        malformed_lines_seen=tail.malformed,
        warnings=tuple(_warnings(markers, tail.malformed, last, st.parked_items) + aside_warnings + land_warnings
                       + ws_warnings + trust_warnings
                       + ([box["warning"]] if box.get("warning") else [])),
        config_error=config_error,
        generated_at=utc_iso(now),
        set_aside=set_aside,
        landing=landing_info,
        set_aside_refs=tuple(aside),
        last_red=_last_red(tail.entries),
        metronome_blocked=stall,
        workspace=ws_health if isinstance(ws_health, dict) else None,
        parked_items=tuple(st.parked_items),
        trust=trust,
        sandbox=box,
    )


def sandbox_info(paths: Paths, cfg: Any) -> dict[str, Any]:
    """Which sandbox the agent and the gate run in, as the last fire found it (``sandbox.json``; status never
    starts bwrap itself: ``evolve doctor`` does). ``[sandbox] mode = "off"`` in the config wins."""
    mode = cfg.sandbox.mode if cfg is not None else None
    if mode == "off":
        return {"mode": "off", "in_force": False, "label": 'off ([sandbox] mode = "off")', "warning": None,
                "refused": None}
    rec = read_json(paths.sandbox_state)
    if not isinstance(rec, dict) or not isinstance(rec.get("label"), str):
        return {"mode": mode, "in_force": None, "label": "not known yet (no fire since; evolve doctor probes it)",
                "warning": None, "refused": None}
    out = {k: rec.get(k) for k in ("mode", "network", "in_force", "label", "warning", "refused", "at")}
    for k in ("label", "warning", "refused"):
        out[k] = _shown(out[k], 400) if isinstance(out[k], str) else None
    return out


def status(
    paths: Paths,
    *,
    recent: int = 5,
    env: Mapping[str, str] | None = None,
    now: float | None = None,
    probe_schedule: bool = True,
) -> dict[str, Any]:
    """The JSON form of :func:`read_snapshot` (``evolve status --json``; the text view renders it too)."""
    return read_snapshot(paths, recent=recent, env=env, now=now, probe_schedule=probe_schedule).as_json()
