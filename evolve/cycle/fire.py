"""One fire (docs/DESIGN.md §4): lock, recovery, Step 1, cycles, the context budget, and the stops.

This is the imperative shell's loop: it reads, runs and writes; every decision is a pure function
elsewhere — Step 1 in :mod:`~evolve.cycle.halt`, selection in :mod:`~evolve.work.ladder`, the
session and the prompt in :mod:`~evolve.harness.plan`, retries in :mod:`~evolve.agent.retry`, the
gate's verdict in :mod:`~evolve.cycle.gate`, and everything after a cycle in
:func:`~evolve.cycle.transition.after_cycle`. The shell pieces that run no agent (recovery, Step 1,
idle and side cycles, scout dispositions) share a :class:`~evolve.cycle.context.FireContext`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evolve import configtrust, crashpoint, exitcodes, redact
from evolve import log as logmod
from evolve import sandbox as sandboxes
from evolve.agent import preflight as agent_preflight
from evolve.agent import prompt, retry
from evolve.agent import session as sessions
from evolve.agent import settings as agent_settings
from evolve.agent.invocation import Invocation
from evolve.agent.report import AgentReport, redacted
from evolve.agent.runners import RESUMING_CLIS, Runner, make_runner
from evolve.childenv import seal_own_environ, with_path
from evolve.config import Config
from evolve.cycle import (
    budget,
    door,
    dryrun,
    guard,
    halt,
    recovery,
    retention,
    scout,
    settle,
    side,
    transition,
    watch,
    workspace,
)
from evolve.cycle import checks as cycle_checks
from evolve.cycle import sees as ws_sees
from evolve.cycle import setup as ws_setup
from evolve.cycle import step1 as step1_shell
from evolve.cycle.context import FireContext, Observer
from evolve.cycle.entry import agent_fields, base_entry, last_attempt_note
from evolve.cycle.gate import Gate
from evolve.cycle.handoff import handoff_text, milestone
from evolve.cycle.pending import Held
from evolve.cycle.select import Selector
from evolve.git import change as gitchange
from evolve.git import checks as gitchecks
from evolve.git import filters as gitfilters
from evolve.git import leaks
from evolve.git import refs as gitrefs
from evolve.git import run as gitrun
from evolve.git import trust as gittrust
from evolve.harness import handoff as handoffs
from evolve.harness import hooks as harness_hooks
from evolve.harness import plan as plans
from evolve.paths import Paths
from evolve.procgroup import FIRE_TAG, sandboxed, stop_signals
from evolve.results import CycleResult
from evolve.store import session_state
from evolve.store.atomic import atomic_write_bytes, write_json
from evolve.store.dirfd import ensure_dir
from evolve.store.ledger import Ledger
from evolve.store.lock import FireLock
from evolve.store.markers import remove_marker
from evolve.store.records import ClaimedWork, FireRecord
from evolve.timeutil import utc_iso
from evolve.work import ladder
from evolve.work.item import ClaimLost, SourceError, WorkItem, WorkSource, hold_note

MAX_SCOUTS_PER_CYCLE = 3


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
        mono: Callable[[], float] = time.monotonic,
        sources: list[WorkSource] | None = None,
        stop: threading.Event | None = None,
        observers: list[Observer] | None = None,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.opts = opts
        self.env = dict(os.environ if env is None else env)
        self.clock, self.mono = clock, mono  # wall time for timestamps; budgets on mono, deaf to clock steps
        self.ledger = Ledger(paths.ledger)
        self.fire_id = uuid.uuid4().hex[:12]
        # Every child carries the fire's id: if this fire dies, the next one finds and stops them all.
        self.env[FIRE_TAG] = self.fire_id
        # Every sink of this process masks the secrets of the fire's environment from now on.
        redact.activate(self.env)
        self.log = logmod.get("evolve.fire")
        # A daemon passes its own stop event: its main thread owns the signals, the fire runs in a job thread.
        self.stop = stop or threading.Event()
        self.signal_received: int | None = None
        self.mode = opts.mode or cfg.fire.mode
        self.selector = Selector(paths, cfg, self.env, self.log, write=not opts.dry_run, sources=sources, clock=clock)
        self.gate = Gate(paths, cfg, self.log, self.env)
        # What the gate will see (§8.4): the worktree's setup, links and copies, and the gate probe.
        self.prep = ws_setup.Preparer(paths, cfg, self.env, self.log, self.stop)
        self.gate.before = self.prep.before_gate
        # Where the agent works: the operator's checkout until _locked opens the configured one (§8.3).
        self.ws: workspace.Workspace = workspace.InPlace(paths.repo, self.gate.git_policy, self.log)
        self.ctx = FireContext(
            paths, cfg, self.ledger, self.log, clock, self.fire_id, self.env, self.selector,
            observers=list(observers or []),
        )
        self.started = mono()
        self._plan: plans.AgentPlan | None = None  # this cycle's agent plan (session, hand-off, prompt)
        # A KILL or STOP found after Step 1 (§4.4): the Step-1 reason, and whether a running agent was
        # interrupted for it (exit 143) or the fire just started nothing new (exit 0).
        self.halted: str | None = None
        self.halted_agent = False
        # What evolve obeys, sealed when the fire starts and when each cycle starts (§8.5 The guard); the reason
        # the guard refused a cycle, which ends the fire.
        self.common = gittrust.common_dir(paths.repo)
        self.fire_seal: guard.Seal | None = None
        self.cycle_seal: guard.Seal | None = None
        self.guarded: str | None = None
        self._cycle = 0
        self.gate.guard = self._guard_check
        self._phase = "agent_running"  # what a KILL found running: the agent, or the gate and landing after it
        self._box_decision: sandboxes.Decision | None = None  # the sandbox, decided once per fire (§8.6)
        self._box_bwrap: str | None = None
        self._box_flags: tuple[str, ...] = ()

    @property
    def state(self) -> session_state.SessionState:
        """The loop's state, shared with every shell piece through :attr:`ctx`."""
        return self.ctx.state

    @state.setter
    def state(self, value: session_state.SessionState) -> None:
        self.ctx.state = value

    # -- entry point -----------------------------------------------------------------------

    def run(self) -> FireOutcome:
        logmod.bind(fire_id=self.fire_id)
        seal_own_environ()  # the agent and the repo's code must not read our secrets from /proc
        try:
            if self.opts.dry_run:
                try:
                    return self._dry_run()
                finally:
                    recovery.reap(self.ctx)  # its probes carry the tag too
            lock = FireLock(self.paths.lock)
            if not lock.acquire(self.opts.wait_s):
                self.log.info("fire.skipped", reason="another fire holds the lock", lock=str(self.paths.lock))
                return FireOutcome(exitcodes.TEMPFAIL, "busy")
            with lock, self._signals(), retention.bounded(self.ctx, self._remaining_s):  # §12: every step bounded
                try:
                    return self._locked()
                finally:
                    recovery.reap(self.ctx)  # still under the lock: nothing of ours outlives the fire into the next
        finally:
            logmod.unbind("fire_id", "cycle")

    @contextlib.contextmanager
    def _signals(self):
        """SIGTERM/SIGINT/SIGHUP: stop claiming, interrupt the agent group, record ``interrupted``.

        Every one of them ends the fire with exit 143, SIGHUP included: 143 is what the units'
        ``SuccessExitStatus`` and the daemon's counts already read as "stopped after recording
        ``interrupted``", and a hang-up asks for nothing else (128+1 would be a second code for it).
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        got: dict[str, int] = {}

        def handler(signum: int, _frame: Any) -> None:
            got["sig"] = signum
            self.stop.set()

        old = {s: signal.signal(s, handler) for s in stop_signals()}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.signal_received = got.get("sig")

    # -- the locked fire -------------------------------------------------------------------

    def _locked(self) -> FireOutcome:
        now = self.clock()
        ensure_dir(self.paths.evolve_dir)  # (FireLock has already refused a linked one)
        left = guard.outstanding(self.paths)
        if left:
            # A file evolve obeys was changed during an agent or gate run and is still as it was left (§8.5):
            # nothing runs, not even the notify command (the config loaded may be the agent's).
            detail = guard.describe(left)
            self.log.error("guard.refused", detail=detail)
            self.log.info("fire.end", reason="guard_refused", cycles=0, exit_code=exitcodes.CONFIG)
            return FireOutcome(exitcodes.CONFIG, "guard_refused")
        torn = self.ledger.repair_torn()
        if torn:
            self.log.warning("ledger.torn_line", moved_to=str(torn))
        recovery.sweep(self.ctx)
        loaded = session_state.load(self.paths.state, self.ledger)
        self.state = loaded.state
        for w in loaded.warnings:
            self.log.warning("state.repaired", detail=w)
        self.log.info("fire.start", pid=os.getpid(), mode=self.mode, repo=str(self.paths.repo))
        recovery.recover(self.ctx)

        step1 = step1_shell.run(self.ctx, now)
        if step1.halt:
            self.log.info("halt", reason=step1.halt, detail=step1.detail)
            self.ctx.emit("halt", reason=step1.halt, detail=step1.detail)
            self.ctx.save()
            return self._ended(FireOutcome(exitcodes.OK, f"halt:{step1.halt}", halt=step1.halt))
        if not self._preflight():
            return self._ended(FireOutcome(exitcodes.CONFIG, "preflight"))
        busy = workspace.busy(self.paths.repo)
        if busy:
            # The operator is mid-rebase (or detached, bisecting...): touch nothing, land nothing (§8.3).
            self.log.info("fire.operator_busy", reason=busy,
                          detail="no cycle runs until your checkout is back on a branch")
            self.ctx.save()
            return self._ended(FireOutcome(exitcodes.OK, "operator_busy"))

        self.state.fire = FireRecord(
            pid=os.getpid(), pgid=os.getpgid(0), agent_pgid=None, started_at=utc_iso(now), cycle=None,
            fire_id=self.fire_id,
        )
        self.ctx.save()
        outcome = FireOutcome()
        try:
            with sandboxed(self._sandbox()):  # the agent, gate, setup, probe and goal checks inside it (§8.6)
                if self._open_workspace(outcome):
                    self.fire_seal = self._seal()  # after evolve's own set-up writes
                    self._cycles(step1, outcome, started=self.mono())
        except Exception as exc:
            # session-state.fire stays recorded: the next fire reconciles this one as crashed
            # (ledger entry, claim released, agent group killed) exactly as after a SIGKILL.
            self.log.exception("fire.error", error=str(exc)[:300])
            raise
        self.state.fire = None
        self.ctx.save()
        self.paths.cycle_state.unlink(missing_ok=True)
        return self._ended(outcome)

    def _secrets(self) -> leaks.Secrets:
        """The values no landing may hold (§8.3 *Secrets*): what the redactor masks (this process's environment
        and the fire's), what any ``pass_env`` hands a child, the HTTP runner's credential."""
        c = self.cfg
        passed = (*c.agent.pass_env, *c.gate.pass_env, *c.work.pass_env, *c.workspace.pass_env, *c.halt.pass_env,
                  *c.notify.pass_env)
        return leaks.held({**os.environ, **self.env}, passed, (c.agent.api_key_env,))

    def _checks(self) -> gitchecks.Checks:
        """What a chain may not rewrite without the operator (§8.5): files the gate commands name, GOALS checks."""
        return gitchecks.Checks(gitchecks.named_paths(self.cfg.gate.commands),
                                gitchecks.load_trusted(self.paths.checks_trust), goal_checks=cycle_checks.goal_checks)

    def _open_workspace(self, outcome: FireOutcome) -> bool:
        """The agent's tree for this fire (§8.3): made, a dead cycle's work set aside, waiting commits
        landed (and recorded), standing at the base. False (the fire ends, exit 1) when git cannot give us
        one; either way ``workspace-health.json`` says so for ``status`` (§8.3)."""
        gittrust.adopt_legacy(self.paths.git_trust, self.paths.git_trust_legacy)
        gittrust.register(self.paths.repo, self.paths.git_trust)  # the operator's approved filters run (§8.1)
        error = None
        try:
            ws = workspace.open_workspace(
                self.paths.repo, self.paths, self.cfg.git, self.gate.git_policy, self.log, regate=self.gate.regate,
                secrets=self._secrets(), checks=self._checks(),
            )
            ws.prepare(self.ledger.last_cycle())
        except (gitrun.GitError, OSError) as exc:
            self.log.error("workspace.error", error=str(exc)[:300])
            outcome.reason, outcome.exit_code = "workspace_error", exitcodes.ERROR
            error = str(exc)
        with contextlib.suppress(gitrun.GitError, OSError):
            gitfilters.note_workspace(self.paths, error=error, fire_id=self.fire_id)
        if error is not None:
            return False
        self.ws = ws
        self._settle_waiting()
        if self.gate.publisher is not None:
            self.gate.publisher.retry()
        self.selector.work_in(ws.tree)
        return True

    def _settle_waiting(self) -> None:
        """Waiting cycles a landing settled: their ledger entries and claims (:func:`settle.waiting`)."""
        settle.waiting(self.ctx, self.ws, self.gate.publisher)

    def _preflight(self) -> bool:
        """The runner preflight (what `doctor` checks cheaply) before any claim: a config error is not the item's.
        Then the sandbox (§8.6): a ``required`` one that cannot start refuses the fire here, before any claim."""
        problems, _ = agent_preflight.check(self.cfg.agent, self.env, worktree=self.cfg.git.isolation == "worktree")
        # §8.5: a committed, untrusted Codex or Gemini settings file that the CLI would read and no flag keeps out.
        refusal = agent_settings.for_config(self.paths, self.cfg, self.env).refusal
        if refusal:
            problems = [*problems, agent_preflight.Problem(refusal, "review it, then `evolve trust`")]
        for p in problems:
            self.log.error("preflight.failed", error=p.message, fix=p.fix, runner=self.cfg.agent.runner)
        if problems:
            self.ctx.emit("preflight.failed", errors=[p.message for p in problems], fix=problems[0].fix)
            return False
        d = self._sandbox_decision()
        with contextlib.suppress(OSError):  # what `evolve status` shows (it never probes)
            write_json(self.paths.sandbox_state, redact.current().json(  # the sink: bwrap's error line
                {**sandboxes.state_json(d, self.cfg.sandbox.network, self.cfg.sandbox.mode),
                 "at": utc_iso(self.clock()), "fire_id": self.fire_id}))
        if d.refuse:
            self.log.error("preflight.failed", check="sandbox", error=d.refuse)
            self.ctx.emit("preflight.failed", check="sandbox", errors=[d.refuse], fix=sandboxes.INSTALL)
            return False
        if d.warning:
            self.log.warning("sandbox.none", detail=d.warning)
        else:
            self.log.info("sandbox", in_force=d.label)
        return True

    def _sandbox_decision(self) -> sandboxes.Decision:
        """Which sandbox this fire runs its children in: bwrap probed once per fire (§8.6)."""
        if self._box_decision is None:
            sb = self.cfg.sandbox
            found = sandboxes.Probe(None) if sb.mode == "off" else sandboxes.probe(self.env, sb.network)
            self._box_decision = sandboxes.decide(sb.mode, sb.network, found)
            self._box_bwrap, self._box_flags = found.bwrap, found.flags
        return self._box_decision

    def _sandbox(self) -> sandboxes.Sandbox | None:
        """The fire's sandbox, when one is in force: its scope is where this fire's agent works (§8.6)."""
        d = self._sandbox_decision()
        if not d.use or self._box_bwrap is None:
            return None
        c, p = self.cfg, self.paths
        worktree = c.git.isolation == "worktree"
        tree = workspace.tree_path(p.repo, p.evolve_dir, c.git) if worktree else p.repo
        if p.trust_dir is not None:
            with contextlib.suppress(OSError):  # there to be bound read-only: else a child could make it
                os.makedirs(p.trust_dir, mode=0o700, exist_ok=True)
        sandboxes.prepare_cli_home(c.agent.runner, self.env)
        scope = sandboxes.scope_for(
            repo=p.repo, tree=tree, state_dir=p.evolve_dir, trust_dir=p.trust_dir, env=self.env,
            runner=c.agent.runner, workspace_links=c.workspace.link, extra=c.sandbox.writable,
            exchange=p.exchange_dir,
        )
        return sandboxes.Sandbox(self._box_bwrap, c.sandbox.network, scope, d.label, self._box_flags)

    def _refused(self, r: ws_setup.Refusal | None, outcome: FireOutcome) -> bool:
        """The worktree is not ready for a claim (§8.4): exit 78 with the cause and the fix, before any claim."""
        if r is None:
            return False
        if r.check == "interrupted":
            outcome.reason, outcome.exit_code = "interrupted", exitcodes.SIGTERM
            return True
        self.log.error("preflight.failed", check=r.check, error=r.error, fix=r.fix,
                       **({"output": r.output[-2000:]} if r.output else {}))
        self.ctx.emit("preflight.failed", check=r.check, errors=[r.error], fix=r.fix)
        outcome.reason, outcome.exit_code = f"preflight:{r.check}", exitcodes.CONFIG
        return True

    def _seal(self, *, ledger: bool = False) -> guard.Seal:
        """What evolve obeys, hashed now: with the operator's other config layers (§8.5.1)."""
        extra = [configtrust.user_config_path(self.env)]
        if self.env.get(configtrust.CONFIG_ENV):
            extra.append(Path(self.env[configtrust.CONFIG_ENV]))
        # What the operator's own git and Claude sessions run: a hooksPath, a credential helper or a hook the
        # agent plants there would run outside any sandbox, later, as the operator.
        home = Path(self.env.get("HOME") or Path.home())
        xdg = Path(self.env.get("XDG_CONFIG_HOME") or home / ".config")
        extra += [xdg / "git" / "config", home / ".gitconfig", home / ".claude" / "settings.json"]
        if self.env.get("GIT_CONFIG_GLOBAL"):
            extra.append(Path(self.env["GIT_CONFIG_GLOBAL"]))
        return guard.seal(self.paths, self.common, ledger=ledger, extra=extra)

    def _guard_between(self, outcome: FireOutcome) -> bool:
        """Before each cycle: is what evolve obeys still what it was when the fire started (§8.5)?"""
        if self.fire_seal is None:
            return False
        if self._guard_judge(self.fire_seal, self._seal(), self.ledger.last_cycle(),
                             "time since the last cycle") is None:
            return False
        outcome.reason, outcome.exit_code = "guard_refused", exitcodes.CONFIG
        return True

    def _guard_check(self, phase: str) -> str | None:
        """After the agent ran, and after the gate ran (before anything lands): why the cycle is refused, or None."""
        if self.cycle_seal is None:
            return None
        return self._guard_judge(self.cycle_seal, self._seal(ledger=True), self._cycle, phase)

    def _guard_judge(self, before: guard.Seal, after: guard.Seal, cycle: int, phase: str) -> str | None:
        verdict = guard.judge(before, after)
        if verdict.ok:
            return None
        reason = verdict.reason(phase)
        self.guarded = reason
        changes = [c.shown() for c in verdict.refused]
        self.log.error("guard.refused", cycle=cycle, phase=phase, changes=changes, detail=reason)
        try:
            guard.record(self.paths, verdict, cycle=cycle, phase=phase, at=utc_iso(self.clock()))
        except OSError as exc:
            self.log.error("guard.record_failed", error=str(exc)[:300])
        # The operator's notify command, as loaded when the fire started (before the change).
        self.ctx.emit("guard.refused", cycle=cycle, phase=phase, changes=changes, detail=reason)
        return reason

    def _ended(self, outcome: FireOutcome) -> FireOutcome:
        fields = dict(reason=outcome.reason, cycles=outcome.cycles, exit_code=outcome.exit_code)
        self.log.info("fire.end", **fields, cost_usd=round(outcome.cost_usd, 6))
        self.ctx.emit("fire.end", **fields, cost_usd=round(outcome.cost_usd, 6))
        return outcome

    # -- cycles ----------------------------------------------------------------------------

    def _stop_reason(self, outcome: FireOutcome, started: float) -> str | None:
        max_cycles = self.opts.cycles if self.opts.cycles is not None else self.cfg.fire.max_cycles
        if self.stop.is_set():
            return "interrupted"
        if self.halted or self._operator_halt("between_cycles"):
            return f"halt:{self.halted}"
        if max_cycles and outcome.cycles >= max_cycles:
            return "max_cycles"
        if self.cfg.fire.max_minutes and self.mono() - started >= self.cfg.fire.max_minutes * 60:
            return "max_minutes"
        if self.cfg.fire.max_cost_usd and outcome.cost_usd >= self.cfg.fire.max_cost_usd:
            return "max_cost_usd"
        return None

    def _operator_halt(self, phase: str) -> str | None:
        """A KILL or STOP written since Step 1 (§4.4): its Step-1 reason, noted once; None without one."""
        d = step1_shell.operator_halt(self.ctx, self.clock())
        if d.halt is not None:
            self._note_halt(d, phase)
        return d.halt

    def _killed(self, d: halt.Step1) -> None:
        self._note_halt(d, self._phase)

    def _note_halt(self, d: halt.Step1, phase: str) -> None:
        """Remember the halt, and log and notify it as a ``halt`` the first time only."""
        if self.halted is None:
            self.halted = d.halt
            self.log.info("halt", reason=d.halt, detail=d.detail, phase=phase)
            self.ctx.emit("halt", reason=d.halt, detail=d.detail, phase=phase)

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
        self.ctx.save()
        src = self.ctx.source(item.source)
        assert src is not None
        if item.data.get("claim_status") == "in_progress":  # selected only because that claim went stale
            held = {k: str(item.data.get(k))[:200] for k in ("claimed_by", "claimed_at")}
            self.log.warning("claim.stale_taken", ref=item.ref, **held)
        try:
            src.claim(item, claimer, now)
        except ClaimLost:
            self.log.info("claim.lost", ref=item.ref)
            st.claimed_work = None
            st.fire = replace(st.fire, cycle=None)
            self.ctx.save()
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
                if reason.startswith("halt:"):
                    outcome.halt = self.halted
                return
            if self._refused(self.prep.ready(self.ws, self.ledger.last_cycle() + 1), outcome):
                return
            if self._guard_between(outcome):
                return
            sel = self.selector.select(self.state, restorative=restorative)
            for item, flips in sel.quarantine:
                side.quarantined(self.ctx, item, flips, outcome.entries)
            cycle = self.ledger.last_cycle() + 1
            logmod.bind(cycle=cycle)
            self.log.info("work.selected", rung=sel.rung, ref=sel.item.ref if sel.item else None, reason=sel.reason)
            if sel.blocked_mode is not None:
                side.metronome_blocked(self.ctx, cycle, sel, outcome.entries)
                outcome.reason = "metronome_blocked"
                return
            if sel.item is None:
                side.idle(self.ctx, cycle, sel.probe_errors, self.mode, outcome.entries)
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
            if self.guarded:
                outcome.reason, outcome.exit_code = "guard_refused", exitcodes.CONFIG
                return
            restorative = restorative and self.state.last_result in (CycleResult.REGRESSED, CycleResult.FAILED)
            if stop == "interrupted" and self.halted and not self.stop.is_set():
                # Interrupted by KILL/STOP, not by a signal: the halt's reason; 143 only when a running
                # agent was cut short, exit 0 when it was never started (like a Step-1 halt).
                outcome.reason = f"halt:{self.halted}"
                outcome.halt = self.halted
                outcome.exit_code = exitcodes.SIGTERM if self.halted_agent else exitcodes.OK
                return
            if stop:
                outcome.reason = stop
                return

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
            decision, report, result, extra = self._attempt(cycle, item, restorative, claimer)
            outcome.cost_usd += report.cost_usd
            if result == "interrupted":
                break
            reading = self._reading(report)
            if result != "scout" or reading.heavy or len(scouted) >= MAX_SCOUTS_PER_CYCLE:
                break
            # A scout is never a stop: apply its split/defer/park and take the next candidate now.
            scout.apply(self.ctx, cycle, item, report, claimer)
            scouted.append({"ref": item.ref, "disposition": report.disposition})
            nxt = self.selector.select(st, restorative=restorative, excluded=frozenset(x["ref"] for x in scouted))
            if nxt.item is None or nxt.blocked_mode is not None or not self._claim(cycle, nxt.item, claimer):
                st.claimed_work = None
                self.ctx.save()
                extra["scouted"] = scouted
                return self._finish(cycle, item, claimer, decision, report, "scout", extra, outcome, claim_done=True)
            item = nxt.item
        if scouted:
            extra["scouted"] = scouted
        stop = self._finish(cycle, item, claimer, decision, report, result, extra, outcome)
        if sel.use_rescope and self.paths.rescope.exists():
            remove_marker(self.paths.rescope)
            self.log.info("rescope.consumed", cycle=cycle)
        if self.fire_seal is not None and not self.guarded:  # what evolve itself wrote this cycle is not a change
            self.fire_seal = guard.refreshed(self.fire_seal, self.paths, (self.paths.rescope, self.paths.pins))
        return stop

    def _attempt(
        self, cycle: int, item: WorkItem, restorative: bool, claimer: str
    ) -> tuple[sessions.ModeDecision, AgentReport, str, dict[str, Any]]:
        """Run the agent once on ``item`` and verify what it did."""
        st = self.state
        self.ws.begin(cycle)
        self.cycle_seal = self._seal(ledger=True)  # before the goal checks run repo code
        self._cycle = cycle
        given = door.open_door(self.ctx, self.ws.tree) if self.ws.isolated else None  # its own .agents/ (§8.3)
        # Measure first: what the checks themselves leave behind (caches, build output) is not the cycle's.
        goals, pre = self._goals_before()
        start = self.ws.start()
        self.ctx.write_cycle_state(cycle, item, "agent", start.sha)
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
            self.ctx.save()
            self.log.info("agent.started", cycle=cycle, pgid=pgid, runner=self.cfg.agent.runner)
            crashpoint.reached("agent.running")

        def on_heartbeat(elapsed: float, progress: Mapping[str, Any] | None = None) -> None:
            self.log.info("agent.heartbeat", cycle=cycle, elapsed_s=round(elapsed, 1), **(progress or {}))

        # One watch over the agent, the gate and the landing: a KILL (or signal) stops whichever runs, and
        # nothing lands after it (§4.4).
        with watch.agent_stop(self.ctx, self.stop, self._killed) as run_stop:
            self._phase = "agent_running"
            report = self._run_agent(cycle, inv, run_stop, on_start, on_heartbeat, start)
            assert st.fire is not None
            st.fire = replace(st.fire, agent_pgid=None)
            door.carry(self.ctx, self.ws.tree, given, cycle)  # what it wrote under .agents/ reaches the operator's
            if report.error_class == "interrupted":
                _, kept = self.gate.interrupted(cycle, self.ws, start, "agent run")
                # The report's own error says why (a KILL, a signal, "agent not started"); add where the work is.
                return decision, report, "interrupted", {k: v for k, v in kept.items() if k == "interrupted_ref"}
            self._phase = "gate"
            self.ctx.write_cycle_state(cycle, item, "gate", start.sha)
            held = Held(cycle=cycle, work_ref=item.ref, source=item.source, claimed_by=claimer, title=item.title)
            result, extra = self.gate.verify(cycle, item, report, self.ws, start, goals=goals, pre=pre, held=held,
                                             stop=run_stop)
            if result == CycleResult.INTERRUPTED:
                self.halted_agent = self.halted is not None  # a KILL cut the gate short: 143, like an agent
        return decision, report, result, extra

    def _run_agent(
        self,
        cycle: int,
        inv: Invocation,
        run_stop: threading.Event,
        on_start: Callable[[int], None],
        on_heartbeat: Callable[..., None],
        start: workspace.Start,
    ) -> AgentReport:
        """The agent run and its retries; no agent starts once KILL or STOP exists (§4.4)."""
        runner = self._runner()
        attempt = 0
        while True:
            if self._operator_halt("before_agent"):
                return AgentReport("failed", error_class="interrupted", error=f"{self.halted}: agent not started")
            report = redacted(runner.run(inv, on_start=on_start, stop=run_stop, on_heartbeat=on_heartbeat))
            # Cut short by the watch's KILL (not by a signal): 143, like any interrupted agent.
            self.halted_agent = report.error_class == "interrupted" and self.halted is not None
            if report.warnings:  # the report is untrusted input: say what parsing capped, dropped or zeroed
                self.log.warning("agent.report_sanitized", cycle=cycle, warnings=report.warnings)
            again = retry.decide(
                report,
                attempt,
                remaining_s=self._remaining_s(),
                transient_retries=self.cfg.agent.transient_retries,
                backoff_s=self.cfg.agent.retry_backoff_s,
            )
            if not again.retry:
                return report
            self.gate.undo(self.ws, start)
            event = "agent.limit_wait" if report.error_class == "limit" else "agent.retry"
            self.log.warning(event, cycle=cycle, wait_s=again.wait_s, reason=again.reason, error=report.error[:200])
            if run_stop.wait(again.wait_s):
                if self.halted:  # a KILL ended the wait: the cycle is interrupted, not failed
                    return AgentReport("failed", error_class="interrupted", error=f"{self.halted}: retry wait ended")
                return report
            attempt += 1
            if report.session_id and self.cfg.agent.runner in RESUMING_CLIS:  # carry on in the conversation
                inv = replace(inv, mode="resume", resume=True, session_id=report.session_id)

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
        """Seconds left of the fire's time budget (``fire.max_minutes``; 0 = unbounded), on the monotonic clock."""
        if not self.cfg.fire.max_minutes:
            return float("inf")
        return self.cfg.fire.max_minutes * 60 - (self.mono() - self.started)

    def _reading(self, report: AgentReport) -> budget.ContextReading:
        return budget.read_context(
            report, heavy_pct=self.cfg.context.heavy_pct, window_override=self.cfg.context.context_window
        )

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
                foreign_commits=gitchange.foreign_commits(self.ws.tree, session.last_head if session else None),
                fresh_start_turns=self.cfg.context.returning_fresh_start_turns,
                now=self.clock(),
                request=request,
                request_text=request.text() if request is not None else "",
                restorative=restorative,
                facts=(*prompt.read_learnings(self.paths.repo), *self.state.percepts),
                post_compact=self.state.post_compact,
                new_id=new_id,
                last_attempt=last_attempt_note(self.ledger.tail(500).entries, item.ref),
            )
        )
        self._plan = plan
        d = plan.decision
        inv = Invocation(
            repo=self.ws.tree,
            run_dir=self.paths.runs_dir,
            cycle=cycle,
            mode=d.mode,
            session_id=d.session_id,
            resume=d.resume,
            work=item,
            orientation=plan.orientation,
            fork_from=plan.fork_from,
            exchange_dir=self.paths.exchange_dir,
        )
        return plan, inv

    def _runner(self) -> Runner:
        """The agent runs tests too, so it gets ``[workspace] path`` first on its PATH, as the gate does (§8.4);
        its own program is looked up on the fire's PATH first, so nothing in the worktree can stand in for it."""
        cfg, env = self.cfg, self.env
        dirs = ws_sees.path_dirs(self.ws.tree, cfg.workspace.path)
        if dirs:
            argv = cfg.agent.argv
            found = shutil.which(argv[0], path=env.get("PATH")) if argv and "/" not in argv[0] else None
            if found:
                cfg = replace(cfg, agent=replace(cfg.agent, argv=[found, *argv[1:]]))
            env = with_path(dict(env), dirs)
        if self.ws.isolated:  # the harness hook inside the agent finds evolve's state here, not via .agents/ (§8.3)
            env = {**env, "EVOLVE_DIR": str(self.paths.evolve_dir)}
        return make_runner(cfg, env, self.paths)

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
        src = self.ctx.source(item.source)
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
            error_class=extra.get("error_class") or report.error_class,  # the gate's (commit_failed) first
            percepts=tuple(report.percepts),
            has_new_work=bool(report.new_work),
            directive_era=str(item.data["era"]) if item.source == "directive" and item.data.get("era") else None,
            claim_settled=claim_done or src is None,
        )
        self._record(facts, item, decision, report, reading, extra, outcome)
        t = transition.after_cycle(self.state, facts, self._policy())
        self._apply_claim(t, facts, item, src, claimer, report, str(extra.get("pending_ref") or ""))
        self.state = t.state
        self._after_agent(cycle, item, report, result, now)
        for effect in t.effects:
            getattr(self.log, effect.level)(effect.event, **effect.fields)
            if effect.notify:
                self.ctx.emit(effect.event, **effect.fields)
        self.ctx.save()
        self._settle_waiting()  # earlier cycles this landing settled; then the landing intent goes
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
            title=item.title,
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
        self.ctx.emit("cycle.end", entry=entry)
        if facts.result is CycleResult.REGRESSED:
            self.ctx.emit("regression", cycle=facts.cycle, work_ref=item.ref, detail=extra.get("gate_detail"))

    def _apply_claim(
        self,
        t: transition.Transition,
        facts: transition.CycleFacts,
        item: WorkItem,
        src: WorkSource | None,
        claimer: str,
        report: AgentReport,
        pending_ref: str = "",
    ) -> None:
        """The claim: consumed only after the gate said yes; held while its green work waits to land
        (``pending``: a claim of its own that no reader takes over, §6.1); otherwise back to the source."""
        stamp, cycle = utc_iso(facts.now), facts.cycle
        try:
            if src is not None and t.claim is transition.ClaimAction.FINALIZE:
                src.finalize(item, claimer, stamp)
            elif src is not None and t.claim is transition.ClaimAction.RELEASE:
                src.release(item, claimer, stamp, facts.result)
            elif src is not None and t.claim is transition.ClaimAction.KEEP:
                src.hold(item, claimer, stamp, hold_note(pending_ref, cycle))
        except SourceError as exc:
            self.log.error("claim.error", error=str(exc))
        except OSError as exc:
            # A failing disk: stop loudly, the claim still recorded in session-state for the next fire's
            # recovery to settle from the ledger (dropped here, the item stayed in_progress for good).
            self.log.error("claim.error", error=str(exc))
            raise
        try:
            released = src is not None and t.claim is transition.ClaimAction.RELEASE
            if released and src is not None and t.park is not None and not self._park(src, item, stamp, t.park):
                t.state.parked_items.remove(item.ref)  # not held out (a goal): not listed as parked
            if t.queue_new_work:
                scout.queue_new_work(self.ctx, cycle, list(report.new_work), epic=f"evolve-cycle-{cycle}")
        except (SourceError, OSError) as exc:
            self.log.error("claim.error", error=str(exc))

    def _park(self, src: WorkSource, item: WorkItem, stamp: str, park: transition.Park) -> bool:
        if src.park(item, stamp, park.note):
            self.log.warning("item.parked", ref=item.ref, attempts=park.attempts, remedy=f"evolve requeue {item.ref}")
            return True
        self.log.warning("item.attempts_spent", ref=item.ref, attempts=park.attempts, note="source cannot park")
        return False

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
            head=gitrefs.head(self.ws.tree), compact_text=compact,
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
        atomic_write_bytes(self.paths.handoff, redact.current().text(handoff_text(now, streak, parked)).encode())
        entry = self.ctx.entry(cycle, CycleResult.CONTEXT_HANDOFF, item, item.source, "context-handoff", now)
        entry["milestone"] = milestone(streak, parked)
        entry["parked_work"] = parked
        entry["context_streak"] = streak
        self.ledger.append(entry)
        outcome.entries.append(entry)
        self.state = transition.after_handoff(st, cycle)
        self.ctx.save()
        self.log.info("handoff.written", cycle=cycle, streak=streak, parked=parked, path=str(self.paths.handoff))
        self.ctx.emit("handoff.written", cycle=cycle, streak=streak, parked=parked)

    # -- dry run ---------------------------------------------------------------------------

    def _dry_run(self) -> FireOutcome:
        """Step 1 and the selection evaluated, the agent call planned; nothing applied or written."""
        now = self.clock()
        self.state = session_state.load_readonly(self.paths.state, self.ledger)
        d = step1_shell.run(self.ctx, now, apply=False)
        plan: dict[str, Any] = {"step1": dryrun.step1_json(d)}
        if not d.halt:
            sel = self.selector.select(self.state, restorative=d.restorative)
            cycle = self.ledger.last_cycle() + 1
            plan.update(dryrun.selection_json(cycle, sel, self.selector.generated_preview))
            plan["selection"] = None
            if sel.item is not None:
                agent_plan, inv = self._plan_agent(cycle, sel.item, d.restorative, new_id="<new-session-uuid>")
                busy = workspace.busy(self.paths.repo)
                if busy:
                    plan["workspace"] = {"operator_busy": busy, "would_run": False}
                else:
                    ws = workspace.open_workspace(self.paths.repo, self.paths, self.cfg.git, self.gate.git_policy,
                                                  self.log)
                    plan["workspace"] = workspace.describe(ws)
                plan["selection"] = {**sel.item.as_json(), "ref": sel.item.ref, "rung": sel.rung}
                tree = workspace.tree_path(self.paths.repo, self.paths.evolve_dir, self.cfg.git) if (
                    self.cfg.git.isolation == "worktree") else self.paths.repo
                plan["agent"] = dryrun.agent_json(agent_plan, replace(inv, repo=tree), self._runner())
        # What the gate would see (§8.4): setup's state, links, copies, and where the gate imports from.
        try:
            ws = workspace.open_workspace(self.paths.repo, self.paths, self.cfg.git, self.gate.git_policy, self.log)
            plan["gate_sees"] = self.prep.describe(ws)[0]
        except gitrun.GitError as exc:  # detached, unborn: nothing to land on, nothing the gate would see
            plan["gate_sees"] = {"error": str(exc)[:300]}
        # Which sandbox the agent and the gate would run in (§8.6): the agent argv above is wrapped in it.
        box = self._sandbox_decision()
        plan["sandbox"] = {"in_force": box.label, "warning": box.warning, "refused": box.refuse}
        self.log.info("fire.dry_run", **{k: v for k, v in plan.items() if k not in ("agent", "gate_sees")})
        out = FireOutcome(exitcodes.OK, "dry-run", halt=d.halt)
        out.entries.append(plan)
        return out
