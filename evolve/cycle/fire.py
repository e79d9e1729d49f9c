"""One fire (SPEC §4): lock, reconcile, Step 1, cycles, the context budget, and the stops.

This is the imperative shell: it reads files, runs processes and writes the effects of the pure
decisions in :mod:`halt`, :mod:`budget`, :mod:`reconcile`, :mod:`entry` and
:mod:`evolve.agent.session`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from evolve import crashpoint, exitcodes, gitops
from evolve import log as logmod
from evolve.agent import prompt, retry
from evolve.agent import session as sessions
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport
from evolve.agent.runners import Runner, make_runner
from evolve.config import Config
from evolve.cycle import budget, halt, transition
from evolve.cycle import reconcile as recon
from evolve.cycle.entry import agent_fields, base_entry
from evolve.cycle.gate import Gate
from evolve.cycle.handoff import handoff_text, milestone
from evolve.cycle.select import Selector
from evolve.cycle.transition import ClaimAction
from evolve.harness import handoff as handoffs
from evolve.harness import hooks as harness_hooks
from evolve.harness import plan as plans
from evolve.paths import Paths
from evolve.procgroup import FIRE_TAG, Limits, group_alive, kill_group, run_group, tagged_groups
from evolve.results import CycleResult
from evolve.secrets import redact, secret_values
from evolve.store import session_state
from evolve.store.atomic import atomic_write_bytes, sweep_temps, write_json
from evolve.store.jsonl import append_bytes
from evolve.store.ledger import Ledger
from evolve.store.lock import FireLock
from evolve.store.markers import read_marker, remove_marker
from evolve.store.records import ClaimedWork, FireRecord
from evolve.timeutil import parse_iso, utc_iso
from evolve.work import dormancy, generators, ladder
from evolve.work.item import ClaimLost, SourceError, WorkItem, WorkSource, keys_of

MAX_SCOUTS_PER_CYCLE = 3
TEMP_AGE_S = 60.0  # an atomic replacement takes milliseconds; a temp file this old lost its writer


def scrub(report: AgentReport) -> AgentReport:
    """The agent's own texts lose any secret before they reach the ledger, state or the next prompt."""
    values = secret_values()
    return replace(
        report,
        summary=redact(report.summary, values),
        disposition=redact(report.disposition, values),
        error=redact(report.error, values),
        percepts=[redact(p, values) for p in report.percepts],
        new_work=[orjson.loads(redact(orjson.dumps(w).decode(), values)) for w in report.new_work],
    )

Observer = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class FireOptions:
    cycles: int | None = None
    dry_run: bool = False
    wait_s: float = 0.0
    mode: str | None = None  # burst | loop; None = config


@dataclass
class FireOutcome:
    exit_code: int = exitcodes.OK
    reason: str = ""
    cycles: int = 0
    halt: str | None = None
    cost_usd: float = 0.0
    entries: list[dict[str, Any]] = field(default_factory=list)


