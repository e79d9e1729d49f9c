"""What ``evolve fire --dry-run`` shows (docs/DESIGN.md §4.5): Step 1, the ladder and the exact agent call.

Pure assembly of what the fire evaluated without applying anything; the fire gathers the parts.
The runner's preflight is here too: the dry run shows it, and a real fire refuses to start on it.
"""

from __future__ import annotations

from typing import Any

from evolve.agent.command import prompt_text
from evolve.agent.invocation import Invocation
from evolve.agent.runners import Runner, preflight
from evolve.cycle import halt
from evolve.harness.plan import AgentPlan
from evolve.work import ladder


def step1_json(d: halt.Step1) -> dict[str, Any]:
    return {
        "halt": d.halt,
        "detail": d.detail,
        "would_clear_dormant": d.clear_dormant,
        "would_clear_handoff": d.clear_handoff,
        "restorative": d.restorative,
        "breaker_probe": d.breaker_probe,
        "warnings": list(d.warnings),
    }


def selection_json(cycle: int, sel: ladder.Selection, generated: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rung's candidates and why the top one won (the selection itself is added by the caller)."""
    out: dict[str, Any] = {
        "cycle": cycle,
        "probe_errors": list(sel.probe_errors),
        "candidates": [{"rung": c.rung, "ref": c.ref, "title": c.title, "verdict": c.verdict} for c in sel.considered],
        "why": sel.reason,
    }
    if sel.blocked_mode:
        out["metronome_blocked"] = sel.blocked_mode
    if generated:
        out["would_queue"] = generated
    return out


def agent_json(plan: AgentPlan, inv: Invocation, runner: Runner) -> dict[str, Any]:
    """The exact call: argv, the env changes, the prompt, and what the runner's preflight says of its config."""
    d = plan.decision
    argv, env_changes = runner.plan(inv)
    return {
        "runner": runner.name,
        "mode": d.mode,
        "reason": d.reason,
        "argv": argv,
        "env": env_changes,
        # The brief; for a command agent exactly what its prompt file holds (with the report contract).
        "prompt": prompt_text(inv) if runner.name == "command" else inv.prompt,
        "preflight": preflight(runner) or "ok",
        **_settings(runner, inv),
    }


def _settings(runner: Runner, inv: Invocation) -> dict[str, Any]:
    """Which settings sources of its CLI the agent gets (docs/DESIGN.md §8.5), for the CLI runners."""
    ask = getattr(runner, "settings_for", None)
    return {"settings": ask(inv.repo).describe()} if callable(ask) else {}

