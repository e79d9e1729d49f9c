"""The shell of Step 1 (docs/DESIGN.md §4.1): read the markers, ask :func:`halt.evaluate`, apply it.

The decision is pure; this module fills its lazy needs (the dormant probe, the governor) and then
does what it said: clear DORMANT and HANDOFF, consume an ACK-REGRESSION. ``apply=False`` (the dry
run) evaluates the same way and changes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from evolve.childenv import BASE, FIRE, child_env
from evolve.cycle import halt
from evolve.cycle.context import FireContext
from evolve.procgroup import Limits, run_group
from evolve.store.markers import Marker, read_marker, remove_marker
from evolve.timeutil import parse_iso

LEDGER_TAIL = 20  # entries the halt rules look at (the regression and restorative rules)


def _operator_markers(ctx: FireContext, now: float) -> dict[str, Any]:
    """The snapshot's fields for the operator's halts (KILL, STOP), read the same way everywhere."""
    p = ctx.paths
    ttl_s = ctx.cfg.halt.kill_ttl_days * 86400
    return {
        "now": now,
        "kill_ttl_s": ttl_s,
        "global_kill": halt.first_kill([read_marker(k, now) for k in p.global_kills], ttl_s),
        "local_kill": read_marker(p.kill, now),
        "stop": read_marker(p.stop, now),
    }


def snapshot(ctx: FireContext, now: float) -> halt.HaltSnapshot:
    p, st = ctx.paths, ctx.state
    until = parse_iso(st.breaker_open_until) if st.breaker_open_until else None
    return halt.HaltSnapshot(
        **_operator_markers(ctx, now),
        dormant=read_marker(p.dormant, now),
        handoff=read_marker(p.handoff, now),
        ack_regression=read_marker(p.ack_regression, now),
        governor_configured=bool(ctx.cfg.halt.governor_cmd),
        breaker_open_until=until,
        ledger_tail=ctx.ledger.tail(LEDGER_TAIL).entries,
        ack_regression_cycle=st.ack_regression_cycle,
    )


def operator_halt(ctx: FireContext, now: float) -> halt.Step1:
    """KILL and STOP alone (rules 1 and 2), as a running fire re-checks them (docs/DESIGN.md §4.4).

    Three ``stat`` calls and three small reads: cheap enough to ask every second while an agent runs.
    The other markers are Step 1's business only and count as absent here.
    """
    p = ctx.paths
    return halt.marker_halt(
        halt.HaltSnapshot(
            **_operator_markers(ctx, now),
            dormant=Marker(p.dormant, False),
            handoff=Marker(p.handoff, False),
            ack_regression=Marker(p.ack_regression, False),
        )
    )


def run(ctx: FireContext, now: float, *, apply: bool = True) -> halt.Step1:
    snap = snapshot(ctx, now)
    while True:
        d = halt.evaluate(snap)
        if d.need == halt.NEED_DORMANT_PROBE:
            snap = replace(snap, dormant_probe=ctx.selector.probe_any_work(ctx.state))
        elif d.need == halt.NEED_GOVERNOR:
            snap = replace(snap, governor_exit=governor(ctx))
        else:
            break
    for w in d.warnings:
        ctx.log.warning("halt.warning", detail=w)
    if apply:
        _apply(ctx, d, snap)
    return d


def _apply(ctx: FireContext, d: halt.Step1, snap: halt.HaltSnapshot) -> None:
    p, log = ctx.paths, ctx.log
    if d.clear_dormant and remove_marker(p.dormant):
        log.info("dormant.cleared", reason="selectable work exists")
    if d.clear_handoff and remove_marker(p.handoff):
        log.info("handoff.cleared", content=snap.handoff.content)
    if d.consume_ack:
        remove_marker(p.ack_regression)
        if d.acked_cycle:
            ctx.state.ack_regression_cycle = d.acked_cycle
        log.info("regression.acknowledged", cycle=d.acked_cycle or None)
    if d.restorative:
        log.info("restorative", reason="last cycle was red")
    if d.breaker_probe:
        log.info("breaker.half_open")


def governor(ctx: FireContext) -> int:
    """The governor's exit code (-1: it could not run or timed out).

    Like every child of a fire: its own group (killed whole on timeout), the fire's id, and an
    allow-listed env (childenv: base names plus ``[halt] pass_env``), never evolve's secrets.
    """
    argv = ctx.cfg.halt.governor_cmd
    timeout_s = ctx.cfg.halt.timeout_s
    try:
        proc = run_group(
            argv,
            cwd=ctx.paths.repo,
            env=child_env(ctx.env, (*BASE, *FIRE), ctx.cfg.halt.pass_env),
            limits=Limits(timeout_s=timeout_s, grace_s=1.0, tail_bytes=0),
        )
    except OSError as exc:
        # Shell syntax is refused when the config loads; this is a program that cannot start.
        ctx.log.error(
            "governor.error",
            error=f"{argv[0]}: cannot start: {exc.strerror or exc}"[:300],
            hint="governor_cmd is a program and its arguments, run without a shell: "
            'e.g. EVOLVE_GOVERNOR_CMD=\'["bash", "-c", "..."]\'',
        )
        return -1
    if proc.timed_out or proc.returncode is None:
        ctx.log.warning("governor.error", error=f"{argv[0]} timed out after {timeout_s:g}s; process group killed")
        return -1
    return proc.returncode
