"""Files the upstream ``/evolve`` tooling (agentops) wrote give the same picks, halts and goals (issue 17).

Every fixture is built from upstream's own formats: the queue from the canonical example of
``docs/contracts/next-work.schema.md`` (schema v1.4), GOALS.md from its v4 layout (a ``## Gates``
table of ``ID | Check | Weight | Description``), ledger rows as its writers leave them (no ``cycle``,
``result: "FAIL: ..."``) and session-state with its ``cycle`` key. docs/COMPATIBILITY.md is the table.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry, git, improved_step, jsonl

from evolve.cycle import halt
from evolve.paths import Paths
from evolve.store.markers import Marker
from evolve.store.session_state import SessionState
from evolve.work import harvested as hq
from evolve.work.beads import BeadsSource
from evolve.work.goal_source import GoalsSource
from evolve.work.goals import load_goals, measure

# The canonical example line of upstream's next-work.schema.md (v1.4), as a template.
CANONICAL: dict[str, Any] = {
    "source_epic": "na-fr0",
    "timestamp": "2026-03-08T17:30:00Z",
    "items": [{
        "title": "Publish next-work schema v1.4 and add contract parity checks",
        "type": "tech-debt", "severity": "high", "source": "council-finding",
        "description": "Collapse next-work queue docs to one tracked v1.4 contract and validate drift.",
        "evidence": "March 8 audit found the local schema file at v1.2.",
        "target_repo": "agentops",
        "proof_ref": {"kind": "execution_packet", "run_id": "run-2026-03-08",
                      "path": ".agents/rpi/runs/run-2026-03-08/execution-packet.json"},
        "consumed": False, "claim_status": "available",
    }],
    "consumed": False, "claim_status": "available", "claimed_by": None, "claimed_at": None,
    "consumed_by": None, "consumed_at": None,
}

DONE = {"consumed": True, "claim_status": "consumed", "consumed_by": "evolve-quality:cycle-3",
        "consumed_at": "2026-03-09T01:00:00Z"}


def upstream_entry(epic: str, *items: dict[str, Any], **entry_fields: Any) -> dict[str, Any]:
    """The canonical entry with its item replaced by ``items`` (each: fields over the canonical item)."""
    out = copy.deepcopy(CANONICAL)
    base = out["items"][0]
    out["items"] = [{**base, "target_repo": "repo", **it} for it in items]
    out.update(source_epic=epic, **entry_fields)
    return out


def bare(title: str, **fields: Any) -> dict[str, Any]:
    """An item as older producers wrote it: no lifecycle fields at all."""
    return {"title": title, "type": "task", "severity": "medium", "source": "council-finding",
            "description": f"do {title}", **fields}


def picks(tmp_path: Path, *entries: dict[str, Any]) -> list[str]:
    path = tmp_path / "next-work.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    got = hq.HarvestedQueue(path, repo_names=("repo",)).candidates()
    return [got[i].title for i in range(len(got))]


# -- 1. item lifecycle is authoritative --------------------------------------------------------------

LIFECYCLE = {
    # entry aggregate says consumed, yet an item says available (what upstream lanes leave behind)
    "stale consumed aggregate": (
        upstream_entry("e1", {"title": "landed", **DONE}, {"title": "still open", "consumed": False,
                                                          "claim_status": "available"},
                       consumed=True, claim_status="consumed"),
        ["still open"]),
    "aggregate consumed, an item with only claim_status": (
        upstream_entry("e1", {"title": "open", "claim_status": "available"}, consumed=True), ["open"]),
    "aggregate claim_status consumed over bare items": (
        {**upstream_entry("e1"), "items": [bare("a"), bare("b")], "consumed": False, "claim_status": "consumed"}, []),
    "aggregate consumed over bare items": ({**upstream_entry("e1"), "items": [bare("a")], "consumed": True}, []),
    "legacy flat row claim_status consumed": ({**bare("flat"), "claim_status": "consumed"}, []),
    "every item consumed": (upstream_entry("e1", {"title": "x", **DONE}, consumed=True), []),
}


@pytest.mark.parametrize("case", sorted(LIFECYCLE))
def test_item_lifecycle_is_authoritative(tmp_path: Path, case: str) -> None:
    line, want = LIFECYCLE[case]
    assert picks(tmp_path, line) == want
    items = hq.entry_items(line)
    assert [it["title"] for it in items if hq.item_selectable(line, it)] == want


def test_a_fire_works_the_open_item_of_a_consumed_entry(env: Env, cli) -> None:
    """Before: "no work at all" (an idle entry). Now the item is claimed, worked and finalized."""
    line = upstream_entry("e1", {"title": "landed", **DONE}, {"title": "open work", "consumed": False,
                                                             "claim_status": "available"},
                          consumed=True, claim_status="consumed")
    env.queue(line)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    (e,) = env.ledger()
    assert (e["result"], e["work_ref"]) == ("improved", "source_epic=e1:item=open work")
    assert git(env.repo, "cat-file", "-t", e["sha"]).strip() == "commit"
    assert not (env.repo / ".git" / "index.lock").exists()
    (after,) = jsonl(env.paths.nextwork)
    assert [it.get("consumed") for it in after["items"]] == [True, True]
    assert after["consumed"] is True  # every item is now consumed: the aggregate is true again


# -- 2. freshness before retries ---------------------------------------------------------------------

def test_a_failed_item_ranks_after_fresh_items_of_its_bucket(tmp_path: Path) -> None:
    retried = {"title": "retried", "severity": "high", "failed_at": "2026-03-09T00:00:00Z"}
    fresh = {"title": "fresh", "severity": "low", "type": "docs"}
    unscoped_fresh = {"title": "unscoped", "severity": "high", "target_repo": None}
    # Same bucket (this repo): the fresh item first, whatever its type and severity.
    assert picks(tmp_path, upstream_entry("e1", retried, fresh)) == ["fresh", "retried"]
    # The repo bucket still comes first: a failed item for this repo before a fresh unscoped one.
    assert picks(tmp_path, upstream_entry("e1", retried, unscoped_fresh)) == ["retried", "unscoped"]
    # An empty failed_at is no failure; --quality keeps the severity band first, then freshness.
    assert picks(tmp_path, upstream_entry("e1", {**retried, "failed_at": None}, fresh)) == ["retried", "fresh"]
    keys = {n: hq.rank_key(it, i, 0, True) for i, (n, it) in enumerate([("r", retried), ("f", fresh)])}
    assert keys["r"] < keys["f"]  # high band before low band
    assert hq.rank_key({**fresh, "severity": "high"}, 9, 0, True) < keys["r"]


@pytest.mark.parametrize(("reason", "stamped"), [
    ("failed", True), ("crashed", True), ("regressed", True), ("scout", False), ("harvested", False),
    ("interrupted", False), ("improved", False),  # an improved cycle released only when it was context-heavy
])
def test_only_a_cycle_that_failed_on_the_item_stamps_failed_at(tmp_path: Path, reason: str, stamped: bool) -> None:
    path = tmp_path / "next-work.jsonl"
    path.write_bytes(orjson.dumps(upstream_entry("e1", {"title": "a"}, {"title": "b"})) + b"\n")
    q = hq.HarvestedQueue(path, repo_names=("repo",))
    item = q.candidates()[0]
    q.claim(item, "evolve:cycle-1", "2026-03-09T00:00:00Z")
    q.release(item, "evolve:cycle-1", "2026-03-09T00:01:00Z", reason)
    (line,) = jsonl(path)
    assert ("failed_at" in line["items"][0]) is stamped and line["items"][0]["claim_status"] == "available"
    assert picks(tmp_path, line) == (["b", "a"] if stamped else ["a", "b"])


def test_a_released_item_does_not_starve_fresh_work(env: Env, cli) -> None:
    env.queue(upstream_entry("e1", {"title": "flaky", "severity": "high"}, {"title": "steady", "severity": "low"}))
    env.steps([{"report": {"result": "failed", "error_class": "transient", "error": "boom"}}, improved_step()])
    cli("fire", "--cycles", "1")
    cli("fire", "--cycles", "1")
    first, second = env.ledger()
    assert (first["work_ref"], first["result"]) == ("source_epic=e1:item=flaky", "failed")
    assert (second["work_ref"], second["result"]) == ("source_epic=e1:item=steady", "improved")
    assert git(env.repo, "cat-file", "-t", second["sha"]).strip() == "commit"
    assert not (env.repo / ".git" / "index.lock").exists()


# -- 3. goal regression without cycle numbers ---------------------------------------------------------

ABSENT = {n: Marker(Path(f"/nonexistent/{n}"), False) for n in
          ("global_kill", "local_kill", "stop", "dormant", "handoff", "ack_regression")}
UPSTREAM_ROWS = [{"result": "improved", "goals_passing": 10, "goals_total": 12, "timestamp": "2026-03-08T01:00:00Z"},
                 {"result": "improved", "goals_passing": 8, "goals_total": 12, "timestamp": "2026-03-08T02:00:00Z"}]


def _snap(tail: list[dict[str, Any]], ack: bool = False, acked: int = 0) -> halt.HaltSnapshot:
    markers = dict(ABSENT)
    if ack:
        markers["ack_regression"] = Marker(Path("/x/ACK-REGRESSION"), True, content="ok\n")
    return halt.HaltSnapshot(now=1e9, kill_ttl_s=7 * 86400, **markers, ledger_tail=tail, ack_regression_cycle=acked)


@pytest.mark.parametrize(("tail", "ack", "acked", "want_halt", "want_acked"), [
    (UPSTREAM_ROWS, False, 0, "goal_regression", 0),        # no cycle numbers: still a drop
    (UPSTREAM_ROWS, True, 0, None, 1),                        # acknowledged: as evolve's cycle 1
    (UPSTREAM_ROWS, False, 1, None, 0),                       # and that acknowledgement holds
    ([{"cycle": 4, "result": "improved"}, *UPSTREAM_ROWS], False, 4, "goal_regression", 0),
    ([{"cycle": 4, "result": "improved"}, *UPSTREAM_ROWS], True, 4, None, 5),
    (UPSTREAM_ROWS[::-1], False, 0, None, 0),                 # a rise is no regression
])
def test_goal_regression_without_cycle_numbers(tail, ack, acked, want_halt, want_acked) -> None:
    d = halt.evaluate(_snap(tail, ack, acked))
    assert d.halt == want_halt and d.acked_cycle == want_acked
    if want_halt:
        assert "10 -> 8 of 12" in d.detail


def _upstream_ledger(env: Env, *rows: dict[str, Any]) -> None:
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.ledger.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in rows))


def test_fire_and_status_halt_on_a_drop_without_cycle_numbers(env: Env, cli) -> None:
    env.queue(entry("a"))
    _upstream_ledger(env, *UPSTREAM_ROWS)
    r = cli("status", "--json")
    assert r.code == 75 and orjson.loads(r.stdout)["halt"]["reason"] == "goal_regression"
    r = cli("fire")
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["goal_regression"]
    assert len(env.ledger()) == 2  # nothing was run
    env.paths.ack_regression.write_text("seen it\n")
    r = cli("fire", "--cycles", "1")
    assert "regression.acknowledged" in r.names() and env.ledger()[-1]["result"] == "improved"
    assert env.ledger()[-1]["cycle"] == 1 and env.state()["ack_regression_cycle"] == 1
    assert cli("status", "--json").code == 0  # the acknowledgement sticks for status too


# -- 4 and 5. GOALS.md: only the gates table, and one bad row costs one row ----------------------------

GOALS_MD = """\
# Goals

