"""The subcommands: one static table, in ``evolve --help`` order (pip's ``commands_dict``).

Each entry names the module that implements the command and the one-line summary ``evolve --help``
shows, so listing the commands imports none of them. A command module defines

* ``add_arguments(parser, name)``: the command's description and options on its own sub-parser
  (``name`` tells a module serving several commands which one);
* ``run(args) -> int``: the command, returning the exit code.

It imports only the standard library (and ``evolve.errors`` / ``evolve.commands._common``) at
module level and anything heavy inside ``run``: the parser imports it before running it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple


class CommandInfo(NamedTuple):
    module: str
    summary: str


COMMANDS: dict[str, CommandInfo] = {
    "fire": CommandInfo("evolve.commands.fire", "one fire: lock, step 1, cycles (what cron/systemd run)"),
    "status": CommandInfo(
        "evolve.commands.status", "what the loop is doing and why (exit 0 healthy/dormant, 1 degraded, 75 halted)"
    ),
    "history": CommandInfo(
        "evolve.commands.status", "ledger entries, newest last, with sparklines (--json: JSONL; --all: idle polls too)"
    ),
    "logs": CommandInfo("evolve.commands.logs", "a cycle's run log: what the agent printed (default: the newest)"),
    "stop": CommandInfo("evolve.commands.markers", "write STOP (halt until `evolve resume`)"),
    "kill": CommandInfo("evolve.commands.markers", "write KILL"),
    "resume": CommandInfo("evolve.commands.markers", "remove STOP (and KILL with --kill)"),
    "breaker": CommandInfo(
        "evolve.commands.operator", "breaker reset: close the failure breaker once the cause is fixed"
    ),
    "requeue": CommandInfo("evolve.commands.operator", "put an item parked by its attempt budget back into selection"),
    "setaside": CommandInfo(
        "evolve.commands.setaside", "work set aside under refs/evolve/: list, show, apply (as uncommitted edits), drop"
    ),
    "init": CommandInfo(
        "evolve.commands.init", "write .agents/.gitignore and a commented config.toml, and say what next"
    ),
    "demo": CommandInfo(
        "evolve.commands.demo", "a throwaway repo, a scripted agent, and a context hand-off, narrated"
    ),
    "daemon": CommandInfo(
        "evolve.commands.daemon", "fire on schedule.cron in the foreground (APScheduler; systemd Type=notify)"
    ),
    "install": CommandInfo(
        "evolve.commands.install", "render systemd units, a crontab line or a Kubernetes CronJob for this repository"
    ),
    "setup": CommandInfo(
        "evolve.commands.setup",
        "write the harness autocompact setting (and with --hooks the SessionStart hooks) to .claude/settings.json",
    ),
    "hook": CommandInfo("evolve.commands.hook", "harness hooks (run by Claude Code, not by hand)"),
    "handoff": CommandInfo(
        "evolve.commands.handoff", "hand the agent session off by hand: continue fresh, or fork it"
    ),
    "report": CommandInfo(
        "evolve.commands.report",
        "the morning report: one self-contained HTML file (timeline, cost, context, goals, work)",
    ),
    "metrics": CommandInfo(
        "evolve.commands.metrics",
        "Prometheus metrics (text format) on stdout, or --textfile DIR for node_exporter",
    ),
    "trust": CommandInfo(
        "evolve.commands.trust",
        "trust the repository's tracked config and agent settings as they are now (shows what; --revoke)",
    ),
    "doctor": CommandInfo(
        "evolve.commands.doctor",
        "preflight: agent, CLAUDECODE, tracker, what the gate sees, git, state dir, config, autocompact, schedule",
    ),
}


def load(name: str) -> ModuleType:
    """The module of command ``name`` (a key of ``COMMANDS``), imported on first use."""
    return importlib.import_module(COMMANDS[name].module)
