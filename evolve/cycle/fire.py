"""One fire (SPEC §4): lock, reconcile, Step 1, cycles, the context budget, and the stops.

This is the imperative shell: it reads files, runs processes and writes the effects of the pure
decisions in :mod:`halt`, :mod:`budget`, :mod:`reconcile`, :mod:`entry` and
:mod:`evolve.agent.session`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from evolve import exitcodes, gitops
from evolve import log as logmod
from evolve.agent import session as sessions
from evolve.agent.command import CommandRunner, Invocation
from evolve.agent.process import group_alive, kill_group
from evolve.agent.prompt import build_prompt
from evolve.agent.report import AgentReport
from evolve.config import Config
from evolve.cycle import budget, halt
from evolve.cycle import reconcile as recon
from evolve.cycle.entry import agent_fields, base_entry
from evolve.cycle.handoff import handoff_text, milestone
from evolve.paths import Paths
from evolve.store import session_state
from evolve.store.atomic import atomic_write_bytes, write_json
from evolve.store.ledger import Ledger
from evolve.store.lock import FireLock
from evolve.store.markers import read_marker, remove_marker
from evolve.timeutil import parse_iso, utc_iso
from evolve.work.harvested import HarvestedQueue, append_bytes
from evolve.work.item import ClaimLost, SourceError, WorkItem, WorkSource, clean_text

_SUFFIX = re.compile(r"-\d+(st|nd|rd|th)?$")


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


def work_mode(source: str, item_type: str) -> str:
    """The metronome's ``mode``: ``selected_source:shape`` with an ordinal suffix stripped."""
    return f"{source}:{_SUFFIX.sub('', item_type or 'work')}"


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
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.opts = opts
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.ledger = Ledger(paths.ledger)
        self.fire_id = uuid.uuid4().hex[:12]
        self.log = logmod.get("evolve.fire")
        self.stop = threading.Event()
        self.signal_received: int | None = None
        self.mode = opts.mode or cfg.fire.mode
        repo_names = (paths.repo.name,)
        self.sources: list[WorkSource] = sources or [
            HarvestedQueue(paths.nextwork, repo_names=repo_names, quality=cfg.work.quality)
        ]
        self.state = session_state.SessionState()

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
        loaded = session_state.load(self.paths.state, self.ledger)
        self.state = loaded.state
        for w in loaded.warnings:
            self.log.warning("state.repaired", detail=w)
        self.log.info("fire.start", pid=os.getpid(), mode=self.mode, repo=str(self.paths.repo))
        self._reconcile()

        step1 = self._step1(now)
        if step1.halt:
            self.log.info("halt", reason=step1.halt, detail=step1.detail)
            self._save()
            self.log.info("fire.end", reason=f"halt:{step1.halt}", cycles=0, exit_code=0)
            return FireOutcome(exitcodes.OK, f"halt:{step1.halt}", halt=step1.halt)

        self.state.fire = {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "agent_pgid": None,
            "started_at": utc_iso(now),
            "cycle": None,
            "fire_id": self.fire_id,
        }
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
        return outcome

    def _save(self) -> None:
        session_state.save(self.paths.state, self.state)

    # -- reconciliation --------------------------------------------------------------------

    def _reconcile(self) -> None:
        last = self.ledger.last()
        d = recon.decide(self.state.fire, self.state.claimed_work, self.ledger.last_cycle(), last)
        if not d.dead_fire and d.claim is None:
            return
        if d.kill_pgid and group_alive(d.kill_pgid):
            self.log.warning("reconcile.kill_orphan", pgid=d.kill_pgid)
            kill_group(d.kill_pgid, grace_s=2.0)
        claimed = self.state.claimed_work
        if d.crashed_cycle is not None:
            fire = self.state.fire or {}
            entry = base_entry(
                cycle=d.crashed_cycle,
                result="crashed",
                timestamp=utc_iso(self.clock()),
                target=(claimed or {}).get("ref") or "idle",
                source=(claimed or {}).get("source") or "idle",
                work_ref=(claimed or {}).get("ref"),
                mode="crashed",
                session_id=(self.state.agent_session or {}).get("id"),
                fire_id=str(fire.get("fire_id", "")),
            )
            entry.update(error_class="crashed", crashed_fire_pid=fire.get("pid"))
            self.ledger.append(entry)
            self.state.last_logged_cycle = d.crashed_cycle
            self.state.last_result = "crashed"
            self.log.warning("reconcile.crashed", cycle=d.crashed_cycle, dead_pid=fire.get("pid"))
        if claimed and d.claim:
            item = self._claimed_item(claimed)
            src = self._source(claimed.get("source"))
            if src is not None and item is not None:
                try:
                    if d.claim == "finalize":
                        src.finalize(item, str(claimed.get("claimed_by")), utc_iso(self.clock()))
                    else:
                        src.release(item, claimed.get("claimed_by"), utc_iso(self.clock()), "crashed")
                except (SourceError, OSError) as exc:
                    self.log.warning("reconcile.claim_error", error=str(exc))
            self.log.info("reconcile.claim", action=d.claim, ref=claimed.get("ref"))
            self.state.claimed_work = None
        self.state.fire = None
        self._save()

    def _claimed_item(self, claimed: dict[str, Any]) -> WorkItem | None:
        ref = claimed.get("ref")
        if not isinstance(ref, str):
            return None
        return WorkItem(source=str(claimed.get("source", "")), ref=ref, title=str(claimed.get("title", "")))

    def _source(self, name: object) -> WorkSource | None:
        return next((s for s in self.sources if s.name == name), None)

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
        try:
            for src in self.sources:
                if src.candidates():
                    return "work"
        except SourceError as exc:
            self.log.warning("source.probe_error", error=str(exc))
            return "error"
        return "empty"

    def _run_governor(self) -> int:
        argv = self.cfg.halt.governor_cmd
        try:
            proc = subprocess.run(
                argv, cwd=self.paths.repo, capture_output=True, timeout=self.cfg.halt.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log.warning("governor.error", error=str(exc)[:300])
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

    def _select(self, restorative: bool) -> tuple[WorkItem | None, bool]:
        """The top selectable item (re-read from disk now) and whether any probe failed."""
        errored = False
        for src in self.sources:
            try:
                items = src.candidates()
            except SourceError as exc:
                self.log.warning("source.probe_error", source=src.name, error=str(exc))
                errored = True
                continue
            if restorative:
                items = [i for i in items if i.is_red_reducing]
            if items:
                return items[0], errored
        return None, errored

    def _claim(self, cycle: int, item: WorkItem, claimer: str) -> bool:
        """Record the claim in session-state first, then claim in the source.

        In that order a crash in between leaves a recorded claim the next fire releases as a
        no-op, never an ``in_progress`` item nobody knows about.
        """
        st = self.state
        now = utc_iso(self.clock())
        st.claimed_work = {
            "ref": item.ref,
            "source": item.source,
            "claimed_by": claimer,
            "claimed_at": now,
            "cycle": cycle,
            "title": item.title,
        }
        assert st.fire is not None
        st.fire["cycle"] = cycle
        self._save()
        src = self._source(item.source)
        assert src is not None
        try:
            src.claim(item, claimer, now)
        except ClaimLost:
            self.log.info("claim.lost", ref=item.ref)
            st.claimed_work = None
            st.fire["cycle"] = None
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
            cycle = self.ledger.last_cycle() + 1
            logmod.bind(cycle=cycle)
            item, errored = self._select(restorative)
            if item is None:
                self._idle_cycle(cycle, errored, outcome)
                outcome.reason = "idle" if not errored else "probe_error"
                return
            claimer = f"evolve:cycle-{cycle}"
            if not self._claim(cycle, item, claimer):
                lost += 1
                if lost >= 10:
                    outcome.reason = "claims_lost"
                    return
                continue
            stop = self._work_cycle(cycle, item, claimer, restorative, outcome)
            outcome.cycles += 1
            restorative = restorative and self.state.last_result in ("regressed", "failed")
            if stop:
                outcome.reason = stop
                return

    def _idle_cycle(self, cycle: int, errored: bool, outcome: FireOutcome) -> None:
        now = self.clock()
        entry = base_entry(
            cycle=cycle,
            result="unchanged",
            timestamp=utc_iso(now),
            target="idle",
            source="idle",
            work_ref=None,
            mode="idle",
            session_id=(self.state.agent_session or {}).get("id"),
            fire_id=self.fire_id,
        )
        if errored:
            entry["probe_error"] = True
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.log.info("cycle.idle", cycle=cycle, probe_error=errored)
        st = self.state
        st.last_logged_cycle = cycle
        st.last_result, st.last_mode, st.last_selected_source = "unchanged", "idle", "idle"
        st.agent_session = sessions.note_event(st.agent_session)
        if errored:
            # A probe error is never "empty": it must not walk the loop towards DORMANT.
            self._save()
            return
        st.idle_streak += 1
        st.generator_empty_streak += 1
        if st.idle_streak >= 2 and st.generator_empty_streak >= 2:
            reason = "stagnation: all sources empty x3"
            if self.mode == "burst":
                text = f"cycle {cycle}\n{utc_iso(now)}\n{reason}\n"
                atomic_write_bytes(self.paths.dormant, text.encode())
                self.log.info("dormant.written", cycle=cycle)
            else:
                import orjson

                row = {
                    "cycle": cycle,
                    "timestamp": utc_iso(now),
                    "reason": reason,
                    "needed_context": "queue empty; operator adds work or a marker",
                }
                append_bytes(self.paths.blocked, orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
                self.log.info("blocked.logged", cycle=cycle)
        self._save()

    def _write_cycle_state(self, cycle: int, item: WorkItem, phase: str, start_sha: str | None) -> None:
        write_json(
            self.paths.cycle_state,
            {
                "cycle": cycle,
                "phase": phase,
                "step": phase,
                "work_ref": item.ref,
                "title": item.title,
                "plan_items": [],
                "cycle_start_sha": start_sha,
                "written_at": utc_iso(self.clock()),
            },
        )

    def _work_cycle(
        self, cycle: int, item: WorkItem, claimer: str, restorative: bool, outcome: FireOutcome
    ) -> str | None:
        st = self.state
        st.idle_streak = 0
        st.generator_empty_streak = 0
        repo = self.paths.repo
        start_sha = gitops.head(repo)
        dirty_before = gitops.dirty_paths(repo)
        self._write_cycle_state(cycle, item, "agent", start_sha)
        self.log.info("cycle.start", cycle=cycle, ref=item.ref, title=item.title, source=item.source)

        decision, inv = self._plan_agent(cycle, item, restorative)
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
            st.fire["agent_pgid"] = pgid
            self._save()

        def on_heartbeat(elapsed: float) -> None:
            self.log.info("agent.heartbeat", cycle=cycle, elapsed_s=round(elapsed, 1))

        report = self._runner().run(inv, on_start=on_start, stop=self.stop, on_heartbeat=on_heartbeat)
        st.fire["agent_pgid"] = None
        outcome.cost_usd += report.cost_usd

        if report.error_class == "interrupted":
            with contextlib.suppress(gitops.GitError):
                gitops.restore_cycle(repo, start_sha, dirty_before)
            return self._finish(cycle, item, claimer, decision, report, "interrupted", {}, outcome)

        result, extra = self._gate(cycle, item, report, start_sha, dirty_before)
        return self._finish(cycle, item, claimer, decision, report, result, extra, outcome)

    def _plan_agent(
        self, cycle: int, item: WorkItem, restorative: bool, new_id: str | None = None
    ) -> tuple[sessions.ModeDecision, Invocation]:
        """Resume or start fresh, and the exact invocation that follows (shared with --dry-run)."""
        session = self.state.agent_session
        events = (session or {}).get("events_since", 0)
        decision = sessions.choose_mode(
            session,
            item.ref,
            events_since=events if isinstance(events, int) else 0,
            fresh_start_turns=self.cfg.context.returning_fresh_start_turns,
            new_id=new_id,
        )
        prior = (session or {}).get("summary", "") if decision.mode == sessions.FIRST else ""
        inv = Invocation(
            repo=self.paths.repo,
            run_dir=self.paths.runs_dir,
            cycle=cycle,
            mode=decision.mode,
            session_id=decision.session_id,
            resume=decision.resume,
            work=item,
            prompt=build_prompt(
                cycle=cycle, mode=decision.mode, work=item, prior_summary=prior, restorative=restorative
            ),
        )
        return decision, inv

    def _runner(self) -> CommandRunner:
        return CommandRunner(self.cfg.agent, self.env)

    def _gate(
        self, cycle: int, item: WorkItem, report: AgentReport, start_sha: str | None, dirty_before: set[str]
    ) -> tuple[str, dict[str, Any]]:
        """Verify the agent's word: the cycle's own changes, the gate commands, the commit."""
        repo = self.paths.repo
        extra: dict[str, Any] = {"cycle_start_sha": start_sha}
        if report.result == "failed":
            with contextlib.suppress(gitops.GitError):
                gitops.restore_cycle(repo, start_sha, dirty_before)
            return "failed", extra
        touched = (gitops.dirty_paths(repo) - dirty_before) | gitops.changed_since(repo, start_sha)
        real = gitops.substantive(touched)
        gate_red = self._run_gate_commands()
        if gate_red:
            self.log.warning("gate.fail", cycle=cycle, detail=gate_red)
            gitops.restore_cycle(repo, start_sha, dirty_before)
            extra.update(gate="FAIL", gate_detail=gate_red)
            return "regressed", extra
        result = report.result
        if result == "improved" and not real:
            result = "unchanged"
            extra["downgraded_from"] = "improved"
        to_commit = [p for p in (gitops.dirty_paths(repo) - dirty_before) if not gitops.is_internal(p)]
        if self.cfg.git.commit and to_commit:
            target = clean_text(item.title, 72)
            try:
                sha = gitops.commit_paths(repo, to_commit, gitops.commit_message(cycle, target, result))
            except gitops.GitError as exc:
                self.log.error("git.commit_failed", error=str(exc))
                sha = None
            if sha:
                self.log.info("git.commit", sha=sha, paths=len(to_commit))
        head = gitops.head(repo)
        if head and head != start_sha:
            extra["sha"] = head
        if self.cfg.gate.commands:
            extra["gate"] = "PASS"
        return result, extra

    def _run_gate_commands(self) -> str | None:
        for argv in self.cfg.gate.commands:
            try:
                proc = subprocess.run(
                    argv,
                    cwd=self.paths.repo,
                    capture_output=True,
                    text=True,
                    timeout=self.cfg.gate.timeout_s or None,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                return f"{argv[0]}: timed out"
            except OSError as exc:
                return f"{argv[0]}: {exc}"
            out = proc.stdout + proc.stderr
            if proc.returncode != 0:
                return f"{argv[0]}: exit {proc.returncode}"
            if re.search(r"Pass [0-9]+: (FAILED|BLOCKED)", out):
                return f"{argv[0]}: structural FAILED/BLOCKED marker"
        return None

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
    ) -> str | None:
        st = self.state
        src = self._source(item.source)
        assert src is not None
        now = self.clock()
        reading = budget.read_context(
            report, heavy_pct=self.cfg.context.heavy_pct, window_override=self.cfg.context.context_window
        )
        mode = work_mode(item.source, item.type)
        entry = base_entry(
            cycle=cycle,
            result=result,
            timestamp=utc_iso(now),
            target=item.title,
            source=item.source,
            work_ref=item.ref,
            mode=mode,
            session_id=report.session_id or decision.session_id,
            fire_id=self.fire_id,
        )
        entry["agent_mode"] = decision.mode
        entry.update(agent_fields(report, reading))
        entry.update(extra)
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.log.info(
            "cycle.end",
            cycle=cycle,
            result=result,
            context_heavy=reading.heavy,
            context_signal=reading.signal or None,
            cost_usd=report.cost_usd,
        )

        # The claim: consumed only after the gate said yes; otherwise back to the queue.
        stamp = utc_iso(now)
        try:
            if result in ("improved", "harvested", "unchanged") and not reading.heavy:
                src.finalize(item, claimer, stamp)
                st.parked_work = [r for r in st.parked_work if r != item.ref]
            else:
                src.release(item, claimer, stamp, result)
        except (SourceError, OSError) as exc:
            self.log.error("claim.error", error=str(exc))
        st.claimed_work = None

        st.agent_session = sessions.after_run(
            st.agent_session,
            decision,
            runner=self.cfg.agent.runner,
            cycle=cycle,
            work_ref=item.ref,
            reported_id=report.session_id,
            summary=report.summary,
        )
        st.last_logged_cycle = cycle
        st.mode_repeat_streak = st.mode_repeat_streak + 1 if st.last_mode == mode else 1
        st.last_result, st.last_mode, st.last_selected_source = result, mode, item.source
        prev_streak = st.context_streak
        st.context_streak = budget.next_streak(prev_streak, heavy=reading.heavy, result=result)
        if reading.heavy and item.ref not in st.parked_work:
            st.parked_work = [*st.parked_work, item.ref]
        if st.context_streak != prev_streak:
            self.log.info(
                "context.streak", streak=st.context_streak, limit=self._streak_limit(), signal=reading.signal or None
            )

        stop: str | None = None
        if result == "failed" and report.error_class != "limit":
            st.consecutive_failures += 1
            if st.consecutive_failures >= self.cfg.breaker.max_consecutive_failures:
                until = now + self.cfg.breaker.cooldown_minutes * 60
                st.breaker_open_until = utc_iso(until)
                self.log.warning("breaker.open", failures=st.consecutive_failures, until=st.breaker_open_until)
                stop = "breaker_open"
        elif result not in ("failed", "interrupted"):
            if st.consecutive_failures or st.breaker_open_until:
                self.log.info("breaker.closed")
            st.consecutive_failures = 0
            st.breaker_open_until = None
        self._save()
        self.paths.cycle_state.unlink(missing_ok=True)

        if result == "interrupted":
            outcome.exit_code = exitcodes.SIGTERM
            return "interrupted"
        if report.error_class == "limit":
            outcome.exit_code = exitcodes.TEMPFAIL
            return "rate_limited"
        if report.error_class == "fatal":
            outcome.exit_code = exitcodes.ERROR
            return "agent_fatal"
        if budget.handoff_due(st.context_streak, self._streak_limit()):
            self._handoff(cycle + 1, item, outcome)
            return "context-handoff"
        return stop

    def _streak_limit(self) -> int:
        return self.cfg.context.streak_limit

    def _handoff(self, cycle: int, item: WorkItem, outcome: FireOutcome) -> None:
        """Write HANDOFF and the ``context-handoff`` entry; the fire then ends with exit 0."""
        st = self.state
        now = utc_iso(self.clock())
        streak = st.context_streak
        parked = list(st.parked_work)
        atomic_write_bytes(self.paths.handoff, handoff_text(now, streak, parked).encode())
        entry = base_entry(
            cycle=cycle,
            result="context-handoff",
            timestamp=now,
            target=item.title,
            source=item.source,
            work_ref=item.ref,
            mode="context-handoff",
            session_id=(st.agent_session or {}).get("id"),
            fire_id=self.fire_id,
        )
        entry["milestone"] = milestone(streak, parked)
        entry["parked_work"] = parked
        entry["context_streak"] = streak
        self.ledger.append(entry)
        outcome.entries.append(entry)
        st.last_logged_cycle = cycle
        st.last_result = "context-handoff"
        st.context_streak = 0
        if st.agent_session:
            st.agent_session = {**st.agent_session, "ended_heavy": True}
        self._save()
        self.log.info("handoff.written", cycle=cycle, streak=streak, parked=parked, path=str(self.paths.handoff))

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
            item, errored = self._select(d.restorative)
            cycle = self.ledger.last_cycle() + 1
            plan["cycle"] = cycle
            plan["probe_error"] = errored
            if item is None:
                plan["selection"] = None
            else:
                decision, inv = self._plan_agent(cycle, item, d.restorative, new_id="<new-session-uuid>")
                argv, env_changes = self._runner().plan(inv)
                plan["selection"] = item.as_json()
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
