"""Issue 22 item 8: an item whose change is pending keeps a claim of its own in the queue itself, one that no
reader takes over (docs/DESIGN.md §6.1 "Held claims", §8.3).

Real fires (``python -m evolve``) on real repositories: a cycle's green commit waits under
``refs/evolve/pending/main`` because the operator's untracked ``w.txt`` is in the way, and its queue item
stays ``in_progress`` under the cycle's claimer, marked ``claim_held``. A second reader of the same v1.4
queue (another claimer, claims visible for a millisecond, a clock a day ahead) never selects or claims it;
the hold ends when the waiting work lands (finalized) or cannot (released), and a fire that died before it
wrote the hold has it written by the next fire's recovery. Every test asserts the git state too.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from invariants import GitWatch, History, index_locks
from support import Env, entry, git, improved_step, live

from evolve.work.harvested import HarvestedQueue
from evolve.work.item import ClaimLost, WorkItem

NOTE = "refs/evolve/pending/main (cycle 1)"
HOLD_FIELDS = ("claim_held", "claim_held_at")  # what a held claim adds (docs/DESIGN.md §6.1)
OPERATOR_W = b"the operator's w.txt\n"


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def queue_item(env: Env, title: str) -> dict[str, Any]:
    (it,) = [i for e in live(env.paths.nextwork) for i in e["items"] if i["title"] == title]
    return it


def another_reader(env: Env) -> HarvestedQueue:
    """A second reader of the shared queue, with evolve's own stale-claim rule: any ``in_progress`` claim
    older than a millisecond is stale to it, and its clock is a day ahead."""
    return HarvestedQueue(env.paths.nextwork, claim_visibility_s=0.001, clock=lambda: time.time() + 86400)


def pending_fire(env: Env, cli, *extra: dict[str, Any]) -> dict[str, Any]:
    """One fire whose cycle's green work waits: the agent writes ``w.txt``, which the operator has untracked."""
    (env.repo / "w.txt").write_bytes(OPERATOR_W)
    env.queue(entry("waits"), *extra)
    env.steps([improved_step(path="w.txt", content="agent\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["pending_ref"]) == ("pending", "refs/evolve/pending/main"), e
    return e


def assert_held(env: Env, title: str, claimer: str = "evolve:cycle-1", note: str = NOTE) -> None:
    it = queue_item(env, title)
    assert (it["claim_status"], it["claimed_by"], it.get("consumed")) == ("in_progress", claimer, None), it
    assert it["claim_held"] == note and isinstance(it["claim_held_at"], str), it
    other = another_reader(env)
    assert title not in [w.title for w in other.candidates()]
    with pytest.raises(ClaimLost):  # however it is asked: the held claim is not taken over
        other.claim(WorkItem(source="harvested", ref=f"source_epic=e1:item={title}", title=title), "another-tool",
                    "2030-01-01T00:00:00Z")
    assert queue_item(env, title) == it  # the refused claim wrote nothing


def test_a_pending_item_is_held_until_its_work_lands_and_then_finalized_without_the_hold(env: Env, cli) -> None:
    start = head(env.repo)
    # Another tool's plain claim, made now: the fire leaves it alone (it is younger than the visibility).
    foreign = entry("foreign", epic="e2", claim_status="in_progress", claimed_by="another-tool",
                    claimed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    e = pending_fire(env, cli, foreign)
    assert_held(env, "waits")
    # The same reader takes over a plain in_progress claim: the hold, not the age, is what keeps "waits".
    assert [w.title for w in another_reader(env).candidates()] == ["foreign"]
    # Upstream's jq readers see an ordinary in_progress claim: the line is a plain object, the fields kept.
    if shutil.which("jq"):
        out = subprocess.run(["jq", "-r", 'select(.consumed != true) | .items[] | select(.claim_status == '
                              '"in_progress") | [.title, .claimed_by, .description, .source] | @tsv',
                              str(env.paths.nextwork)], capture_output=True, text=True, check=True).stdout
        assert sorted(out.splitlines()) == ["foreign\tanother-tool\tdo foreign\tcouncil-finding",
                                            "waits\tevolve:cycle-1\tdo waits\tcouncil-finding"]
    assert head(env.repo) == start and (env.repo / "w.txt").read_bytes() == OPERATOR_W  # nothing landed yet
    # The operator moves their file away: the next fire lands the waiting commit and finalizes the item.
    (env.repo / "w.txt").unlink()
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    settle = next(x for x in env.ledger() if x.get("pending_cycle") == e["cycle"])
    assert settle["result"] == "improved" and settle["sha"] == head(env.repo) == e["sha"], settle
    it = queue_item(env, "waits")
    assert (it["consumed"], it["claim_status"], it["consumed_by"]) == (True, "consumed", "evolve:cycle-1"), it
    assert not set(HOLD_FIELDS) & set(it), it
    assert (env.repo / "w.txt").read_text() == "agent\n" and not index_locks(env.repo)
    assert git(env.repo, "rev-list", "--count", f"{start}..main").strip() == "1"  # only the cycle's commit


def test_a_pending_item_whose_work_conflicts_is_released_without_the_hold(env: Env, cli) -> None:
    e = pending_fire(env, cli)
    assert_held(env, "waits")
    # The operator commits their own w.txt: the waiting commit (which adds w.txt too) can no longer land.
    git(env.repo, "add", "w.txt")
    git(env.repo, "commit", "-q", "-m", "operator: w.txt")
    theirs = head(env.repo)
    env.queue(entry("next", epic="e2", severity="high"))  # what the fire's one cycle does (it ranks first)
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    settle = next(x for x in env.ledger() if x.get("pending_cycle") == e["cycle"])
    assert (settle["result"], settle["error_class"]) == ("failed", "land_conflict"), settle
    it = queue_item(env, "waits")
    assert (it["claim_status"], it["claimed_by"], it["consumed"]) == ("available", None, False), it
    assert not set(HOLD_FIELDS) & set(it) and "failed_at" not in it, it  # not the item's fault
    assert [x["work_ref"] for x in env.ledger()[-1:]] == ["source_epic=e2:item=next"]
    assert "waits" in [w.title for w in another_reader(env).candidates()]  # free for anyone again
    assert head(env.repo) == theirs and (env.repo / "w.txt").read_bytes() == OPERATOR_W  # theirs, untouched
    assert git(env.repo, "show", f"{settle['unlanded_ref']}:w.txt") == "agent\n"  # the agent's work is kept
    assert not index_locks(env.repo)


@pytest.mark.parametrize("point", [
    "ledger.appended:1",  # the cycle's pending entry written, no hold yet
    "queue.record:2",  # the hold in evolve's lifecycle record (the claim was the first), not in the queue
    "queue.journal:2",  # … and in the redo journal
])
def test_a_fire_that_dies_before_its_hold_is_written_has_it_written_by_the_recovery(
        env: Env, cli, point: str) -> None:
    (env.repo / "w.txt").write_bytes(OPERATOR_W)
    gitw = GitWatch(env, operator={"w.txt": OPERATOR_W})
    history = History()
    env.queue(entry("waits"))
    history.append(["waits"])
    env.steps([improved_step(path="w.txt", content="agent\n")])
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_CRASHPOINT": point})
    assert r.code == -signal.SIGKILL, (r.code, r.stderr[-2000:])
    assert not queue_item(env, "waits").get("claim_held")  # it died before the hold reached the queue
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1")  # the recovery (and an idle cycle: the held item is not work)
    assert r.code == 0, r.stderr
    assert [x["result"] for x in env.ledger()] == ["pending", "unchanged"]
    assert_held(env, "waits")
    history.observe(env, 1)
    gitw.check()
    (env.repo / "w.txt").unlink()
    del gitw.operator["w.txt"]  # the operator's own move: the way is clear
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    it = queue_item(env, "waits")
    assert it["consumed"] is True and not set(HOLD_FIELDS) & set(it), it
    history.observe(env, 2, all_landed=True)
    gitw.check()
