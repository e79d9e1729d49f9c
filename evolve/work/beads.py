"""Ready beads from the issue tracker (``bd ready --json``, or ``br`` when ``bd`` is absent).

A tracker that is not installed is an empty source; one that fails, hangs or prints garbage is a
probe error, never "no work" (a failed probe must not walk the loop into DORMANT).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from evolve.procgroup import CaptureError, run_capture
from evolve.store.jsonl import gc_paused
from evolve.work.item import LazyItems, SourceError, WorkItem, fast_clean

DROPPED_LABELS = frozenset({"operator-shape", "meta-runtime", "human-coordinate"})
RED_LABELS = frozenset({"gate-fix", "ci-red", "regression"})
_PRIORITY_SEVERITY = {0: "high", 1: "high", 2: "medium", 3: "low", 4: "low"}


def resolve_command(argv: Sequence[str], which=shutil.which) -> list[str] | None:
    """The tracker command to run, ``br`` standing in for an absent ``bd``; None when neither exists."""
    argv = list(argv)
    if not argv:
        return None
    if which(argv[0]):
        return argv
    if argv[0] == "bd" and which("br"):
        return ["br", *argv[1:]]
    return None


def parse_ready(raw: bytes) -> list[dict[str, Any]]:
    """A bare array, or ``{"issues"|"items"|"data": [...]}``; anything else is a SourceError.

    Empty output (whitespace only) from a tracker that exited 0 is zero beads: ``bd ready --json``
    prints nothing when nothing is ready, and a probe error there would keep the loop from resting.
    """
    if not raw.strip():
        return []
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SourceError(f"tracker printed invalid JSON: {exc}") from exc
    if isinstance(obj, dict):
        for key in ("issues", "items", "data"):
            if isinstance(obj.get(key), list):
                obj = obj[key]
                break
        else:
            raise SourceError("tracker JSON has no issues/items/data list")
    if not isinstance(obj, list):
        raise SourceError("tracker JSON is not a list")
    return [b for b in obj if isinstance(b, dict) and isinstance(b.get("id"), str | int) and str(b["id"]).strip()]


def _has_label(bead: Mapping[str, Any], wanted: frozenset[str]) -> bool:
    """Whether any of the bead's labels (a list; compared case-insensitively) is in ``wanted``."""
    labels = bead.get("labels")
    if isinstance(labels, list):
        for x in labels:
            if str(x).lower() in wanted:
                return True
    return False


def _priority(bead: Mapping[str, Any]) -> int:
    p = bead.get("priority")
    return p if isinstance(p, int) and not isinstance(p, bool) else 99


def rank(beads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop operator-only shapes; order by priority (0 = critical), equal priorities in the tracker's
    own order (the sort is stable): ``bd ready`` already ranks its answer, as upstream takes it."""
    kept = [b for b in beads if not _has_label(b, DROPPED_LABELS)]
    return sorted(kept, key=_priority)


def to_item(bead: Mapping[str, Any]) -> WorkItem:
    """The bead as a WorkItem; ``data`` is the bead itself (a parsed dict is not copied)."""
    bead_id = str(bead["id"])
    kind = str(bead.get("issue_type") or bead.get("type") or "task")
    if kind != "bug" and _has_label(bead, RED_LABELS):
        kind = "gate-fix"
    description = bead.get("description")
    created_at = bead.get("created_at")
    return WorkItem(
        source="beads",
        ref=f"bead:{bead_id}",
        title=fast_clean(f"{bead_id}: {bead.get('title', '')}"),
        description=(description if type(description) is str else str(description or ""))[:4000],
        type=kind,
        severity=_PRIORITY_SEVERITY.get(_priority(bead), "low"),
        created_at=created_at if isinstance(created_at, str) else None,
        data=bead if type(bead) is dict else dict(bead),
    )


class BeadsSource:
    """Implements :class:`evolve.work.item.WorkSource` over the tracker CLI."""

    name = "beads"

    def __init__(self, argv: Sequence[str], repo: Path, *, timeout_s: float, env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.repo = repo
        self.timeout_s = timeout_s
        self.env = dict(env)
        self._last_raw: bytes | None = None  # the tracker's last output, and its items
        self._last_items: Sequence[WorkItem] = ()

    def _run(self, argv: list[str]) -> bytes:
        try:
            return run_capture(argv, cwd=self.repo, env=self.env, timeout_s=self.timeout_s)
        except CaptureError as exc:  # a tracker that fails or hangs is a probe error, never "no work"
            raise SourceError(str(exc)) from exc

    def candidates(self) -> Sequence[WorkItem]:
        argv = resolve_command(self.argv, which=lambda c: shutil.which(c, path=self.env.get("PATH")))
        if argv is None:
            return []
        raw = self._run(argv)  # asked every time: the tracker is the source of truth
        if raw != self._last_raw:  # the items are a function of the output alone
            with gc_paused():  # parsed JSON is acyclic
                ranked = rank(parse_ready(raw))
                self._last_items = LazyItems(len(ranked), lambda i: to_item(ranked[i]))
            self._last_raw = raw
        return self._last_items

    def _tool(self) -> list[str] | None:
        argv = resolve_command(self.argv, which=lambda c: shutil.which(c, path=self.env.get("PATH")))
        return argv[:1] if argv else None

    def _update(self, *args: str) -> None:
        tool = self._tool()
        if tool is None:
            return
        self._run([*tool, *args])

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        """The claim lives in session-state; the tracker keeps listing the bead until it is closed."""

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        self._update("close", bead_id(item))

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        """Nothing to undo in the tracker."""

    def hold(self, item: WorkItem, claimer: str, now: str, note: str) -> None:
        """Nothing the tracker's readers would honour (docs/DESIGN.md §6.2): ``bd ready`` lists
        ``in_progress`` and assigned beads as ready too, ``--notes`` replaces the operator's own notes,
        and ``blocked``/``deferred`` would say something untrue (and are evolve's park and defer). The
        bead's claim is this evolve's ``pending.json``, which keeps it out of its own selection."""

    def park(self, item: WorkItem, now: str, note: str) -> bool:
        self._update("update", bead_id(item), "--status", "blocked", "--notes", note)
        return True

    def unpark(self, ref: str) -> None:
        """``evolve requeue``: a bead the attempt budget blocked is opened again."""
        note = "evolve: requeued by the operator"
        self._update("update", ref.removeprefix("bead:"), "--status", "open", "--notes", note)

    def defer(self, item: WorkItem, now: str, reason: str) -> None:
        self._update("update", bead_id(item), "--status", "deferred", "--notes", f"defer: {reason}")

    def split(self, item: WorkItem, now: str, children: Sequence[Mapping[str, Any]]) -> None:
        """The children go to the harvested queue; the bead stays open in the tracker until closed."""


def bead_id(item: WorkItem) -> str:
    return item.ref.removeprefix("bead:")