Keep the demo healthy.

## Gates

| ID | Check | Weight | Description |
|----|-------|--------|-------------|
| tests-pass | `exit 1` | 8 | tests pass |
| lint | `true` | 3 | lint clean |

### Notes on gates

| ID | Check | Weight | Description |
|----|-------|--------|-------------|
| note-example | `touch {pwn}-notes` | 5 | an example in prose |

## History

| ID | Check | Weight | Description |
|----|-------|--------|-------------|
| old-gate | `touch {pwn}-history` | 5 | retired 2026-02 |

## Directives

### 1. Ship the thing

**Steer:** increase
"""


def test_only_the_gates_table_is_measured(tmp_path: Path) -> None:
    pwn = tmp_path / "pwned"
    (tmp_path / "GOALS.md").write_text(GOALS_MD.format(pwn=pwn))
    gf = load_goals(tmp_path)
    assert gf is not None and [g.id for g in gf.goals] == ["tests-pass", "lint"]
    assert [d.title for d in gf.directives] == ["Ship the thing"]
    snap = measure(tmp_path, gf, goal_timeout_s=10, total_timeout_s=30, env=dict(os.environ))
    assert [g["goal_id"] for g in snap["goals"]] == ["tests-pass", "lint"]
    assert not list(tmp_path.glob("pwned*"))  # no "check" of another table ever ran


BAD_ROWS = """\
## Gates

