"""``session-state.json`` (docs/DESIGN.md §2): merge-save, corrupt and wrongly-typed files, read-only loads, jq."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from evolve.store import session_state as ss
from evolve.store.ledger import Ledger

SPEC_OWNED = [
    "context_streak",
    "parked_work",
    "idle_streak",
    "generator_empty_streak",
    "mode_repeat_streak",
    "last_result",
    "last_mode",
    "last_selected_source",
    "claimed_work",
    "agent_session",
    "consecutive_failures",
    "breaker_open_until",
    "last_logged_cycle",
    "fire",
    "updated_at",
]
JQ = shutil.which("jq") or ("/usr/bin/jq" if os.path.exists("/usr/bin/jq") else None)


class Dir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "session-state.json"
        self.ledger = Ledger(root / "cycle-history.jsonl")

    def write_ledger(self, *entries: dict[str, Any] | bytes) -> None:
        with open(self.ledger.path, "ab") as fh:
            for e in entries:
                fh.write(e if isinstance(e, bytes) else orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE))

    def disk(self) -> dict[str, Any]:
        return orjson.loads(self.state.read_bytes())

    def listing(self) -> dict[str, tuple[bytes, int]]:
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in self.root.iterdir()}

    def asides(self, label: str) -> list[Path]:
        pat = re.compile(rf"^session-state\.json\.{label}-\d{{8}}T\d{{6}}Z(\.\d+)?$")
        return sorted(p for p in self.root.iterdir() if pat.match(p.name))


@pytest.fixture
def d(tmp_path: Path) -> Dir:
    root = tmp_path / ".agents" / "evolve"
    root.mkdir(parents=True)
    return Dir(root)


def e(cycle: int, result: str, target: str = "work-1", **kw: Any) -> dict[str, Any]:
    return {"cycle": cycle, "result": result, "timestamp": "2026-11-01T00:00:00Z", "target": target,
            "selected_source": "idle" if target == "idle" else "harvested", "mode": f"m{cycle}", **kw}


# -- merge-save ------------------------------------------------------------------------------


def test_save_writes_every_owned_field(d: Dir) -> None:
    ss.save(d.state, ss.SessionState())
    disk = d.disk()
    for name in SPEC_OWNED:
        assert name in disk, name
    assert disk["context_streak"] == 0 and disk["parked_work"] == [] and disk["fire"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", disk["updated_at"])


def test_roundtrip_owned_fields(d: Dir) -> None:
    st = ss.SessionState(
        context_streak=1,
        parked_work=["a", "b"],
        idle_streak=2,
        last_result="scout",
        claimed_work={"ref": "r", "source": "harvested", "claimed_by": "evolve:x", "claimed_at": "t"},
        agent_session={"id": "s1", "ended_heavy": False},
        fire={"pid": 1, "pgid": 1, "agent_pgid": None, "started_at": "t", "cycle": 3},
        last_logged_cycle=9,
    )
    ss.save(d.state, st)
    loaded = ss.load(d.state, d.ledger)
    assert loaded.warnings == [] and loaded.moved_to is None
    for name in SPEC_OWNED:
        assert getattr(loaded.state, name) == getattr(st, name), name


def test_unknown_keys_preserved_on_save(d: Dir) -> None:
    d.state.write_bytes(orjson.dumps({"context_streak": 1, "agentops_key": {"x": [1, 2]}, "version": 3}))
    st = ss.load(d.state, d.ledger).state
    assert st.extra == {"agentops_key": {"x": [1, 2]}, "version": 3}
    st.context_streak = 2
    ss.save(d.state, st)
    disk = d.disk()
    assert disk["agentops_key"] == {"x": [1, 2]} and disk["version"] == 3
    assert disk["context_streak"] == 2


def test_unknown_keys_written_after_load_win(d: Dir) -> None:
    d.state.write_bytes(orjson.dumps({"context_streak": 1, "shared": "old", "version": 3}))
    st = ss.load(d.state, d.ledger).state
    # another tool rewrites the file while we hold our copy
    other = d.disk()
    other.update(shared="new", added_later={"by": "halt-check.sh"}, context_streak=7)
    d.state.write_bytes(orjson.dumps(other))
    st.context_streak = 2
    st.parked_work = ["p1"]
    ss.save(d.state, st)
    disk = d.disk()
    assert disk["shared"] == "new"  # the file's current value wins for keys evolve does not own
    assert disk["added_later"] == {"by": "halt-check.sh"}
    assert disk["version"] == 3
    assert disk["context_streak"] == 2  # evolve's own fields are evolve's
    assert disk["parked_work"] == ["p1"]


def test_save_over_corrupt_file_keeps_loaded_unknown_keys(d: Dir) -> None:
    d.state.write_bytes(orjson.dumps({"mine": 1}))
    st = ss.load(d.state, d.ledger).state
    d.state.write_bytes(b"{not json")
    ss.save(d.state, st)
    assert d.disk()["mine"] == 1


def test_save_is_atomic_no_temp_left(d: Dir) -> None:
    ss.save(d.state, ss.SessionState())
    ss.save(d.state, ss.SessionState(context_streak=1))
    assert sorted(p.name for p in d.root.iterdir()) == ["session-state.json"]


# -- missing, corrupt, wrongly typed -------------------------------------------------------


def test_missing_file_builds_from_ledger_and_writes_nothing(d: Dir) -> None:
    d.write_ledger(e(1, "improved"), e(2, "unchanged", "idle"))
    before = d.listing()
    r = ss.load(d.state, d.ledger)
    assert r.warnings == [] and r.moved_to is None
    assert r.state.last_logged_cycle == 2 and r.state.last_result == "unchanged" and r.state.idle_streak == 1
    assert d.listing() == before


CORRUPT = [
    b"\x00\xff\xfe garbage \x80",
    b"not json",
    b"[1, 2, 3]",
    b'["context_streak", 3]',
    b"",
    b'{"context_streak": 1,',
    b"null",
    b'"a string"',
    b"42",
]


@pytest.mark.parametrize("raw", CORRUPT)
def test_corrupt_file_moved_aside_and_rebuilt_from_ledger(d: Dir, raw: bytes) -> None:
    d.write_ledger(
        e(1, "improved"),
        e(2, "scout", context_heavy=True, disposition="context-too-heavy"),
        b"garbage line\n",
        e(3, "harvested", context_heavy=True),
        e(4, "unchanged", "idle"),
        e(5, "unchanged", "idle", context_heavy=False),
        b'{"cycle": 6, "torn',
    )
    d.state.write_bytes(raw)
    r = ss.load(d.state, d.ledger)
    (aside,) = d.asides("corrupt")
    assert aside.read_bytes() == raw
    assert r.moved_to == aside
    assert not d.state.exists()  # moved, not copied
    assert any("corrupt" in w for w in r.warnings)
    s = r.state
    assert s.last_logged_cycle == 5
    assert s.last_result == "unchanged"
    assert s.last_mode == "m5"
    assert s.last_selected_source == "idle"
    assert s.idle_streak == 2
    assert s.context_streak == 2
    assert s.parked_work == [] and s.fire is None and s.extra == {}
    ss.save(d.state, s)
    assert d.disk()["last_logged_cycle"] == 5
    assert d.asides("corrupt") == [aside]


def test_corrupt_twice_keeps_both_asides(d: Dir) -> None:
    d.state.write_bytes(b"first")
    ss.load(d.state, d.ledger)
    d.state.write_bytes(b"second")
    ss.load(d.state, d.ledger)
    assert sorted(p.read_bytes() for p in d.asides("corrupt")) == [b"first", b"second"]


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ([], {"last_logged_cycle": 0, "last_result": None, "idle_streak": 0, "context_streak": 0}),
        (
            [e(1, "scout", context_heavy=True), e(2, "scout", context_heavy=True)],
            {"last_logged_cycle": 2, "last_result": "scout", "idle_streak": 0, "context_streak": 2},
        ),
        (
            [e(1, "scout", context_heavy=True), e(2, "context-handoff"), e(3, "scout", context_heavy=True)],
            {"last_logged_cycle": 3, "context_streak": 1},
        ),
        (
            [e(1, "scout", context_heavy=True), e(2, "improved", context_heavy=True)],
            {"last_logged_cycle": 2, "last_result": "improved", "context_streak": 0},
        ),
        (
            [e(1, "improved"), e(2, "unchanged", "idle"), e(3, "unchanged", "idle"), e(4, "unchanged", "idle")],
            {"idle_streak": 3, "context_streak": 0},
        ),
        (
            # an improved downgraded to unchanged has a real target: not idle
            [e(1, "unchanged", "idle"), e(2, "unchanged", "work-2", downgraded_from="improved")],
            {"idle_streak": 0},
        ),
        (
            # the newest line carries no cycle: last_logged_cycle comes from the newest that does
            [e(1, "unchanged", "idle"), {"note": "legacy line without cycle"}],
            {"last_logged_cycle": 1, "idle_streak": 1},
        ),
    ],
)
def test_from_ledger_derivation(d: Dir, tail: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    d.write_ledger(*tail)
    st = ss.from_ledger(d.ledger)
    for k, v in expected.items():
        assert getattr(st, k) == v, k


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("context_streak", "3"),
        ("context_streak", True),
        ("context_streak", 2.0),
        ("context_streak", None),
        ("idle_streak", False),
        ("consecutive_failures", [1]),
        ("last_logged_cycle", "12"),
        ("parked_work", "ref-a"),
        ("parked_work", {"a": 1}),
        ("last_result", 5),
        ("last_result", True),
        ("claimed_work", "ref"),
        ("fire", []),
        ("agent_session", 1),
        ("breaker_open_until", 1700000000),
    ],
)
def test_wrong_type_reset_and_original_saved_aside(d: Dir, field: str, bad: Any) -> None:
    good = {"context_streak": 1, "parked_work": ["x"], "last_result": "scout", "last_logged_cycle": 4,
            "unknown": {"keep": True}}
    obj = {**good, field: bad}
    raw = orjson.dumps(obj, option=orjson.OPT_INDENT_2)
    d.state.write_bytes(raw)
    r = ss.load(d.state, d.ledger)
    default = getattr(ss.SessionState(), field)
    assert getattr(r.state, field) == default
    for k, v in good.items():
        if k != field and k != "unknown":
            assert getattr(r.state, k) == v, k
    assert r.state.extra == {"unknown": {"keep": True}}
    assert any(field in w for w in r.warnings)
    (aside,) = d.asides("invalid")
    assert aside.read_bytes() == raw
    assert d.state.read_bytes() == raw  # load does not rewrite; the next save does
    ss.save(d.state, r.state)
    disk = d.disk()
    assert disk[field] == default
    assert disk["unknown"] == {"keep": True}
    assert d.asides("corrupt") == []


def test_valid_file_loads_with_no_warnings_and_no_asides(d: Dir) -> None:
    d.write_ledger(e(1, "improved"), e(2, "improved"))
    d.state.write_bytes(orjson.dumps({"context_streak": 1, "last_logged_cycle": 0}))
    r = ss.load(d.state, d.ledger)
    assert r.warnings == []
    assert r.state.last_logged_cycle == 2  # filled from the ledger when the file says 0
    assert sorted(p.name for p in d.root.iterdir()) == ["cycle-history.jsonl", "session-state.json"]


# -- read-only -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [None, b"garbage\xff", b"[]", b"", orjson.dumps({"context_streak": "3", "fire": []}),
     orjson.dumps({"context_streak": 1, "x": 1})],
)
def test_readonly_load_never_writes_or_moves(d: Dir, raw: bytes | None) -> None:
    d.write_ledger(e(1, "improved"), e(2, "scout", context_heavy=True), b'{"torn')
    if raw is not None:
        d.state.write_bytes(raw)
    before = d.listing()
    st = ss.load_readonly(d.state, d.ledger)
    r = ss.load(d.state, d.ledger, readonly=True)
    assert d.listing() == before
    assert r.moved_to is None
    assert st.last_logged_cycle == 2
    if raw in (b"garbage\xff", b"[]", b""):
        assert st.context_streak == 1 and r.warnings
    if raw is not None and b'"3"' in raw:
        assert st.context_streak == 0 and st.fire is None and r.warnings


# -- jq compatibility (the agentops one-liners) -------------------------------------------


def jq(args: list[str], path: Path) -> str:
    assert JQ is not None
    return subprocess.run([JQ, *args, str(path)], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(JQ is None, reason="jq is not installed (needed to check the agentops jq one-liners)")
def test_saved_file_readable_by_jq(d: Dir) -> None:
    ss.save(d.state, ss.SessionState())
    assert jq(["-r", ".context_streak // 0"], d.state) == "0"
    assert jq(["-c", ".parked_work // []"], d.state) == "[]"
    st = ss.load(d.state, d.ledger).state
    st.context_streak = 3
    st.parked_work = ["harvested:e1/alpha", "beads:bd-12"]
    ss.save(d.state, st)
    assert jq(["-r", ".context_streak // 0"], d.state) == "3"
    assert jq(["-c", ".parked_work // []"], d.state) == '["harvested:e1/alpha","beads:bd-12"]'
    assert jq(["-r", ".fire"], d.state) == "null"
