"""Agent reports are untrusted input (issue 13 item 5; docs/DESIGN.md §5.3, §6.1, §10).

The report's texts are capped, its numbers checked, the work it proposes bounded (``work.max_new_work``)
and stripped of queue lifecycle fields, and each change is a warning in the log and the ledger. A
harvested item another tool left ``in_progress`` is taken over once its claim is older than the
visibility timeout. Parsers are tested pure; the rest through real fires of the scripted agent.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry, improved_step, jsonl

from evolve import config
from evolve.agent import stream
from evolve.agent.report import (
    ITEM_BYTES_MAX,
    PERCEPT_CAP,
    PERCEPTS_MAX,
    SUMMARY_CAP,
    loads_report,
    parse_report,
)
from evolve.errors import ConfigError
from evolve.timeutil import utc_iso
from evolve.work.harvested import HarvestedQueue
from evolve.work.item import ClaimLost

LIFECYCLE = {"consumed": True, "claim_status": "consumed", "claimed_by": "agent", "claimed_at": "2026-01-01T00:00:00Z",
             "consumed_by": "agent", "consumed_at": "2026-01-01T00:00:00Z", "status": "blocked",
             "failed_at": "2026-01-01T00:00:00Z", "disposition": "defer:never"}


def queue_items(env: Env) -> list[dict[str, Any]]:
    return [i for e in jsonl(env.paths.nextwork) for i in e.get("items", [])]


# -- the report, parsed -------------------------------------------------------------------------------


def test_lifecycle_fields_of_proposed_work_are_stripped() -> None:
    r = parse_report({"result": "improved", "new_work": [{"title": "pre-consumed", "type": "bug", **LIFECYCLE}]})
    assert r.new_work == [{"title": "pre-consumed", "type": "bug"}]
    assert any("lifecycle" in w for w in r.warnings)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1, -0.5, "3", True, [1]])
def test_bad_cost_and_counts_are_zero_with_a_warning(bad: Any) -> None:
    r = parse_report({"result": "improved", "cost_usd": bad, "num_turns": bad, "context_window": bad,
                      "usage": {"input_tokens": bad, "output_tokens": 5}})
    assert r.cost_usd == 0.0 and r.num_turns == 0 and r.context_window == 0
    assert r.usage.input_tokens == 0 and r.usage.output_tokens == 5
    joined = " ".join(r.warnings)
    for key in ("cost_usd", "num_turns", "context_window", "usage.input_tokens"):
        assert key in joined
    assert "usage.output_tokens" not in joined
    orjson.dumps(r.__dict__, default=lambda o: o.__dict__)  # nothing a JSON line cannot hold


def test_counts_beyond_64_bits_are_zero_with_a_warning() -> None:
    # orjson cannot write an integer past 64 bits: the ledger append would raise on one.
    r = parse_report({"result": "improved", "num_turns": 2**64, "context_window": 2**70,
                      "usage": {"input_tokens": 2**63}})
    assert r.num_turns == 0 and r.context_window == 0 and r.usage.input_tokens == 0
    assert len(r.warnings) == 3


def test_good_numbers_give_no_warning() -> None:
    r = parse_report({"result": "improved", "cost_usd": 0.5, "num_turns": 3, "context_window": 200_000,
                      "usage": {"input_tokens": 1}, "summary": "ok", "session_id": "abc"})
    assert r.warnings == []


def test_texts_are_capped_and_say_so() -> None:
    huge = "x" * (10 * 1024 * 1024)
    r = parse_report({"result": "failed", "summary": huge, "disposition": huge, "error": huge,
                      "percepts": [huge] * 1000})
    assert len(r.summary) == SUMMARY_CAP and len(r.disposition) == 500 and len(r.error) == 500
    assert len(r.percepts) == PERCEPTS_MAX and all(len(p) == PERCEPT_CAP for p in r.percepts)
    joined = " ".join(r.warnings)
    assert f"summary: {len(huge)} chars capped to {SUMMARY_CAP}" in joined
    assert "disposition:" in joined and "error:" in joined and "percepts: 1000, kept 20" in joined
    assert huge[:100] not in joined  # warnings name fields, never echo the agent's text


@pytest.mark.parametrize("sid", ["s" * 257, "a\nb", "a\x1b[2Jb", 7])
def test_an_unusable_session_id_is_dropped_not_truncated(sid: Any) -> None:
    r = parse_report({"result": "improved", "session_id": sid})
    assert r.session_id is None
    assert any("session_id" in w for w in r.warnings)


def test_proposed_items_are_capped_and_oversized_ones_dropped() -> None:
    r = parse_report({"result": "improved", "new_work": [
        {"title": "t" * 5000, "description": "d" * 50_000},
        {"title": "fat", "notes": "n" * (ITEM_BYTES_MAX + 1)},
        {"title": "fine"},
    ]})
    assert [len(w["title"]) for w in r.new_work] == [500, 4]
    assert len(r.new_work[0]["description"]) == 4000
    assert any("1 items over" in w for w in r.warnings)


def test_loads_report_takes_python_non_finite_constants_but_nothing_else_loose() -> None:
    obj = loads_report(b'{"result": "improved", "cost_usd": NaN, "num_turns": Infinity, "x": -Infinity}')
    assert math.isnan(obj["cost_usd"]) and math.isnan(obj["num_turns"]) and math.isnan(obj["x"])
    with pytest.raises(ValueError):
        loads_report(b'{"result": "improved", "summary": "\\ud800"}')  # a lone surrogate: the ledger cannot hold it
    with pytest.raises(ValueError):
        loads_report(b"{not json")


def test_claude_stream_numbers_are_checked_too() -> None:
    state = stream.StreamState()
    state.line(orjson.dumps({"type": "system", "subtype": "init", "session_id": "s-1"}))
    state.line(orjson.dumps({"type": "result", "subtype": "success", "is_error": False, "session_id": "x" * 5000,
                             "num_turns": -3, "total_cost_usd": -2.5,
                             "result": '```evolve-report\n{"result": "improved", "cost_usd": NaN}\n```'}))
    rep = stream.to_report(state, output_tail="")
    assert rep.result == "improved" and rep.cost_usd == 0.0 and rep.num_turns == 0 and rep.session_id == "s-1"
    joined = " ".join(rep.warnings)
    assert "total_cost_usd" in joined and "num_turns" in joined and "session_id" in joined
    assert "cost_usd: not a finite" in joined  # the block's own NaN, read instead of losing the report


# -- config ---------------------------------------------------------------------------------------------


def test_max_new_work_and_claim_visibility_keys() -> None:
    cfg = config.resolve({}, "c.toml", {})
    assert cfg.work.max_new_work == 20
    assert config.claim_visibility_s(cfg) == 55 * 60  # fire.max_minutes
    cfg = config.resolve({"work": {"claim_visibility_minutes": 10}, "fire": {"max_minutes": 0}}, "c.toml", {})
    assert config.claim_visibility_s(cfg) == 600
    assert config.claim_visibility_s(config.resolve({"fire": {"max_minutes": 0}}, "c.toml", {})) == 3600
    assert config.resolve({"work": {"max_new_work": 0}}, "c.toml", {}).work.max_new_work == 0
    for bad in (-1, 1001, 2.5, "20"):
        with pytest.raises(ConfigError, match=r"work\.max_new_work"):
            config.resolve({"work": {"max_new_work": bad}}, "c.toml", {})
    with pytest.raises(ConfigError, match="claim_visibility_minutes"):
        config.resolve({"work": {"claim_visibility_minutes": -5}}, "c.toml", {})


# -- real fires -----------------------------------------------------------------------------------------


def test_fifty_proposed_items_queue_twenty_and_warn(env: Env, cli) -> None:
    proposed = [{"title": f"follow-up {i}", "type": "task"} for i in range(50)]
    env.queue(entry("first"))
    env.steps([improved_step(new_work=proposed)])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert [i["title"] for i in queue_items(env)] == ["first", *(f"follow-up {i}" for i in range(20))]
    (warn,) = [e for e in r.events() if e["event"] == "queue.new_work_dropped"]
    assert (warn["proposed"], warn["kept"], warn["dropped"]) == (50, 20, 30)
    assert warn["level"] == "warning"


def test_max_new_work_zero_queues_nothing(env: Env, cli) -> None:
    env.write_config(work={"max_new_work": 0})
    env.queue(entry("first"))
    env.steps([improved_step(new_work=[{"title": "nope"}])])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert [i["title"] for i in queue_items(env)] == ["first"]
    assert "queue.new_work_dropped" in [e["event"] for e in r.events()]


def test_a_scout_split_is_bounded_too(env: Env, cli) -> None:
    env.write_config(work={"max_new_work": 2})
    env.queue(entry("epic"))
    children = [{"title": f"child {i}", **LIFECYCLE} for i in range(5)]
    env.steps([{"report": {"result": "scout", "disposition": "split", "new_work": children}}, improved_step()])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    lines = jsonl(env.paths.nextwork)
    assert lines[0]["items"][0]["split_into"] == ["child 0", "child 1"]
    kids = [i for e in lines[1:] for i in e["items"]]
    assert [k["title"] for k in kids] == ["child 0", "child 1"]
    assert kids[0]["claim_status"] == "consumed"  # taken and landed by this fire, not pre-consumed
    assert "claimed_by" not in kids[1] and "consumed" not in kids[1] and "status" not in kids[1]
    assert env.ledger()[-1]["title"] == "child 0"


def test_a_pre_consumed_proposal_is_queued_available_and_worked_next(env: Env, cli) -> None:
    env.queue(entry("first"))
    env.steps([improved_step(new_work=[{"title": "sneaky", **LIFECYCLE}]), improved_step()])
    r = cli("fire", "--cycles", "2")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert [e["result"] for e in ledger] == ["improved", "improved"]
    assert ledger[1]["title"] == "sneaky"  # it was selectable: the agent's lifecycle fields were dropped
    _, item = queue_items(env)
    assert item["consumed_by"].startswith("evolve") and item["claimed_by"].startswith("evolve")
    assert "disposition" not in item and "status" not in item and "failed_at" not in item


def test_non_finite_and_negative_numbers_reach_the_ledger_as_zero(env: Env, cli) -> None:
    raw = ('{"result": "improved", "summary": "ok", "cost_usd": NaN, "num_turns": -1, "context_window": Infinity,'
           ' "usage": {"input_tokens": -1, "output_tokens": 1e999, "cache_read_input_tokens": NaN,'
           ' "cache_creation_input_tokens": 7}}')
    env.queue(entry("first"))
    env.steps([{"write": [{"path": "src/a.txt", "content": "a\n"}], "raw_report": raw}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    line = env.paths.ledger.read_bytes().splitlines()[-1]
    e = orjson.loads(line)  # strict JSON: no NaN, no Infinity
    assert e["result"] == "improved"
    assert e["cost_usd"] == 0 and e["num_turns"] == 0
    assert e["usage"] == {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                          "cache_creation_input_tokens": 7}
    assert len(e["report_warnings"]) == 6
    (warn,) = [x for x in r.events() if x["event"] == "agent.report_sanitized"]
    assert warn["level"] == "warning" and warn["warnings"] == e["report_warnings"]


def test_a_ten_megabyte_summary_and_session_id_are_capped(env: Env, cli) -> None:
    huge = "y" * (10 * 1024 * 1024)
    env.queue(entry("first"))
    env.steps([{"write": [{"path": "src/a.txt", "content": "a\n"}],
                "report": {"result": "improved", "summary": huge, "session_id": huge}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved" and len(e["summary"]) <= SUMMARY_CAP
    assert len(e["session_id"]) < 100  # the fire's own id, not the agent's 10 MB one
    assert any(w.startswith("summary: 10485760 chars capped") for w in e["report_warnings"])
    assert len(env.paths.ledger.read_bytes()) < 64 * 1024
    assert len(env.paths.state.read_bytes()) < 64 * 1024


# -- stale claims in the harvested queue ----------------------------------------------------------------


def _claimed(title: str, by: str, age_s: float, now: float | None = None) -> dict[str, Any]:
    return {"title": title, "type": "task", "severity": "high", "claim_status": "in_progress", "claimed_by": by,
            "claimed_at": utc_iso((now or time.time()) - age_s)}


def test_a_fire_takes_over_a_stale_foreign_claim_but_not_a_fresh_one(env: Env, cli) -> None:
    env.queue({"source_epic": "other", "timestamp": "2026-11-01T00:00:00Z",
               "items": [_claimed("fresh", "other-tool", 60), _claimed("stale", "other-tool", 7200)]})
    env.steps([improved_step()], loop=True)
    r = cli("fire", "--cycles", "2")
    assert r.code == 0, r.stderr
    targets = [e.get("title") for e in env.ledger()]
    assert targets[0] == "stale" and "fresh" not in targets  # "fresh" is still held by the other tool
    fresh, stale = queue_items(env)
    assert fresh["claim_status"] == "in_progress" and fresh["claimed_by"] == "other-tool"
    assert stale["claim_status"] == "consumed" and stale["consumed_by"].startswith("evolve")
    (taken,) = [e for e in r.events() if e["event"] == "claim.stale_taken"]
    assert taken["claimed_by"] == "other-tool" and taken["level"] == "warning"


def _queue(tmp_path: Path, *items: dict[str, Any], clock: Any = time.time, vis: float | None = 3600) -> HarvestedQueue:
    p = tmp_path / "next-work.jsonl"
    p.write_bytes(orjson.dumps({"source_epic": "ep", "items": list(items)}) + b"\n")
    return HarvestedQueue(p, repo_names=("r",), claim_visibility_s=vis, clock=clock)


def test_staleness_is_judged_at_each_call_without_a_file_change(tmp_path: Path) -> None:
    t = [1_800_000_000.0]
    q = _queue(tmp_path, _claimed("held", "other-tool", 60, now=t[0]), {"title": "free", "severity": "low"},
               clock=lambda: t[0])
    assert [w.title for w in q.candidates()] == ["free"]
    t[0] += 3600  # the claim is now 61 minutes old; the file has not changed, the index is reused
    assert [w.title for w in q.candidates()] == ["held", "free"]  # rank order: severity high first
    assert [w.title for w in q.candidates(since_line=1)] == []


@pytest.mark.parametrize("claimed_at", [None, "", "yesterday", "2026-13-45T00:00:00Z", ["x"], "9999-01-01T00:00:00Z"])
def test_an_undatable_or_far_future_claim_is_stale(tmp_path: Path, claimed_at: Any) -> None:
    item = {"title": "odd", "claim_status": "in_progress", "claimed_by": "other-tool", "claimed_at": claimed_at}
    q = _queue(tmp_path, item)
    assert [w.title for w in q.candidates()] == ["odd"]


def test_epoch_seconds_claims_are_understood(tmp_path: Path) -> None:
    now = time.time()
    q = _queue(tmp_path, {"title": "a", "claim_status": "in_progress", "claimed_at": now - 30},
               {"title": "b", "claim_status": "in_progress", "claimed_at": now - 7200})
    assert [w.title for w in q.candidates()] == ["b"]


def test_without_a_visibility_timeout_claims_never_expire(tmp_path: Path) -> None:
    assert _queue(tmp_path, _claimed("held", "other-tool", 10**6), vis=None).candidates() == []


def test_claim_takes_over_a_stale_claim_and_the_index_follows(tmp_path: Path) -> None:
    q = _queue(tmp_path, _claimed("stale", "other-tool", 7200))
    (item,) = q.candidates()
    q.claim(item, "evolve:cycle-1", utc_iso())
    (got,) = jsonl(q.path)[0]["items"]
    assert (got["claim_status"], got["claimed_by"]) == ("in_progress", "evolve:cycle-1")
    assert q.candidates() == []  # our own fresh claim holds
    q.finalize(item, "evolve:cycle-1", utc_iso())
    assert jsonl(q.path)[0]["items"][0]["consumed"] is True and q.candidates() == []


def test_a_claim_renewed_after_selection_is_claim_lost(tmp_path: Path) -> None:
    q = _queue(tmp_path, _claimed("contended", "other-tool", 7200))
    (item,) = q.candidates()
    # The other tool comes back and renews its claim between our selection and our claim.
    q.path.write_bytes(orjson.dumps({"source_epic": "ep", "items": [_claimed("contended", "other-tool", 5)]}) + b"\n")
    with pytest.raises(ClaimLost):
        q.claim(item, "evolve:cycle-1", utc_iso())
    assert jsonl(q.path)[0]["items"][0]["claimed_by"] == "other-tool"


# -- the report file ------------------------------------------------------------------------------------


def test_report_file_is_read_as_untrusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evolve.agent import command

    p = tmp_path / "report.json"
    assert command.read_report_file(p) is None
    p.write_bytes(b'{"result": "improved"}')
    assert command.read_report_file(p) == b'{"result": "improved"}'
    monkeypatch.setattr(command, "REPORT_MAX_BYTES", 10)
    assert command.read_report_file(p) == b""  # too big: read no further, parsed as "not JSON"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert command.read_report_file(fifo) == b""  # would block for ever waiting for a writer


def test_a_report_file_symlinked_to_a_device_fails_the_cycle_not_the_fire(env: Env, cli) -> None:
    env.queue(entry("first"))
    env.write_config(agent={"argv": ["sh", "-c", 'ln -s /dev/zero "$EVOLVE_REPORT_FILE"']})
    r = cli("fire", "--cycles", "1", timeout=60)
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"], e["error"]) == ("failed", "crashed", "report file is not valid JSON")