| ID | Check | Weight | Description |
|----|-------|--------|-------------|
| word | `exit 1` | high | weight is a word |
| big | `exit 1` | 99 | weight out of range |
| negative | `exit 1` | -1 | weight negative |
| short | `exit 1` |
|  | `touch {pwn}` | 5 | no id |
| good | `exit 1` | 9 | fine |
"""


def test_one_bad_row_does_not_disable_every_goal(tmp_path: Path) -> None:
    pwn = tmp_path / "pwned"
    (tmp_path / "GOALS.md").write_text(BAD_ROWS.format(pwn=pwn))
    warned: list[str] = []
    src = GoalsSource(tmp_path, tmp_path / ".agents" / "evolve", goal_timeout_s=10, total_timeout_s=30,
                      env=dict(os.environ), warn=warned.append)
    items = src.candidates()  # no probe error: the rung works
    assert [(i.ref, i.data["weight"]) for i in items] == [
        ("goal:good", 9), ("goal:big", 5), ("goal:negative", 5), ("goal:short", 5), ("goal:word", 5)]
    assert len(warned) == 5 and not pwn.exists()
    for name, line in (("'word'", 5), ("'big'", 6), ("'negative'", 7), ("'short'", 8)):
        assert any(f"line {line}: goal {name}" in w and "default weight 5" in w for w in warned), name
    assert any("line 9" in w and "missing id; row skipped" in w for w in warned)
    src.candidates()
    assert len(warned) == 5  # once per GOALS era, not at every selection


# -- 6. fitness-latest.json describes the tree as it stands ------------------------------------------

GOALS_ONE = """\
## Gates

