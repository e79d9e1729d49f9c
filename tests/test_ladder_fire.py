"""The ladder end to end: a fake tracker, dormancy, generators, scouts, the metronome, dry-run."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import orjson
import pytest
from support import Env, entry, improved_step, live, results


def fake_tool(bindir: Path, name: str, body: str) -> Path:
    """A real executable on PATH (a Python script) standing in for ``bd``/``br`` or a generator."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


BD_READY = """
import json, os, sys
calls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl")
with open(calls, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["ready", "--json"]:
    beads = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "beads.json")))
    print(json.dumps(beads))
"""


def tracker(env: Env, beads: object, name: str = "bd") -> Path:
    bindir = env.root / "bin"
    fake_tool(bindir, name, BD_READY)
    (bindir / "beads.json").write_text(orjson.dumps(beads).decode())
    return bindir


def path_env(bindir: Path) -> dict[str, str]:
    return {"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}


def tool_calls(bindir: Path) -> list[list[str]]:
    p = bindir / "calls.jsonl"
    return [orjson.loads(x) for x in p.read_bytes().splitlines()] if p.exists() else []


BEADS = [
    {"id": "bd-3", "title": "low priority", "priority": 3, "issue_type": "task", "labels": [],
     "created_at": "2026-01-01T00:00:00Z"},
    {"id": "bd-1", "title": "operator only", "priority": 0, "issue_type": "task", "labels": ["Operator-Shape"]},
    {"id": "bd-2", "title": "critical fix", "priority": 0, "issue_type": "bug", "labels": [],
     "created_at": "2026-01-02T00:00:00Z"},
]


@pytest.mark.parametrize("shape", ["array", "issues", "items", "data"])
def test_beads_rung_takes_the_top_ready_bead_and_closes_it(env: Env, cli, shape: str) -> None:
    payload = BEADS if shape == "array" else {shape: BEADS}
    bindir = tracker(env, payload)
    r = cli("fire", "--cycles", "1", extra_env=path_env(bindir))
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["selected_source"], e["work_ref"], e["result"]) == ("beads", "bead:bd-2", "improved")
    assert e["mode"] == "beads:bug"
    assert ["close", "bd-2"] in tool_calls(bindir)
    assert "bd-2: critical fix" in env.calls()[0]["prompt"]


def test_harvested_beats_beads(env: Env, cli) -> None:
    bindir = tracker(env, BEADS)
    env.queue(entry("harvested first"))
    cli("fire", "--cycles", "1", extra_env=path_env(bindir))
    assert env.ledger()[-1]["selected_source"] == "harvested"
    assert not tool_calls(bindir)  # the tracker is not even asked while harvested work exists


def test_br_stands_in_for_a_missing_bd(env: Env, cli) -> None:
    bindir = tracker(env, BEADS, name="br")
    cli("fire", "--cycles", "1", extra_env=path_env(bindir))
    assert env.ledger()[-1]["work_ref"] == "bead:bd-2"


def test_failing_tracker_is_a_probe_error_not_empty(env: Env, cli) -> None:
    bindir = env.root / "bin"
    fake_tool(bindir, "bd", "import sys; print('boom', file=sys.stderr); sys.exit(1)")
    for _ in range(4):
        r = cli("fire", extra_env=path_env(bindir))
        assert r.code == 0
    assert not env.paths.dormant.exists()
    ledger = env.ledger()
    assert all(e["probe_error"] is True for e in ledger)
    blocked = [orjson.loads(x) for x in env.paths.blocked.read_bytes().splitlines()]
    assert len(blocked) == 4 and "boom" in blocked[0]["reason"]
    assert env.state()["idle_streak"] == 0


def test_hanging_tracker_is_killed_at_the_probe_timeout(env: Env, cli) -> None:
    bindir = env.root / "bin"
    pidfile = env.root / "bd.pid"
    fake_tool(bindir, "bd", f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)")
    env.write_config(work={"probe_timeout_s": 1})
    r = cli("fire", extra_env=path_env(bindir), timeout=60)
    assert r.code == 0
    assert any(e["event"] == "source.probe_error" and "timed out" in e["error"] for e in r.events())
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_three_empty_passes_write_dormant_and_a_bead_clears_it(env: Env, cli) -> None:
    for n in range(1, 4):
        r = cli("fire")
        assert r.code == 0
        assert env.paths.dormant.exists() == (n == 3), n
    assert results(env.ledger()) == ["unchanged"] * 3
    assert env.paths.dormant.read_text().splitlines()[0] == "cycle 3"
    r = cli("fire")
    assert [e["reason"] for e in r.events() if e["event"] == "halt"] == ["dormant"]
    bindir = tracker(env, BEADS)
    r = cli("fire", "--cycles", "1", extra_env=path_env(bindir))
    assert "dormant.cleared" in r.names() and not env.paths.dormant.exists()
    assert env.ledger()[-1]["work_ref"] == "bead:bd-2"


def test_a_new_harvested_item_clears_dormant(env: Env, cli) -> None:
    for _ in range(3):
        cli("fire")
    assert env.paths.dormant.exists()
    env.queue(entry("fresh work"))
    r = cli("fire", "--cycles", "1")
    assert "dormant.cleared" in r.names()
    assert env.ledger()[-1]["title"] == "fresh work"


