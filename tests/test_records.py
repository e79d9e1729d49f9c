"""Typed session-state records (docs/DESIGN.md §2): validated on read, lossless on write."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolve.store import session_state as ss
from evolve.store.ledger import Ledger
from evolve.store.records import RECORDS, AgentSession, ClaimedWork, FireRecord, PostCompact, Record


@pytest.mark.parametrize(
    ("cls", "obj", "want", "bad"),
    [
        (AgentSession, {"id": "s1", "events_since": 3, "ended_heavy": True},
         AgentSession(id="s1", events_since=3, ended_heavy=True), []),
        (AgentSession, {"id": [], "started_cycle": "x", "last_cycle": {}, "summary": "ok"},
         AgentSession(summary="ok"), ["id", "started_cycle", "last_cycle"]),
        (AgentSession, {"id": "s", "events_since": True}, AgentSession(id="s"), ["events_since"]),  # bool is no int
        (AgentSession, {"id": "s", "need_ref": None}, AgentSession(id="s"), []),
        (ClaimedWork, {"ref": "r", "cycle": "6"}, ClaimedWork(ref="r"), ["cycle"]),
        (ClaimedWork, {"ref": {}, "title": []}, ClaimedWork(), ["ref", "title"]),
        (FireRecord, {"pid": 7, "agent_pgid": 43.0, "cycle": 3}, FireRecord(pid=7, cycle=3), ["agent_pgid"]),
        (FireRecord, {"pid": "x", "started_at": 5, "cycle": []}, FireRecord(), ["pid", "started_at", "cycle"]),
        (PostCompact, {"session_id": "s", "cycle": 2, "text": "t"}, PostCompact("s", 2, "t"), []),
    ],
)
def test_fields_are_validated_on_read(cls: type[Record], obj: dict[str, Any], want: Record, bad: list[str]) -> None:
    got, wrong = cls.read(obj)
    assert got == want and wrong == bad


def test_unknown_keys_ride_along() -> None:
    obj = {"id": "s1", "upstream_field": {"a": [1]}, "version": 2}
    rec = AgentSession.from_json(obj)
    assert rec is not None and rec.extra == {"upstream_field": {"a": [1]}, "version": 2}
    out = rec.to_json()
    assert out["upstream_field"] == {"a": [1]} and out["version"] == 2 and out["id"] == "s1"
    assert "fork_handback" not in out  # absent until a fork hands something back


@pytest.mark.parametrize("obj", [None, {}, [], "x", 3])
def test_nothing_to_read_is_no_record(obj: object) -> None:
    for cls in RECORDS.values():
        assert cls.from_json(obj) is None


def test_records_are_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        AgentSession(id="s").id = "t"  # type: ignore[misc]


def test_session_state_round_trip_keeps_inner_unknown_keys(tmp_path) -> None:
    path, ledger = tmp_path / "session-state.json", Ledger(tmp_path / "cycle-history.jsonl")
    raw = {"agent_session": {"id": "s1", "runner": "claude", "theirs": 1},
           "fire": {"pid": 5, "cycle": 2, "host": "box"}, "claimed_work": {"ref": "r", "lease": "x"},
           "post_compact": None, "other_tool": True}
    path.write_bytes(orjson.dumps(raw))
    loaded = ss.load(path, ledger)
    assert loaded.warnings == []
    assert isinstance(loaded.state.agent_session, AgentSession) and loaded.state.agent_session.runner == "claude"
    assert isinstance(loaded.state.fire, FireRecord) and loaded.state.fire.pid == 5
    ss.save(path, loaded.state)
    disk = orjson.loads(path.read_bytes())
    assert disk["agent_session"]["theirs"] == 1 and disk["fire"]["host"] == "box"
    assert disk["claimed_work"]["lease"] == "x" and disk["other_tool"] is True


def test_wrong_inner_type_is_reset_and_said(tmp_path) -> None:
    path, ledger = tmp_path / "session-state.json", Ledger(tmp_path / "cycle-history.jsonl")
    path.write_bytes(orjson.dumps({"agent_session": {"id": "s1", "events_since": "many"}}))
    loaded = ss.load(path, ledger)
    assert loaded.state.agent_session == AgentSession(id="s1")
    assert loaded.warnings == ["session-state field 'agent_session.events_since' has the wrong type; reset"]


json_values = st.recursive(
    # what orjson reads from a file: finite floats, 64-bit integers
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(obj=st.dictionaries(st.sampled_from(["id", "runner", "cycle", "pid", "ref", "text", "x", "summary",
                                             "events_since", "ended_heavy", "fork_handback"]), json_values))
def test_any_object_reads_to_a_valid_record_that_reads_back_the_same(obj: dict[str, Any]) -> None:
    for cls in RECORDS.values():
        rec, _ = cls.read(obj)
        again, wrong = cls.read(orjson.loads(orjson.dumps(rec.to_json())))
        assert again == rec and wrong == []