| ID | Check | Weight | Description |
|----|-------|--------|-------------|
| not-broken | `test ! -f broken.txt` | 5 | nothing is broken |
"""


def test_a_reverted_cycle_leaves_the_standing_measurement_in_fitness_latest(env: Env, cli) -> None:
    (env.repo / "GOALS.md").write_text(GOALS_ONE)
    git(env.repo, "add", "GOALS.md")
    git(env.repo, "commit", "-q", "-m", "goals")
    start = git(env.repo, "rev-parse", "HEAD").strip()
    env.queue(entry("break it"))
    env.steps([improved_step(path="broken.txt")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    (e,) = env.ledger()
    assert (e["result"], e["goals_passing"], e["goals_total"]) == ("regressed", 1, 1)
    latest = orjson.loads((env.paths.evolve_dir / "fitness-latest.json").read_bytes())
    post = orjson.loads((env.paths.evolve_dir / "fitness-latest-post.json").read_bytes())
    # What upstream readers (which ignore git_sha) see agrees with the ledger and with the tree.
    assert (latest["summary"]["passing"], latest["git_sha"]) == (1, start)
    assert post["summary"]["passing"] == 0 and post["git_sha"] != start  # the reverted commit's measurement
    # The red commit was made in the agent's work tree and never landed: the branch still stands at the
    # start, the tree the standing measurement measured (docs/DESIGN.md §8.3).
    assert git(env.repo, "rev-parse", "HEAD").strip() == start and not (env.repo / "broken.txt").exists()
    assert git(env.tree, "rev-parse", "HEAD").strip() == start and not (env.tree / "broken.txt").exists()
    assert git(env.repo, "status", "--porcelain").strip() == "" and not (env.repo / ".git" / "index.lock").exists()


# -- 7. target is the work ref --------------------------------------------------------------------------

def test_target_is_the_work_ref_and_the_title_has_its_own_field(env: Env, cli) -> None:
    env.queue(upstream_entry("na-fr0", {"title": "Fix the parser"}))
    r = cli("fire", "--cycles", "2")
    assert r.code == 0, r.stderr
    worked, idle = env.ledger()
    assert worked["target"] == worked["work_ref"] == "source_epic=na-fr0:item=Fix the parser"
    assert worked["title"] == "Fix the parser" and worked["result"] == "improved"
    assert (idle["target"], idle["work_ref"]) == ("idle", None) and "title" not in idle
    assert git(env.repo, "cat-file", "-t", worked["sha"]).strip() == "commit"
    # Upstream's one-liner `jq 'select(.target == $ref)'` finds the cycle.
    assert [e["cycle"] for e in env.ledger() if e["target"] == worked["work_ref"]] == [1]


# -- 8. red is red in both dialects ---------------------------------------------------------------------

@pytest.mark.parametrize(("last", "red"), [
    ({"result": "FAIL"}, True),
    ({"result": "FAIL: 3 tests red"}, True),
    ({"result": "BLOCKED: needs human review"}, True),
    ({"result": "regressed"}, True),
    ({"result": "improved", "gate": "FAIL"}, True),
    ({"result": "failed"}, False),  # evolve's own infrastructure failure is not a red tree
    ({"result": "improved", "gate": "PASS"}, False),
    ({"result": "unchanged"}, False),
])
def test_red_is_red_in_both_dialects(last: dict[str, Any], red: bool) -> None:
    assert halt.is_red(last) is red
    assert halt.evaluate(_snap([last])).restorative is red


def test_an_upstream_fail_row_makes_the_next_fire_restorative(env: Env, cli) -> None:
    env.queue(entry("feature work", type="feature"), entry("fix the build", epic="e2", type="bug"))
    _upstream_ledger(env, {"result": "FAIL: gate red", "timestamp": "2026-03-08T01:00:00Z"})
    r = cli("fire", "--cycles", "1")
    assert "restorative" in r.names()
    assert env.ledger()[-1]["work_ref"] == "source_epic=e2:item=fix the build"


# -- 9. an empty tracker answer is zero beads --------------------------------------------------------------

def _tracker(tmp_path: Path, out: str) -> BeadsSource:
    return BeadsSource([sys.executable, "-c", f"import sys; sys.stdout.write({out!r})"], tmp_path,
                       timeout_s=30, env=dict(os.environ))


def test_an_empty_tracker_answer_is_zero_beads_and_ties_keep_its_order(tmp_path: Path) -> None:
    assert list(_tracker(tmp_path, "").candidates()) == []
    assert list(_tracker(tmp_path, "\n").candidates()) == []
    listed = [{"id": "bd-9", "priority": 1, "title": "listed first"}, {"id": "bd-1", "priority": 1},
              {"id": "bd-5", "priority": 0}]
    got = _tracker(tmp_path, orjson.dumps(listed).decode()).candidates()
    assert [got[i].ref for i in range(len(got))] == ["bead:bd-5", "bead:bd-9", "bead:bd-1"]


def test_an_empty_tracker_lets_the_loop_rest(env: Env, cli) -> None:
    env.write_config(work={"beads_command": [sys.executable, "-c", "pass"]})
    for _ in range(3):
        cli("fire")
    assert [e.get("probe_error") for e in env.ledger()] == [None, None, None]
    assert env.paths.dormant.exists()


# -- 10. shared keys stay current ------------------------------------------------------------------------

def test_session_state_keeps_upstreams_cycle_key_current(env: Env, cli) -> None:
    assert "cycle" not in SessionState(last_logged_cycle=4).to_dict()  # never added
    assert SessionState(last_logged_cycle=4, extra={"cycle": 2}).to_dict()["cycle"] == 4
    _upstream_ledger(env, *({"cycle": c, "result": "improved", "timestamp": "2026-03-08T01:00:00Z"} for c in (1, 2)))
    env.paths.state.write_bytes(orjson.dumps({"cycle": 2, "idle_streak": 0, "upstream_note": "kept"}))
    env.queue(entry("a"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    st = env.state()
    assert st["cycle"] == st["last_logged_cycle"] == 3 and st["upstream_note"] == "kept"


# -- 11. say what we don't do --------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["exit 3", "test -f budget && exit 3", "BUDGET=1 gov"])
def test_a_shell_governor_fails_loudly_with_the_argv_form(env: Env, cli, cmd: str) -> None:
    env.queue(entry("a"))
    r = cli("fire", extra_env={"EVOLVE_GOVERNOR_CMD": cmd})
    assert r.code == 78, (r.stdout, r.stderr)  # a config error: nothing ran
    said = r.stdout + r.stderr
    assert "EVOLVE_GOVERNOR_CMD" in said and "evolve runs no shell" in said and '["bash","-c",' in said
    assert env.ledger() == [] and env.calls() == []
    # The argv form it names works: exit 3 is the budget halt.
    r = cli("fire", extra_env={"EVOLVE_GOVERNOR_CMD": '["bash", "-c", "exit 3"]'})
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["governor_budget_burned"]


def test_the_global_kill_counts_at_both_paths(env: Env, cli, tmp_path: Path) -> None:
    home = tmp_path / "home"
    extra = {"HOME": str(home)}
    env.queue(entry("a"))
    kill = home / ".config" / "evolve" / "KILL"
    kill.parent.mkdir(parents=True)
    kill.write_text("2026-03-08T00:00:00Z\nupstream says stop\n")
    os.utime(kill)  # fresh: the TTL keeps it live
    r = cli("fire", extra_env=extra)
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["kill"] and env.ledger() == []
    r = cli("status", "--json", extra_env=extra)
    assert r.code == 75 and "upstream says stop" in orjson.loads(r.stdout)["halt"]["detail"]
    paths = Paths.for_repo(env.repo, env=env.env(**extra))
    assert paths.global_kills == (env.xdg / "evolve" / "KILL", kill)
    assert Paths.for_repo(env.repo, env={"HOME": str(home)}).home_kill is None  # the same file, once
    r = cli("resume", "--kill", extra_env=extra)
    assert r.code == 0 and not kill.exists()
    r = cli("fire", "--cycles", "1", extra_env=extra)
    assert env.ledger()[-1]["result"] == "improved"