class Fire:
    def __init__(
        self,
        paths: Paths,
        cfg: Config,
        opts: FireOptions,
        *,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        sources: list[WorkSource] | None = None,
        stop: threading.Event | None = None,
        observers: list[Observer] | None = None,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.opts = opts
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.ledger = Ledger(paths.ledger)
        self.fire_id = uuid.uuid4().hex[:12]
        # Every child carries the fire's id: if this fire dies, the next one finds and stops them all.
        self.env[FIRE_TAG] = self.fire_id
        self.log = logmod.get("evolve.fire")
        # A daemon passes its own stop event: its main thread owns the signals, the fire runs in a job thread.
        self.stop = stop or threading.Event()
        self.observers = list(observers or [])
        self.signal_received: int | None = None
        self.mode = opts.mode or cfg.fire.mode
        self.selector = Selector(paths, cfg, self.env, self.log, write=not opts.dry_run, sources=sources)
        self.gate = Gate(paths, cfg, self.log, self.env)
        self.state = session_state.SessionState()
        self.started = clock()
        self._plan: plans.AgentPlan | None = None  # this cycle's agent plan (session, hand-off, prompt)

    # -- entry point -----------------------------------------------------------------------

    def run(self) -> FireOutcome:
        logmod.bind(fire_id=self.fire_id)
        try:
            if self.opts.dry_run:
                return self._dry_run()
            lock = FireLock(self.paths.lock)
            if not lock.acquire(self.opts.wait_s):
                self.log.info("fire.skipped", reason="another fire holds the lock", lock=str(self.paths.lock))
                return FireOutcome(exitcodes.TEMPFAIL, "busy")
            with lock, self._signals():
                return self._locked()
        finally:
            logmod.unbind("fire_id", "cycle")

    @contextlib.contextmanager
    def _signals(self):
        """SIGTERM/SIGINT: stop claiming, interrupt the agent group, record ``interrupted``."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        got: dict[str, int] = {}

        def handler(signum: int, _frame: Any) -> None:
            got["sig"] = signum
            self.stop.set()

        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.signal_received = got.get("sig")

    # -- the locked fire -------------------------------------------------------------------

    def _locked(self) -> FireOutcome:
        now = self.clock()
        self.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
        torn = self.ledger.repair_torn()
        if torn:
            self.log.warning("ledger.torn_line", moved_to=str(torn))
        self._sweep_temps()
        loaded = session_state.load(self.paths.state, self.ledger)
        self.state = loaded.state
        for w in loaded.warnings:
            self.log.warning("state.repaired", detail=w)
        self.log.info("fire.start", pid=os.getpid(), mode=self.mode, repo=str(self.paths.repo))
        self._reconcile()

        step1 = self._step1(now)
        if step1.halt:
            self.log.info("halt", reason=step1.halt, detail=step1.detail)
            self._emit("halt", reason=step1.halt, detail=step1.detail)
            self._save()
            self.log.info("fire.end", reason=f"halt:{step1.halt}", cycles=0, exit_code=0)
            outcome = FireOutcome(exitcodes.OK, f"halt:{step1.halt}", halt=step1.halt)
            self._emit("fire.end", reason=outcome.reason, cycles=0, exit_code=0, cost_usd=0.0)
            return outcome

        self.state.fire = FireRecord(
            pid=os.getpid(), pgid=os.getpgid(0), agent_pgid=None, started_at=utc_iso(now), cycle=None,
            fire_id=self.fire_id,
        )
        self._save()
        outcome = FireOutcome()
        try:
            self._cycles(step1, outcome, started=now)
        except Exception as exc:
            # session-state.fire stays recorded: the next fire reconciles this one as crashed
            # (ledger entry, claim released, agent group killed) exactly as after a SIGKILL.
            self.log.exception("fire.error", error=str(exc)[:300])
            raise
        self.state.fire = None
        self._save()
        self.paths.cycle_state.unlink(missing_ok=True)
        self.log.info(
            "fire.end",
            reason=outcome.reason,
            cycles=outcome.cycles,
            exit_code=outcome.exit_code,
            cost_usd=round(outcome.cost_usd, 6),
        )
        self._emit(
            "fire.end",
            reason=outcome.reason,
            cycles=outcome.cycles,
            exit_code=outcome.exit_code,
            cost_usd=round(outcome.cost_usd, 6),
        )
        return outcome

    def _emit(self, event: str, **payload: Any) -> None:
        """Tell observers (notifications, metrics) about a state change; they never break a fire."""
        for observer in self.observers:
            try:
                observer(event, {"event": event, "repo": str(self.paths.repo), "fire_id": self.fire_id, **payload})
            except Exception as exc:  # an observer is best effort by contract
                self.log.warning("observer.error", observer_event=event, error=str(exc)[:200])

    def _save(self) -> None:
        session_state.save(self.paths.state, self.state)

    # -- reconciliation --------------------------------------------------------------------

    def _reconcile(self) -> None:
        last = self.ledger.last()
        d = recon.decide(self.state.fire, self.state.claimed_work, self.ledger.last_cycle(), last)
        if not d.dead_fire and d.claim is None:
            return
        if d.kill_pgid and group_alive(d.kill_pgid):
            self.log.warning("reconcile.kill_orphan", pgid=d.kill_pgid, found_by="recorded pgid")
            kill_group(d.kill_pgid, grace_s=2.0)
        dead_id = self.state.fire.fire_id if self.state.fire is not None else ""
        if d.dead_fire and dead_id and dead_id != self.fire_id:
            for pgid in sorted(tagged_groups(FIRE_TAG, dead_id)):
                if group_alive(pgid):
                    self.log.warning("reconcile.kill_orphan", pgid=pgid, found_by=FIRE_TAG)
                    kill_group(pgid, grace_s=2.0)
        claimed = self.state.claimed_work
        if d.crashed_cycle is not None:
            fire = self.state.fire or FireRecord()
            entry = base_entry(
                cycle=d.crashed_cycle,
                result=CycleResult.CRASHED,
                timestamp=utc_iso(self.clock()),
                target=(claimed.ref if claimed else "") or "idle",
                source=(claimed.source if claimed else "") or "idle",
                work_ref=claimed.ref or None if claimed else None,
                mode="crashed",
                session_id=self._session_id(),
                fire_id=fire.fire_id,
            )
            entry.update(error_class="crashed", crashed_fire_pid=fire.pid)
            self.ledger.append(entry)
            self.state.last_logged_cycle = d.crashed_cycle
            self.state.last_result = str(CycleResult.CRASHED)
            self.log.warning("reconcile.crashed", cycle=d.crashed_cycle, dead_pid=fire.pid)
        if claimed is not None and d.claim:
            src = self._source(claimed.source)
            if src is not None and claimed.ref:
                item = WorkItem(source=claimed.source, ref=claimed.ref, title=claimed.title)
                try:
                    if d.claim is ClaimAction.FINALIZE:
                        src.finalize(item, claimed.claimed_by, utc_iso(self.clock()))
                    else:
                        src.release(item, claimed.claimed_by or None, utc_iso(self.clock()), CycleResult.CRASHED)
                except (SourceError, OSError) as exc:
                    self.log.warning("reconcile.claim_error", error=str(exc))
            self.log.info("reconcile.claim", action=d.claim, ref=claimed.ref)
            self.state.claimed_work = None
        self.state.fire = None
        self._save()

    def _sweep_temps(self) -> None:
        """Temp files left by a fire killed between writing one and renaming it into place."""
        q = self.paths.nextwork
        removed = sweep_temps(self.paths.evolve_dir, older_than_s=TEMP_AGE_S)
        removed += sweep_temps(q.parent, older_than_s=TEMP_AGE_S, only=q.name)
        if removed:
            self.log.warning("store.temps_removed", count=len(removed), names=removed[:20])

    def _session_id(self) -> str | None:
        session = self.state.agent_session
        return session.id or None if session is not None else None

    def _source(self, name: str | None) -> WorkSource | None:
        return self.selector.source_for(name)

    # -- step 1 ----------------------------------------------------------------------------

    def _snapshot(self, now: float) -> halt.HaltSnapshot:
        p = self.paths
        until = parse_iso(self.state.breaker_open_until) if self.state.breaker_open_until else None
        return halt.HaltSnapshot(
            now=now,
            kill_ttl_s=self.cfg.halt.kill_ttl_days * 86400,
            global_kill=read_marker(p.global_kill, now),
            local_kill=read_marker(p.kill, now),
            stop=read_marker(p.stop, now),
            dormant=read_marker(p.dormant, now),
            handoff=read_marker(p.handoff, now),
            ack_regression=read_marker(p.ack_regression, now),
            governor_configured=bool(self.cfg.halt.governor_cmd),
            breaker_open_until=until,
            ledger_tail=self.ledger.tail(20).entries,
            ack_regression_cycle=self.state.ack_regression_cycle,
        )

    def _step1(self, now: float, *, apply: bool = True) -> halt.Step1:
        snap = self._snapshot(now)
        while True:
            d = halt.evaluate(snap)
            if d.need == halt.NEED_DORMANT_PROBE:
                snap = replace(snap, dormant_probe=self._probe_work())
            elif d.need == halt.NEED_GOVERNOR:
                snap = replace(snap, governor_exit=self._run_governor())
            else:
                break
        for w in d.warnings:
            self.log.warning("halt.warning", detail=w)
        if not apply:
            return d
        if d.clear_dormant and remove_marker(self.paths.dormant):
            self.log.info("dormant.cleared", reason="selectable work exists")
        if d.clear_handoff:
            content = snap.handoff.content
            if remove_marker(self.paths.handoff):
                self.log.info("handoff.cleared", content=content)
        if d.consume_ack:
            remove_marker(self.paths.ack_regression)
            if d.acked_cycle:
                self.state.ack_regression_cycle = d.acked_cycle
            self.log.info("regression.acknowledged", cycle=d.acked_cycle or None)
        if d.restorative:
            self.log.info("restorative", reason="last cycle was red")
        if d.breaker_probe:
            self.log.info("breaker.half_open")
        return d

    def _probe_work(self) -> str:
        return self.selector.probe_any_work(self.state)

    def _run_governor(self) -> int:
        # Like every child of a fire: its own group (killed whole on timeout) and the fire's env (its id).
        argv = self.cfg.halt.governor_cmd
        timeout_s = self.cfg.halt.timeout_s
        try:
            proc = run_group(
                argv, cwd=self.paths.repo, env=self.env, limits=Limits(timeout_s=timeout_s, grace_s=1.0, tail_bytes=0)
            )
        except OSError as exc:
            self.log.warning("governor.error", error=str(exc)[:300])
            return -1
        if proc.timed_out or proc.returncode is None:
            self.log.warning("governor.error", error=f"{argv[0]} timed out after {timeout_s:g}s; process group killed")
            return -1
        return proc.returncode

    # -- cycles ----------------------------------------------------------------------------

    def _stop_reason(self, outcome: FireOutcome, started: float) -> str | None:
        max_cycles = self.opts.cycles if self.opts.cycles is not None else self.cfg.fire.max_cycles
        if self.stop.is_set():
            return "interrupted"
        if max_cycles and outcome.cycles >= max_cycles:
            return "max_cycles"
        if self.cfg.fire.max_minutes and self.clock() - started >= self.cfg.fire.max_minutes * 60:
            return "max_minutes"
        if self.cfg.fire.max_cost_usd and outcome.cost_usd >= self.cfg.fire.max_cost_usd:
            return "max_cost_usd"
        return None

    def _claim(self, cycle: int, item: WorkItem, claimer: str) -> bool:
        """Record the claim in session-state first, then claim in the source.

        In that order a crash in between leaves a recorded claim the next fire releases as a
        no-op, never an ``in_progress`` item nobody knows about.
        """
        st = self.state
        now = utc_iso(self.clock())
        st.claimed_work = ClaimedWork(
            ref=item.ref, source=item.source, claimed_by=claimer, claimed_at=now, cycle=cycle, title=item.title
        )
        assert st.fire is not None
        st.fire = replace(st.fire, cycle=cycle)
        self._save()
        src = self._source(item.source)
        assert src is not None
        try:
            src.claim(item, claimer, now)
        except ClaimLost:
            self.log.info("claim.lost", ref=item.ref)
            st.claimed_work = None
            st.fire = replace(st.fire, cycle=None)
            self._save()
            return False
        return True

    def _cycles(self, step1: halt.Step1, outcome: FireOutcome, started: float) -> None:
        restorative = step1.restorative
        lost = 0
        while True:
            reason = self._stop_reason(outcome, started)
            if reason:
                outcome.reason = reason
                if reason == "interrupted":
                    outcome.exit_code = exitcodes.SIGTERM
                return
            sel = self.selector.select(self.state, restorative=restorative)
            for item, flips in sel.quarantine:
                self._quarantined(item, flips, outcome)
            cycle = self.ledger.last_cycle() + 1
            logmod.bind(cycle=cycle)
            self.log.info("work.selected", rung=sel.rung, ref=sel.item.ref if sel.item else None, reason=sel.reason)
            if sel.blocked_mode is not None:
                self._metronome_blocked(cycle, sel, outcome)
                outcome.reason = "metronome_blocked"
                return
            if sel.item is None:
                self._idle_cycle(cycle, sel.probe_errors, outcome)
                outcome.reason = "probe_error" if sel.probe_errors else "idle"
                return
            claimer = f"{'evolve-quality' if self.cfg.work.quality else 'evolve'}:cycle-{cycle}"
            if not self._claim(cycle, sel.item, claimer):
                lost += 1
                if lost >= 10:
                    outcome.reason = "claims_lost"
                    return
                continue
            stop = self._work_cycle(cycle, sel, claimer, restorative, outcome)
            outcome.cycles += 1
            restorative = restorative and self.state.last_result in ("regressed", "failed")
            if stop:
                outcome.reason = stop
                return

    def _side_entry(
        self, cycle: int, result: str, item: WorkItem, source: str, mode: str, timestamp: str | None = None
    ) -> dict[str, Any]:
        return base_entry(
            cycle=cycle,
            result=result,
            timestamp=timestamp or utc_iso(self.clock()),
            target=item.title,
            source=source,
            work_ref=item.ref,
            mode=mode,
            session_id=self._session_id(),
            fire_id=self.fire_id,
        )

    def _quarantined(self, item: WorkItem, flips: int, outcome: FireOutcome) -> None:
        """An oscillating goal is skipped, and that is logged once per era (SPEC §6.3)."""
        cycle = self.ledger.last_cycle() + 1
        entry = self._side_entry(cycle, "quarantined", item, item.source, ladder.work_mode(item))
        entry["oscillations"] = flips
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.state.last_logged_cycle = cycle
        self._save()
        self.log.warning("goal.quarantined", cycle=cycle, ref=item.ref, flips=flips)

    def _metronome_blocked(self, cycle: int, sel: ladder.Selection, outcome: FireOutcome) -> None:
        top = next((c for c in sel.considered if "hard block" in c.verdict), None)
        item = WorkItem(source="metronome-gate-blocked", ref=top.ref if top else "", title=top.title if top else "")
        entry = self._side_entry(cycle, "unchanged", item, "metronome-gate-blocked", sel.blocked_mode or "")
        entry["reason"] = sel.reason
        self.ledger.append(entry)
        outcome.entries.append(entry)
        st = self.state
        st.last_logged_cycle = cycle
        st.last_result, st.last_selected_source = "unchanged", "metronome-gate-blocked"
        self._save()
        self.log.warning("metronome.blocked", cycle=cycle, mode=sel.blocked_mode, reason=sel.reason)

    def _idle_cycle(self, cycle: int, errors: tuple[str, ...], outcome: FireOutcome) -> None:
        now = self.clock()
        entry = base_entry(
            cycle=cycle,
            result="unchanged",
            timestamp=utc_iso(now),
            target="idle",
            source="idle",
            work_ref=None,
            mode="idle",
            session_id=self._session_id(),
            fire_id=self.fire_id,
        )
        if errors:
            entry["probe_error"] = True
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.log.info("cycle.idle", cycle=cycle, probe_error=bool(errors))
        st = self.state
        st.last_logged_cycle = cycle
        st.last_result, st.last_mode, st.last_selected_source = "unchanged", "idle", "idle"
        st.agent_session = sessions.note_event(st.agent_session)
        if errors:
            # A probe error is never "empty": it must not walk the loop towards DORMANT.
            self._blocked(cycle, now, "source probe error: " + "; ".join(errors)[:500])
            self._save()
            return
        step = dormancy.empty_pass(st.idle_streak, st.generator_empty_streak, self.mode)
        st.idle_streak, st.generator_empty_streak = step.idle_streak, step.generator_empty_streak
        if step.action == "dormant":
            text = f"cycle {cycle}\n{utc_iso(now)}\n{dormancy.REASON}\n"
            atomic_write_bytes(self.paths.dormant, text.encode())
            self.log.info("dormant.written", cycle=cycle)
        elif step.action == "blocked":
            self._blocked(cycle, now, dormancy.REASON, needed="queue empty; operator adds work or a marker")
        self._save()

    def _blocked(self, cycle: int, now: float, reason: str, needed: str | None = None) -> None:
        row: dict[str, Any] = {"cycle": cycle, "timestamp": utc_iso(now), "reason": reason}
        if needed:
            row["needed_context"] = needed
        try:
            append_bytes(self.paths.blocked, orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        except OSError as exc:  # e.g. a symlink planted in its place: refused, and the fire goes on
            self.log.error("blocked.error", cycle=cycle, path=str(self.paths.blocked), error=str(exc)[:300])
            return
        self.log.info("blocked.logged", cycle=cycle, reason=reason)

    def _write_cycle_state(self, cycle: int, item: WorkItem, phase: str, start_sha: str | None) -> None:
        write_json(
            self.paths.cycle_state,
            {
                "cycle": cycle,
                "phase": phase,
                "step": phase,
                "work_ref": item.ref,
                "title": item.title,
                **harness_hooks.plan_fields(self.paths.repo, item.data),
                "cycle_start_sha": start_sha,
                "written_at": utc_iso(self.clock()),
            },
        )

    def _work_cycle(
        self, cycle: int, sel: ladder.Selection, claimer: str, restorative: bool, outcome: FireOutcome
    ) -> str | None:
        """One cycle: the agent on the selected item; a scout moves on to the next candidate."""
        st = self.state
        st.idle_streak = 0
        st.generator_empty_streak = 0
        assert sel.item is not None
        item = sel.item
        scouted: list[dict[str, str]] = []
        while True:
            decision, report, result, extra = self._attempt(cycle, item, restorative)
            outcome.cost_usd += report.cost_usd
            if result == "interrupted":
                break
            reading = self._reading(report)
            if result != "scout" or reading.heavy or len(scouted) >= MAX_SCOUTS_PER_CYCLE:
                break
            # A scout is never a stop: apply its split/defer/park and take the next candidate now.
            self._apply_scout(cycle, item, report, claimer)
            scouted.append({"ref": item.ref, "disposition": report.disposition})
            nxt = self.selector.select(st, restorative=restorative, excluded=frozenset(x["ref"] for x in scouted))
            if nxt.item is None or nxt.blocked_mode is not None or not self._claim(cycle, nxt.item, claimer):
                st.claimed_work = None
                self._save()
                extra["scouted"] = scouted
                return self._finish(cycle, item, claimer, decision, report, "scout", extra, outcome, claim_done=True)
            item = nxt.item
        if scouted:
            extra["scouted"] = scouted
        stop = self._finish(cycle, item, claimer, decision, report, result, extra, outcome)
        if sel.use_rescope and self.paths.rescope.exists():
            remove_marker(self.paths.rescope)
            self.log.info("rescope.consumed", cycle=cycle)
        return stop

    def _attempt(
        self, cycle: int, item: WorkItem, restorative: bool
    ) -> tuple[sessions.ModeDecision, AgentReport, str, dict[str, Any]]:
        """Run the agent once on ``item`` and verify what it did."""
        st = self.state
        repo = self.paths.repo
        # Measure first: what the checks themselves leave behind (caches, build output) is not the cycle's.
        goals, pre = self._goals_before()
        start_sha = gitops.head(repo)
        dirty_before = gitops.dirty_paths(repo)
        self._write_cycle_state(cycle, item, "agent", start_sha)
        self.log.info("cycle.start", cycle=cycle, ref=item.ref, title=item.title, source=item.source)
        plan, inv = self._plan_agent(cycle, item, restorative)
        decision = plan.decision
        self.log.info(
            "agent.mode",
            mode=decision.mode,
            session_id=decision.session_id,
            reason=decision.reason,
            need_stale=decision.need_stale,
            turn_gap=decision.turn_gap,
        )

        def on_start(pgid: int) -> None:
            assert st.fire is not None
            st.fire = replace(st.fire, agent_pgid=pgid)
            self._save()
            self.log.info("agent.started", cycle=cycle, pgid=pgid, runner=self.cfg.agent.runner)
            crashpoint.reached("agent.running")

        def on_heartbeat(elapsed: float, progress: Mapping[str, Any] | None = None) -> None:
            self.log.info("agent.heartbeat", cycle=cycle, elapsed_s=round(elapsed, 1), **(progress or {}))

        runner = self._runner()
        attempt = 0
        while True:
            report = scrub(runner.run(inv, on_start=on_start, stop=self.stop, on_heartbeat=on_heartbeat))
            again = retry.decide(
                report,
                attempt,
                remaining_s=self._remaining_s(),
                transient_retries=self.cfg.agent.transient_retries,
                backoff_s=self.cfg.agent.retry_backoff_s,
            )
            if not again.retry:
                break
            self.gate.undo(start_sha, dirty_before)
            event = "agent.limit_wait" if report.error_class == "limit" else "agent.retry"
            self.log.warning(event, cycle=cycle, wait_s=again.wait_s, reason=again.reason, error=report.error[:200])
            if self.stop.wait(again.wait_s):
                break
            attempt += 1
            if report.session_id and self.cfg.agent.runner == "claude":
                # The failed run already created the conversation: carry on in it ("resume" mode).
                inv = replace(inv, mode="resume", resume=True, session_id=report.session_id)
        assert st.fire is not None
        st.fire = replace(st.fire, agent_pgid=None)
        if report.error_class == "interrupted":
            self.gate.undo(start_sha, dirty_before)
            return decision, report, "interrupted", {}
        self._write_cycle_state(cycle, item, "gate", start_sha)
        result, extra = self.gate.verify(cycle, item, report, start_sha, dirty_before, goals=goals, pre=pre)
        return decision, report, result, extra

    def _goals_before(self) -> tuple[Any, dict[str, Any] | None]:
        """The goal measurement the cycle starts from, so the gate can tell a goal it broke."""
        if self.cfg.work.beads_only:
            return None, None
        try:
            pre = self.selector.goals.pre_cycle()
        except SourceError as exc:
            self.log.warning("goals.measure_failed", error=str(exc)[:300])
            return None, None
        return (self.selector.goals, pre) if pre is not None else (None, None)

    def _remaining_s(self) -> float:
        """Seconds left of the fire's wall-clock budget (``fire.max_minutes``; 0 = unbounded)."""
        if not self.cfg.fire.max_minutes:
            return float("inf")
        return self.cfg.fire.max_minutes * 60 - (self.clock() - self.started)

    def _reading(self, report: AgentReport) -> budget.ContextReading:
        return budget.read_context(
            report, heavy_pct=self.cfg.context.heavy_pct, window_override=self.cfg.context.context_window
        )

    def _apply_scout(self, cycle: int, item: WorkItem, report: AgentReport, claimer: str) -> None:
        """Split (children queued with ``discovered_from``), defer, or park the scouted item."""
        now = utc_iso(self.clock())
        disp = report.disposition.strip()
        kind = disp.split(":", 1)[0].strip().lower()
        reason = disp.split(":", 1)[1].strip() if ":" in disp else disp
        src = self._source(item.source)
        try:
            if src is not None:
                src.release(item, claimer, now, "scout")
            if kind == "split" and report.new_work:
                children = [{**c, "discovered_from": item.ref} for c in report.new_work]
                self._queue_new_work(cycle, children, epic=f"scout-split:{item.ref}")
                if src is not None:
                    src.split(item, now, children)
            elif kind == "defer" and src is not None:
                src.defer(item, now, reason)
            elif kind == "park" and src is not None:
                src.park(item, now, reason or "scope too big; needs operator triage")
        except (SourceError, OSError) as exc:
            self.log.error("scout.error", error=str(exc)[:300])
        self.log.info("cycle.scout", cycle=cycle, ref=item.ref, disposition=disp)

    def _queue_new_work(self, cycle: int, items: list[dict[str, Any]], *, epic: str) -> int:
        """Follow-up work the agent reported, appended to the harvested queue (deduplicated)."""
        clean = []
        for it in items:
            if isinstance(it.get("title"), str) and it["title"].strip():
                clean.append({"description": "", "type": "task", "severity": "medium", "source": "evolve-cycle", **it})
        fresh = generators.dedup(clean, self.selector.harvested.known_keys(keys_of(clean)))
        if fresh:
            entry = generators.generator_entry(fresh, utc_iso(self.clock()))
            entry["source_epic"] = epic
            self.selector.harvested.append_entry(entry)
            self.log.info("queue.appended", cycle=cycle, count=len(fresh), epic=epic)
        return len(fresh)

    def _plan_agent(
        self, cycle: int, item: WorkItem, restorative: bool, new_id: str | None = None
    ) -> tuple[plans.AgentPlan, Invocation]:
        """Read what the plan needs, plan the run (pure), and the exact invocation (shared with --dry-run)."""
        session = self.state.agent_session
        request = handoffs.pending(self.paths)  # an operator's `evolve handoff` (docs/DESIGN.md §7)
        plan = plans.plan_cycle(
            plans.PlanInput(
                cycle=cycle,
                work=item,
                session=session,
                runner=self.cfg.agent.runner,
                foreign_commits=gitops.foreign_commits(self.paths.repo, session.last_head if session else None),
                fresh_start_turns=self.cfg.context.returning_fresh_start_turns,
                now=self.clock(),
                request=request,
                request_text=request.text() if request is not None else "",
                restorative=restorative,
                facts=(*prompt.read_learnings(self.paths.repo), *self.state.percepts),
                post_compact=self.state.post_compact,
                new_id=new_id,
            )
        )
        self._plan = plan
        d = plan.decision
        inv = Invocation(
            repo=self.paths.repo,
            run_dir=self.paths.runs_dir,
            cycle=cycle,
            mode=d.mode,
            session_id=d.session_id,
            resume=d.resume,
            work=item,
            orientation=plan.orientation,
            fork_from=plan.fork_from,
        )
        return plan, inv

    def _runner(self) -> Runner:
        return make_runner(self.cfg, self.env, self.paths)

    def _finish(
        self,
        cycle: int,
        item: WorkItem,
        claimer: str,
        decision: sessions.ModeDecision,
        report: AgentReport,
        result: str,
        extra: dict[str, Any],
        outcome: FireOutcome,
        *,
        claim_done: bool = False,
    ) -> str | None:
        """Record the cycle, then apply :func:`transition.after_cycle`: claim, follow-ups, state, stop."""
        src = self._source(item.source)
        now = self.clock()
        reading = self._reading(report)
        facts = transition.CycleFacts(
            cycle=cycle,
            result=CycleResult(result),
            work_ref=item.ref,
            source=item.source,
            mode=ladder.work_mode(item),
            now=now,
            heavy=reading.heavy,
            context_signal=reading.signal,
            error_class=report.error_class,
            percepts=tuple(report.percepts),
            has_new_work=bool(report.new_work),
            directive_era=str(item.data["era"]) if item.source == "directive" and item.data.get("era") else None,
            claim_settled=claim_done or src is None,
        )
        self._record(facts, item, decision, report, reading, extra, outcome)
        t = transition.after_cycle(self.state, facts, self._policy())
        self._apply_claim(t, facts, item, src, claimer, report)
        self.state = t.state
        self._after_agent(cycle, item, report, result, now)
        for effect in t.effects:
            getattr(self.log, effect.level)(effect.event, **effect.fields)
            if effect.notify:
                self._emit(effect.event, **effect.fields)
        self._save()
        self.paths.cycle_state.unlink(missing_ok=True)
        if t.exit_code != exitcodes.OK:
            outcome.exit_code = t.exit_code
        if t.handoff:
            self._handoff(cycle + 1, item, outcome)
        return str(t.stop) if t.stop else None

    def _record(
        self,
        facts: transition.CycleFacts,
        item: WorkItem,
        decision: sessions.ModeDecision,
        report: AgentReport,
        reading: budget.ContextReading,
        extra: dict[str, Any],
        outcome: FireOutcome,
    ) -> None:
        """The cycle's ledger entry, first: everything after it can be reconciled from it."""
        entry = base_entry(
            cycle=facts.cycle,
            result=facts.result,
            timestamp=utc_iso(facts.now),
            target=item.title,
            source=item.source,
            work_ref=item.ref,
            mode=facts.mode,
            session_id=report.session_id or decision.session_id,
            fire_id=self.fire_id,
        )
        entry["agent_mode"] = decision.mode
        entry.update(agent_fields(report, reading))
        entry.update(extra)
        entry.update(plans.entry_fields(self._plan, report))
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.log.info(
            "cycle.end",
            cycle=facts.cycle,
            result=facts.result,
            context_heavy=reading.heavy,
            context_signal=reading.signal or None,
            cost_usd=report.cost_usd,
        )
        self._emit("cycle.end", entry=entry)
        if facts.result is CycleResult.REGRESSED:
            self._emit("regression", cycle=facts.cycle, work_ref=item.ref, detail=extra.get("gate_detail"))

    def _apply_claim(
        self,
        t: transition.Transition,
        facts: transition.CycleFacts,
        item: WorkItem,
        src: WorkSource | None,
        claimer: str,
        report: AgentReport,
    ) -> None:
        """The claim: consumed only after the gate said yes; otherwise back to the source."""
        stamp, cycle = utc_iso(facts.now), facts.cycle
        try:
            if src is not None and t.claim is transition.ClaimAction.FINALIZE:
                src.finalize(item, claimer, stamp)
            elif src is not None and t.claim is transition.ClaimAction.RELEASE:
                src.release(item, claimer, stamp, facts.result)
                if t.park is not None:
                    self._park(src, item, stamp, t.park)
            if t.queue_new_work:
                self._queue_new_work(cycle, list(report.new_work), epic=f"evolve-cycle-{cycle}")
        except (SourceError, OSError) as exc:
            self.log.error("claim.error", error=str(exc))

    def _park(self, src: WorkSource, item: WorkItem, stamp: str, park: transition.Park) -> None:
        if src.park(item, stamp, park.note):
            self.log.warning("item.parked", ref=item.ref, attempts=park.attempts)
        else:
            self.log.warning("item.attempts_spent", ref=item.ref, attempts=park.attempts, note="source cannot park")

    def _after_agent(self, cycle: int, item: WorkItem, report: AgentReport, result: str, now: float) -> None:
        """The agent session after the run, any hand-off request it used, and a compaction's block."""
        plan = self._plan
        assert plan is not None
        compact = None
        if report.compacted:  # compactions happen in the agent phase: re-inject that phase's state
            got = harness_hooks.reinject_text(self.paths.repo, self.paths.cycle_state, now, at_phase="agent")
            compact = got[0] if got is not None else None
        after = plans.session_after(
            plan, report, result=result, runner=self.cfg.agent.runner, work_ref=item.ref,
            head=gitops.head(self.paths.repo), compact_text=compact,
        )
        if after.consume_request and plan.request is not None:
            handoffs.consume(self.paths, plan.request, now)
            self.log.info("handoff.consumed", cycle=cycle, **plans.entry_fields(plan, report))
        self.state.agent_session, self.state.post_compact = after.session, after.post_compact

    def _policy(self) -> transition.Policy:
        c = self.cfg
        return transition.Policy(
            max_attempts=c.work.max_attempts,
            breaker_failures=c.breaker.max_consecutive_failures,
            breaker_cooldown_s=c.breaker.cooldown_minutes * 60,
            streak_limit=c.context.streak_limit,
        )

    def _handoff(self, cycle: int, item: WorkItem, outcome: FireOutcome) -> None:
        """Write HANDOFF and the ``context-handoff`` entry; the fire then ends with exit 0."""
        st = self.state
        now = utc_iso(self.clock())
        streak = st.context_streak
        parked = list(st.parked_work)
        atomic_write_bytes(self.paths.handoff, handoff_text(now, streak, parked).encode())
        entry = self._side_entry(cycle, CycleResult.CONTEXT_HANDOFF, item, item.source, "context-handoff", now)
        entry["milestone"] = milestone(streak, parked)
        entry["parked_work"] = parked
        entry["context_streak"] = streak
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.state = transition.after_handoff(st, cycle)
        self._save()
        self.log.info("handoff.written", cycle=cycle, streak=streak, parked=parked, path=str(self.paths.handoff))
        self._emit("handoff.written", cycle=cycle, streak=streak, parked=parked)

    # -- dry run ---------------------------------------------------------------------------

    def _dry_run(self) -> FireOutcome:
        now = self.clock()
        self.state = session_state.load_readonly(self.paths.state, self.ledger)
        d = self._step1(now, apply=False)
        plan: dict[str, Any] = {
            "step1": {
                "halt": d.halt,
                "detail": d.detail,
                "would_clear_dormant": d.clear_dormant,
                "would_clear_handoff": d.clear_handoff,
                "restorative": d.restorative,
                "breaker_probe": d.breaker_probe,
                "warnings": list(d.warnings),
            }
        }
        if not d.halt:
            sel = self.selector.select(self.state, restorative=d.restorative)
            cycle = self.ledger.last_cycle() + 1
            plan["cycle"] = cycle
            plan["probe_errors"] = list(sel.probe_errors)
            plan["candidates"] = [
                {"rung": c.rung, "ref": c.ref, "title": c.title, "verdict": c.verdict} for c in sel.considered
            ]
            plan["why"] = sel.reason
            if sel.blocked_mode:
                plan["metronome_blocked"] = sel.blocked_mode
            if self.selector.generated_preview:
                plan["would_queue"] = self.selector.generated_preview
            if sel.item is None:
                plan["selection"] = None
            else:
                item = sel.item
                agent_plan, inv = self._plan_agent(cycle, item, d.restorative, new_id="<new-session-uuid>")
                decision = agent_plan.decision
                argv, env_changes = self._runner().plan(inv)
                plan["selection"] = {**item.as_json(), "ref": item.ref, "rung": sel.rung}
                plan["agent"] = {
                    "mode": decision.mode,
                    "reason": decision.reason,
                    "argv": argv,
                    "env": env_changes,
                    "prompt": inv.prompt,
                }
        self.log.info("fire.dry_run", **{k: v for k, v in plan.items() if k != "agent"})
        out = FireOutcome(exitcodes.OK, "dry-run", halt=d.halt)
        out.entries.append(plan)
        return out
