"""One lifecycle for every work source: the same calls, run against the harvested queue (a real file),
beads (a fake ``bd`` on PATH, with state) and an in-memory source, so the cycle never needs to ask
where an item came from. Goals and directives implement the scout calls as no-ops."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import entry

from evolve.work.beads import BeadsSource
from evolve.work.goal_source import GoalsSource
from evolve.work.harvested import HarvestedQueue
from evolve.work.item import ClaimLost, WorkItem, WorkSource

CLAIMER = "evolve:cycle-1"
NOW = "2026-12-01T00:00:00Z"

FAKE_BD = """
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
state = os.path.join(here, "beads.json")
beads = json.load(open(state))
args = sys.argv[1:]
if args[:2] == ["ready", "--json"]:
    print(json.dumps([b for b in beads if b["status"] == "open"]))
elif args[:1] == ["close"]:
    for b in beads:
        if b["id"] == args[1]:
            b["status"] = "closed"
elif args[:1] == ["update"]:
    for b in beads:
        if b["id"] == args[1]:
            b["status"] = args[args.index("--status") + 1]
json.dump(beads, open(state, "w"))
"""


class MemorySource:
    """A WorkSource over a list: the smallest thing that keeps the whole lifecycle."""

    name = "memory"

    def __init__(self, titles: Sequence[str]) -> None:
        self.state = {f"mem:{t}": "open" for t in titles}
        self.titles = {f"mem:{t}": t for t in titles}

    def candidates(self) -> list[WorkItem]:
        return [WorkItem("memory", ref, self.titles[ref]) for ref, s in self.state.items() if s == "open"]

    def _set(self, item: WorkItem, new: str, *, when: str | None = None) -> None:
        if item.ref in self.state and (when is None or self.state[item.ref] == when):
            self.state[item.ref] = new

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        if self.state.get(item.ref) != "open":
            raise ClaimLost(item.ref)
        self.state[item.ref] = "claimed"

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        self._set(item, "done", when="claimed")

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        self._set(item, "open", when="claimed")

    def hold(self, item: WorkItem, claimer: str, now: str, note: str) -> None:
        """Nothing to mark: a claimed item is never offered here, however old the claim."""

    def defer(self, item: WorkItem, now: str, reason: str) -> None:
        self._set(item, "deferred", when="open")

    def park(self, item: WorkItem, now: str, note: str) -> bool:
        self._set(item, "parked", when="open")
        return True

    def split(self, item: WorkItem, now: str, children: Sequence[Mapping[str, Any]]) -> None:
        self._set(item, "split", when="open")


def _harvested(tmp_path: Path) -> WorkSource:
    path = tmp_path / "next-work.jsonl"
    path.write_bytes(orjson.dumps(entry("a", "b", "c")) + b"\n")
    return HarvestedQueue(path)


def _beads(tmp_path: Path) -> WorkSource:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    bd = bindir / "bd"
    bd.write_text(f"#!{sys.executable}\n{FAKE_BD}")
    bd.chmod(bd.stat().st_mode | stat.S_IXUSR)
    beads = [{"id": f"bd-{t}", "title": t, "priority": p, "issue_type": "task", "status": "open"}
             for p, t in enumerate("abc")]
    (bindir / "beads.json").write_text(orjson.dumps(beads).decode())
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return BeadsSource(["bd", "ready", "--json"], tmp_path, timeout_s=20, env=env)


# Does the source keep a claimed (and held) item out of its offer? The tracker lists a bead until it is
# closed: there the claim is this evolve's (session-state, pending.json), as DESIGN §6.2 says.
CLAIM_HIDES_IT = {"harvested": True, "beads": False, "memory": True}
# Does a split take the item out of the source? The tracker keeps a split bead open until it is closed.
SPLIT_HOLDS_IT = {"harvested": True, "beads": False, "memory": True}


@pytest.fixture(params=["harvested", "beads", "memory"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> WorkSource:
    if request.param == "harvested":
        return _harvested(tmp_path)
    if request.param == "beads":
        return _beads(tmp_path)
    return MemorySource("abc")


def titles(src: WorkSource) -> list[str]:
    return [w.title.split(": ", 1)[-1] for w in src.candidates()]  # a bead's title is "<id>: <title>"


def first(src: WorkSource) -> WorkItem:
    return src.candidates()[0]


def scouted(src: WorkSource) -> WorkItem:
    """The first item, claimed and released by a scout (what every disposition starts from)."""
    item = first(src)
    src.claim(item, CLAIMER, NOW)
    src.release(item, CLAIMER, NOW, "scout")
    return item


def test_offers_its_items_in_order(source: WorkSource) -> None:
    assert titles(source) == ["a", "b", "c"]


def test_a_released_claim_is_offered_again(source: WorkSource) -> None:
    item = first(source)
    source.claim(item, CLAIMER, NOW)
    source.release(item, CLAIMER, NOW, "failed")
    if isinstance(source, HarvestedQueue):
        # The release stamps failed_at: the item is offered again, after the fresh ones (upstream's freshness rank).
        assert titles(source) == ["b", "c", "a"]
    else:
        assert titles(source) == ["a", "b", "c"]


def test_a_finalized_item_is_done(source: WorkSource) -> None:
    item = first(source)
    source.claim(item, CLAIMER, NOW)
    source.finalize(item, CLAIMER, NOW)
    assert titles(source) == ["b", "c"]


def test_defer_keeps_it_out(source: WorkSource) -> None:
    source.defer(scouted(source), NOW, "after the release")
    assert titles(source) == ["b", "c"]


def test_park_keeps_it_out_and_says_it_could(source: WorkSource) -> None:
    assert source.park(scouted(source), NOW, "scope too big") is True
    assert titles(source) == ["b", "c"]


def test_split_is_recorded(source: WorkSource) -> None:
    source.split(scouted(source), NOW, [{"title": "a1"}, {"title": "a2"}])
    assert titles(source) == (["b", "c"] if SPLIT_HOLDS_IT[source.name] else ["a", "b", "c"])


def test_calls_on_an_item_already_done_change_nothing(source: WorkSource) -> None:
    item = first(source)
    source.claim(item, CLAIMER, NOW)
    source.finalize(item, CLAIMER, NOW)
    source.release(item, None, NOW, "crashed")
    source.finalize(item, CLAIMER, NOW)
    assert titles(source) == ["b", "c"]


def test_goals_and_directives_take_every_call_and_record_nothing(tmp_path: Path) -> None:
    src = GoalsSource(tmp_path, tmp_path / ".agents" / "evolve", goal_timeout_s=5, total_timeout_s=5, env={})
    for item in (WorkItem("goal", "goal:tests-pass", "tests pass"), WorkItem("directive", "directive:1", "d")):
        src.claim(item, CLAIMER, NOW)
        src.release(item, CLAIMER, NOW, "scout")
        src.defer(item, NOW, "later")
        src.split(item, NOW, [{"title": "child"}])
        assert src.park(item, NOW, "budget spent") is False  # the caller logs that it could not
        src.finalize(item, CLAIMER, NOW)
    assert list(tmp_path.iterdir()) == []


def test_a_held_claim_ends_with_finalize_or_release(source: WorkSource) -> None:
    """``hold`` keeps the claim (a pending cycle's work waits to land); its finalize and its release
    then settle it as they would any claim."""
    a, b, _c = source.candidates()[:3]
    source.claim(a, CLAIMER, NOW)
    source.hold(a, CLAIMER, NOW, "refs/evolve/pending/main (cycle 1)")
    source.claim(b, "evolve:cycle-2", NOW)
    source.hold(b, "evolve:cycle-2", NOW, "refs/evolve/pending/main (cycle 2)")
    assert titles(source) == (["c"] if CLAIM_HIDES_IT[source.name] else ["a", "b", "c"])
    source.finalize(a, CLAIMER, NOW)  # a's work landed
    source.release(b, "evolve:cycle-2", NOW, "pending")  # b's could not
    assert titles(source) == ["b", "c"]
