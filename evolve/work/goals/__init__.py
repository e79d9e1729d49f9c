"""Goals: the operator's GOALS file, measuring its checks, and the snapshots and work items built from them.

Each goal's ``check`` is a shell command from the operator's own file; it runs as ``["bash", "-c", check]``
in its own process group with a sanitized environment (see :mod:`.check` and :mod:`.measure`).
"""

from evolve.work.goals.check import CAPTURE_HEAD, CAPTURE_TAIL, KILL_GRACE_S, STDOUT_TAIL
from evolve.work.goals.items import directive_item, failing_goals, goal_item, severity_for
from evolve.work.goals.measure import SAFE_ENV_KEYS, SKIP_EXIT, measure, sanitized_env
from evolve.work.goals.model import GOAL_TYPES, GOALS_FILES, Directive, Goal, GoalsError, GoalsFile, MeasureError
from evolve.work.goals.output import OUTPUT_HEAD, OUTPUT_LIMIT, OUTPUT_TAIL, cap_output, strip_control
from evolve.work.goals.parse import load_goals
from evolve.work.goals.snapshot import capture_baseline, read_snapshot, snapshot_path, write_snapshot

__all__ = [
    "CAPTURE_HEAD",
    "CAPTURE_TAIL",
    "GOALS_FILES",
    "GOAL_TYPES",
    "KILL_GRACE_S",
    "OUTPUT_HEAD",
    "OUTPUT_LIMIT",
    "OUTPUT_TAIL",
    "SAFE_ENV_KEYS",
    "SKIP_EXIT",
    "STDOUT_TAIL",
    "Directive",
    "Goal",
    "GoalsError",
    "GoalsFile",
    "MeasureError",
    "cap_output",
    "capture_baseline",
    "directive_item",
    "failing_goals",
    "goal_item",
    "load_goals",
    "measure",
    "read_snapshot",
    "sanitized_env",
    "severity_for",
    "snapshot_path",
    "strip_control",
    "write_snapshot",
]