def test_loop_mode_never_writes_dormant(env: Env, cli) -> None:
    for _ in range(5):
        assert cli("fire", "--mode", "loop").code == 0
    assert not env.paths.dormant.exists() and not env.paths.stop.exists() and not env.paths.kill.exists()
    rows = [orjson.loads(x) for x in env.paths.blocked.read_bytes().splitlines()]
    assert [r["cycle"] for r in rows] == [3, 4, 5]
    assert all(r["reason"] == "stagnation: all sources empty x3" for r in rows)


def test_work_between_empty_passes_resets_the_count(env: Env, cli) -> None:
    cli("fire")
    cli("fire")
    env.queue(entry("a"))
    cli("fire", "--cycles", "1")
    cli("fire")
    cli("fire")
    assert not env.paths.dormant.exists()
    cli("fire")
    assert env.paths.dormant.exists()


GENERATOR = """
import json
print(json.dumps({"items": [
    {"title": "Generated: add tests", "type": "task", "severity": "low", "dedup_key": "gen-tests"},
    {"title": "Already   queued!", "type": "task"},
    {"title": "generated: ADD TESTS", "type": "task"},
    {"not": "an item"}
]}))
"""


def test_generators_feed_the_harvested_rung_with_dedup(env: Env, cli) -> None:
    bindir = env.root / "bin"
    gen = fake_tool(bindir, "gen", GENERATOR)
    env.write_config(work={"generators": [[str(gen)]]})
    env.queue(entry("already queued", consumed=True))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    lines = live(env.paths.nextwork)
    gen_entries = [e for e in lines if e.get("source_epic") == "evolve-generator"]
    assert len(gen_entries) == 1
    items = gen_entries[0]["items"]
    assert [i["title"] for i in items] == ["Generated: add tests"]
    assert items[0]["source"] == "evolve-generator"
    e = env.ledger()[-1]
    assert e["selected_source"] == "harvested" and e["title"] == "Generated: add tests"
    # A second fire finds the item consumed and the generator's output all duplicates: an empty pass.
    r = cli("fire", "--cycles", "1")
    lines = live(env.paths.nextwork)
    assert len([e for e in lines if e.get("source_epic") == "evolve-generator"]) == 1
    assert env.ledger()[-1]["target"] == "idle"


def test_scout_defer_moves_on_to_the_next_candidate_in_the_same_cycle(env: Env, cli) -> None:
    env.queue(entry("too big", "small one"))
    env.steps([{"report": {"result": "scout", "disposition": "defer:needs a design"}}, improved_step()])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert len(ledger) == 1
    e = ledger[0]
    assert (e["cycle"], e["result"], e["title"]) == (1, "improved", "small one")
    assert e["scouted"] == [{"ref": "source_epic=e1:item=too big", "disposition": "defer:needs a design"}]
    items = live(env.paths.nextwork)[0]["items"]
    assert items[0]["disposition"] == "defer:needs a design" and items[0]["claim_status"] == "available"
    assert items[1]["claim_status"] == "consumed"
    assert [c["env"]["EVOLVE_CYCLE"] for c in env.calls()] == ["1", "1"]
    assert env.state()["idle_streak"] == 0


def test_scout_split_queues_children_and_park_blocks(env: Env, cli) -> None:
    env.queue(entry("epic", "other"))
    children = [{"title": "child one", "type": "task"}, {"title": "child two", "type": "bug"}]
    env.steps([{"report": {"result": "scout", "disposition": "split", "new_work": children}},
               {"report": {"result": "scout", "disposition": "park: needs operator"}}, improved_step()])
    cli("fire", "--cycles", "1")
    lines = live(env.paths.nextwork)
    (parent_entry,) = [e for e in lines if e.get("source_epic") == "e1"]
    lines = [parent_entry, *(e for e in lines if e is not parent_entry)]  # (the parent's line moved on an edit)
    parent = lines[0]["items"][0]
    assert parent["status"] == "split" and parent["split_into"] == ["child one", "child two"]
    kids = [i for e in lines[1:] for i in e["items"]]
    assert [k["discovered_from"] for k in kids] == ["source_epic=e1:item=epic"] * 2
    # The cycle went on: "other" was parked, then the first child (file order breaks the tie) landed.
    assert lines[0]["items"][1]["status"] == "blocked"
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["title"] == "child one"
    assert [s["disposition"] for s in e["scouted"]] == ["split", "park: needs operator"]


def test_scout_with_nothing_else_logs_scout(env: Env, cli) -> None:
    env.queue(entry("only"))
    env.steps([{"report": {"result": "scout", "disposition": "defer:later"}}])
    cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert e["result"] == "scout" and e["scouted"][0]["disposition"] == "defer:later"
    assert env.state()["claimed_work"] is None


