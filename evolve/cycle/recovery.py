"""The shell of recovery (docs/DESIGN.md §4.0): what a fire does under the lock before Step 1.

Temp files a killed writer left are swept, and a dead fire recorded in session-state is settled
as :func:`evolve.cycle.reconcile.decide` says: its orphaned process groups killed (the recorded
agent PGID only once a member is seen carrying the dead fire's ``EVOLVE_FIRE_ID``, and every other
group such a member is in), a ``crashed`` entry for the cycle it died in, and its claim finalized or
released.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from evolve.cycle import pending, publish, reconcile
from evolve.cycle.context import FireContext
from evolve.cycle.entry import base_entry
from evolve.cycle.transition import ClaimAction
from evolve.git import landing
from evolve.git import refs as gitrefs
from evolve.git.run import GitError
from evolve.procgroup import FIRE_TAG, group_alive, kill_group, tagged_groups
from evolve.results import CycleResult
from evolve.store.atomic import read_json, sweep_temps
from evolve.store.records import ClaimedWork, FireRecord
from evolve.timeutil import utc_iso
from evolve.work.item import SourceError, WorkItem, hold_note

TEMP_AGE_S = 60.0  # an atomic replacement takes milliseconds; a temp file this old lost its writer
ORPHAN_GRACE_S = 2.0


def sweep(ctx: FireContext) -> None:
    """Temp files left by a fire killed between writing one and renaming it into place."""
    q = ctx.paths.nextwork
    removed = sweep_temps(ctx.paths.evolve_dir, older_than_s=TEMP_AGE_S)
    removed += sweep_temps(q.parent, older_than_s=TEMP_AGE_S, only=q.name)
    removed += sweep_temps(q.parent, older_than_s=TEMP_AGE_S, only=f".{q.name}.redo")  # the queue's redo journal
    if removed:
        ctx.log.warning("store.temps_removed", count=len(removed), names=removed[:20])


def recover(ctx: FireContext) -> None:
    """Settle a fire that died (we hold the lock, so whoever recorded ``state.fire`` is gone)."""
    settle_landing(ctx)
    st = ctx.state
    d = reconcile.decide(st.fire, st.claimed_work, ctx.ledger.last_cycle(), ctx.ledger.last())
    if not d.dead_fire and d.claim is None:
        return
    _kill_orphans(ctx, d)
    if d.crashed_cycle is not None:
        _log_crashed(ctx, d.crashed_cycle, st.fire or FireRecord(), st.claimed_work)
    if st.claimed_work is not None and d.claim:
        _settle_claim(ctx, st.claimed_work, d.claim)
        st.claimed_work = None
    st.fire = None
    ctx.save()


def _kill_orphans(ctx: FireContext, d: reconcile.Reconcile) -> None:
    """Kill the dead fire's process groups: only those a member of which carries its ``EVOLVE_FIRE_ID``.

    The recorded ``agent_pgid`` alone proves nothing: after a reboot, or once the pid was reused, the
    same number names somebody else's group. A member started with ``EVOLVE_FIRE_ID=<the dead fire's
    id>`` (12 random hex digits, set at exec) is what makes a group the dead fire's; a start time later
    than the dead fire's ``started_at`` would not (every process after a reboot has one). A group that
    cannot be verified (a record without a fire id, no ``/proc``) is never killed.
    """
    dead_id = ctx.state.fire.fire_id if ctx.state.fire is not None else ""
    ours = d.dead_fire and bool(dead_id) and dead_id != ctx.fire_id
    tagged = tagged_groups(FIRE_TAG, dead_id) if ours else set()
    if d.kill_pgid and group_alive(d.kill_pgid):
        if d.kill_pgid in tagged:
            ctx.log.warning("reconcile.kill_orphan", pgid=d.kill_pgid, found_by="recorded pgid")
            kill_group(d.kill_pgid, grace_s=ORPHAN_GRACE_S)
        else:
            ctx.log.warning("reconcile.pgid_reused", pgid=d.kill_pgid, dead_fire_id=dead_id or None,
                            detail=f"no member carries the dead fire's {FIRE_TAG}: left alone")
    for pgid in sorted(tagged - {d.kill_pgid}):
        if group_alive(pgid):
            ctx.log.warning("reconcile.kill_orphan", pgid=pgid, found_by=FIRE_TAG)
            kill_group(pgid, grace_s=ORPHAN_GRACE_S)


def settle_landing(ctx: FireContext) -> None:
    """A landing intent a dead fire left (docs/DESIGN.md §8.3), resolved against the branch before anything else.

    A fast-forward cut short is finished in the operator's checkout (or, when they edited those paths
    since, left alone and said). Then: the chain's tip on the branch means it landed, so a cycle the
    ledger has not recorded yet is recorded ``improved`` with the landed sha (its claim is then finalized
    by the usual rule, never redone) and waiting cycles it carried are marked landed for the workspace to
    settle; held (``pending``) means the cycle's ``pending`` entry, the chain record and its ref are made
    whole; anything else landed nothing, and the dead cycle is ``crashed`` as before.
    """
    path = ctx.paths.landing_intent
    try:
        intent = pending.read_intent(path)
    except OSError as exc:
        ctx.log.error("land.intent_unreadable", path=str(path), error=str(exc)[:200])
        return
    if intent is None:
        path.unlink(missing_ok=True)
        return
    repo = ctx.paths.repo
    try:
        if intent.phase == "fast_forward" and intent.checkout and intent.old:
            why = landing.finish(Path(intent.checkout), intent.branch, intent.old, intent.new)
            if why:
                ctx.log.error("land.finish_refused", checkout=intent.checkout, why=why)
            else:
                ctx.log.warning("land.finished_after_crash", sha=intent.new, branch=intent.branch)
        tip = gitrefs.rev(repo, intent.branch)
        landed = tip is not None and gitrefs.is_ancestor(repo, intent.new, tip)
        chains = pending.load(ctx.paths.pending)
        if landed:
            _recovered_landed(ctx, intent, chains)
        elif intent.phase == "hold" and intent.kind == "cycle":
            _recovered_held(ctx, intent, chains)
    except (GitError, OSError) as exc:
        ctx.log.error("land.intent_unresolved", error=str(exc)[:300])
        return  # kept: the next fire tries again
    path.unlink(missing_ok=True)


def _recovered_landed(ctx: FireContext, intent: pending.Intent, chains: dict[str, pending.Chain]) -> None:
    earlier = intent.held[:-1] if intent.kind == "cycle" else intent.held
    if earlier:
        chain = chains.get(intent.branch) or intent.chain()
        chains[intent.branch] = replace(chain, held=earlier, fate="landed")
        pending.save(ctx.paths.pending, chains)
    if intent.kind == "cycle" and intent.held:
        cur = intent.held[-1]
        if ctx.ledger.last_cycle() < cur.cycle:
            _log_recovered(ctx, cur, CycleResult.IMPROVED, {"sha": cur.sha, "landed": True})
        ctx.log.warning("reconcile.landed", cycle=cur.cycle, sha=cur.sha, branch=intent.branch)
    if ctx.cfg.git.push:  # published like any landing: the fire's retry pushes it (§8.3)
        publish.mark_unpushed(ctx.paths.push_state, intent.branch, intent.new, ctx.cfg.land.remote)


def _recovered_held(ctx: FireContext, intent: pending.Intent, chains: dict[str, pending.Chain]) -> None:
    cur = intent.held[-1] if intent.held else None
    if cur is None:
        return
    chain = chains.get(intent.branch)
    if chain is None or all(h.cycle != cur.cycle for h in chain.held):
        chains[intent.branch] = replace(intent.chain(), reason="held (recorded after a crash)")
        pending.save(ctx.paths.pending, chains)
    ref = gitrefs.PENDING_REF + intent.branch.removeprefix("refs/heads/")
    now = gitrefs.rev(ctx.paths.repo, ref)
    if now != intent.new:
        gitrefs.update_ref(ctx.paths.repo, ref, intent.new, now)
    if ctx.ledger.last_cycle() < cur.cycle:
        fields = {"sha": cur.sha, "landed": False, "pending_ref": ref}
        _log_recovered(ctx, cur, CycleResult.PENDING, fields)
    ctx.log.warning("reconcile.pending", cycle=cur.cycle, sha=cur.sha, ref=ref)


def _log_recovered(ctx: FireContext, cur: pending.Held, result: CycleResult, fields: dict[str, object]) -> None:
    fire = ctx.state.fire or FireRecord()
    entry = base_entry(
        cycle=cur.cycle, result=result, timestamp=utc_iso(ctx.clock()), title=cur.title or "idle",
        source=cur.source or "idle", work_ref=cur.work_ref or None, mode=f"{cur.source}:recovered",
        session_id=ctx.session_id(), fire_id=fire.fire_id,
    )
    entry.update(cycle_start_sha=cur.start or None, recovered="landing", **fields)
    ctx.ledger.append(entry)
    ctx.state.last_logged_cycle = cur.cycle
    ctx.state.last_result = str(result)


def _log_crashed(ctx: FireContext, cycle: int, fire: FireRecord, claimed: ClaimedWork | None) -> None:
    entry = base_entry(
        cycle=cycle,
        result=CycleResult.CRASHED,
        timestamp=utc_iso(ctx.clock()),
        title=(claimed.title if claimed else "") or "idle",
        source=(claimed.source if claimed else "") or "idle",
        work_ref=claimed.ref or None if claimed else None,
        mode="crashed",
        session_id=ctx.session_id(),
        fire_id=fire.fire_id,
    )
    entry.update(error_class="crashed", crashed_fire_pid=fire.pid)
    # Where the dead cycle started (cycle-state.json says, if it got that far): its set-aside work is
    # measured from there, never from a fork point below a commit the operator dropped since.
    cs = read_json(ctx.paths.cycle_state)
    if isinstance(cs, dict) and cs.get("cycle") == cycle and isinstance(cs.get("cycle_start_sha"), str):
        entry["cycle_start_sha"] = cs["cycle_start_sha"]
    ctx.ledger.append(entry)
    ctx.state.last_logged_cycle = cycle
    ctx.state.last_result = str(CycleResult.CRASHED)
    ctx.log.warning("reconcile.crashed", cycle=cycle, dead_pid=fire.pid)


def _settle_claim(ctx: FireContext, claimed: ClaimedWork, action: ClaimAction) -> None:
    src = ctx.source(claimed.source)
    # KEEP: the dead cycle's entry is ``pending``: its work waits in pending.json, which holds the claim
    # until the work lands or cannot (§8.3); released here, the item would be free while its work waits.
    # It is held in the source, as the live path does, in case the dead fire did not get to (§6.1).
    if src is not None and claimed.ref:
        item = WorkItem(source=claimed.source, ref=claimed.ref, title=claimed.title)
        stamp = utc_iso(ctx.clock())
        try:
            if action is ClaimAction.KEEP:
                last = ctx.ledger.last() or {}
                src.hold(item, claimed.claimed_by, stamp, hold_note(str(last.get("pending_ref") or ""), claimed.cycle))
            elif action is ClaimAction.FINALIZE:
                src.finalize(item, claimed.claimed_by, stamp)
            else:
                src.release(item, claimed.claimed_by or None, stamp, CycleResult.CRASHED)
        except (SourceError, OSError) as exc:
            ctx.log.warning("reconcile.claim_error", error=str(exc))
    ctx.log.info("reconcile.claim", action=action, ref=claimed.ref)


def reap(ctx: FireContext) -> None:
    """Kill every process group still carrying this fire's ``EVOLVE_FIRE_ID``, however the fire ends.

    Each child's own group is killed when it ends, but what it moved into a session of its own
    (``setsid``, a daemonizing dev server) is in no group we recorded and would keep running and
    writing to the repository. Our own process and group are never among them
    (:func:`~evolve.procgroup.tagged_groups` skips both).
    """
    try:
        pgids = sorted(tagged_groups(FIRE_TAG, ctx.fire_id))
        if not pgids:
            return
        ctx.log.warning("fire.reaped", pgids=pgids)
        for pgid in pgids:
            try:
                kill_group(pgid, grace_s=ORPHAN_GRACE_S)
            except OSError as exc:  # not ours to signal after all: say so, go on with the rest
                ctx.log.warning("fire.reap_failed", pgid=pgid, error=str(exc)[:200])
    except Exception as exc:  # never let the clean-up hide the fire's own outcome or exception
        ctx.log.exception("fire.reap_failed", error=str(exc)[:200])