def _productive(env: Env, n: int, mode: str, title: str) -> None:
    """``n`` productive cycles on the same work coming back (``title 1``, ``title 2``...): a thrash (issue 16)."""
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"cycle": i + 1, "result": "improved", "mode": mode, "target": f"{title} {i + 1}", "timestamp": "x"}
            for i in range(n)]
    env.paths.ledger.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def test_metronome_soft_skip_takes_the_next_rung(env: Env, cli) -> None:
    _productive(env, 3, "harvested:task", "same shape again")
    bindir = tracker(env, BEADS)
    env.queue(entry("same shape again"))
    r = cli("fire", "--cycles", "1", extra_env=path_env(bindir))
    assert env.ledger()[-1]["selected_source"] == "beads"
    sel = next(e for e in r.events() if e["event"] == "work.selected")
    assert sel["rung"] == "beads"


def test_metronome_hard_block_and_rescope(env: Env, cli) -> None:
    _productive(env, 5, "harvested:task", "same shape again")
    env.queue(entry("same shape again"))
    r = cli("fire")
    assert r.code == 0
    e = env.ledger()[-1]
    assert (e["result"], e["selected_source"]) == ("unchanged", "metronome-gate-blocked")
    assert "metronome.blocked" in r.names() and env.calls() == []
    env.paths.rescope.write_text("Stop templating; write the missing integration test\n")
    r = cli("fire", "--cycles", "1")
    e = env.ledger()[-1]
    assert (e["selected_source"], e["result"]) == ("directive", "improved")
    assert e["title"] == "Stop templating; write the missing integration test"
    assert not env.paths.rescope.exists() and "rescope.consumed" in r.names()


def test_dry_run_shows_every_rung_and_why(env: Env, cli) -> None:
    _productive(env, 3, "harvested:task", "queued")
    bindir = tracker(env, BEADS)
    env.queue(entry("queued"))
    r = cli("fire", "--dry-run", extra_env=path_env(bindir))
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    verdicts = {(c["rung"], c["ref"]): c["verdict"] for c in plan["candidates"]}
    assert verdicts[("harvested", "source_epic=e1:item=queued")].startswith("metronome: rung skipped")
    assert verdicts[("beads", "bead:bd-2")] == "selected"
    assert plan["selection"]["rung"] == "beads" and plan["why"] == "top of the beads rung"
    assert ["close", "bd-2"] not in tool_calls(bindir)
    assert env.calls() == []


def test_appender_stress_while_fires_claim_and_finalize(env: Env, cli) -> None:
    """One process appends to next-work.jsonl in a tight loop while fires claim and finalize."""
    import subprocess

    env.queue(entry(*[f"w{i}" for i in range(6)]))
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os, orjson, time
for n in range(2000):
    fd = os.open({str(env.paths.nextwork)!r}, os.O_WRONLY | os.O_APPEND)
    os.write(fd, orjson.dumps({{"source_epic": "bg", "n": n, "items": [],
                               "consumed": True}}) + b"\\n")
    os.close(fd)
"""])
    fires = 0
    while writer.poll() is None and fires < 6:
        assert cli("fire", "--cycles", "1").code == 0
        fires += 1
    writer.wait(timeout=120)
    lines = live(env.paths.nextwork)
    assert sorted(e["n"] for e in lines if e.get("source_epic") == "bg") == list(range(2000))
    items = next(e for e in lines if e.get("source_epic") == "e1")["items"]
    done = [i for i in items if i.get("claim_status") == "consumed"]
    assert len(done) == len([x for x in env.ledger() if x["result"] == "improved"]) == fires
    assert all(i.get("claim_status") in ("consumed", None, "available") for i in items)
    assert all(i["consumed_by"] == i["claimed_by"] for i in done)


def test_quality_flag_takes_findings_first_and_claims_as_quality(env: Env, cli) -> None:
    env.queue(entry("low chore", type="chore", severity="low"), entry("high finding", epic="e2", severity="high"))
    r = cli("fire", "--cycles", "1", "--quality")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["title"] == "high finding"
    lines = live(env.paths.nextwork)
    (e2,) = [e for e in lines if e["source_epic"] == "e2"]
    assert e2["items"][0]["consumed_by"] == "evolve-quality:cycle-1"


def test_beads_only_flag(env: Env, cli) -> None:
    (env.repo / "GOALS.yaml").write_text("version: 3\ngoals:\n  - id: g\n    description: d\n    check: 'false'\n"
                                         "    weight: 5\n")
    r = cli("fire", "--cycles", "1", "--beads-only")
    assert r.code == 0
    assert env.ledger()[-1]["target"] == "idle"


def test_a_bead_that_keeps_failing_is_parked_in_the_tracker(env: Env, cli) -> None:
    bindir = tracker(env, BEADS)
    env.write_config(breaker={"max_consecutive_failures": 10})
    env.steps([{"exit": 1}])
    for _ in range(3):
        cli("fire", "--cycles", "1", extra_env=path_env(bindir))
    updates = [c for c in tool_calls(bindir) if c[:1] == ["update"]]
    assert len(updates) == 1
    assert updates[0][:4] == ["update", "bd-2", "--status", "blocked"] and updates[0][4] == "--notes"
    assert "parked after 3 failed attempts" in updates[0][5]
    assert ["close", "bd-2"] not in tool_calls(bindir)
