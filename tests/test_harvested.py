"""The harvested queue (SPEC §6.1): selection order, the claim lifecycle, field preservation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from evolve.work.harvested import HarvestedQueue
from evolve.work.item import ClaimLost


def _q(tmp_path: Path, *lines: dict | bytes, repo: str = "myrepo", quality: bool = False) -> HarvestedQueue:
    p = tmp_path / "next-work.jsonl"
    p.write_bytes(b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines))
    return HarvestedQueue(p, repo_names=(repo,), quality=quality)


def _item(title: str, **kw) -> dict:
    return {"title": title, "description": "", "type": "task", "severity": "medium", "source": "council-finding",
            **kw}


def _entry(*items: dict, **kw) -> dict:
    return {"source_epic": kw.pop("epic", "ep"), "timestamp": "2026-01-01T00:00:00Z", "items": list(items), **kw}


def test_ordering_scope_then_kind_then_severity_then_file_order(tmp_path: Path) -> None:
    q = _q(tmp_path,
           _entry(_item("unscoped-high", severity="high"),
                  _item("star-low", target_repo="*", severity="low"),
                  _item("mine-docs-high", target_repo="org/myrepo", type="docs", severity="high"),
                  _item("mine-bug-low", target_repo="myrepo", type="bug", severity="low"),
                  _item("mine-bug-low-2", target_repo="myrepo", type="bug", severity="low"),
                  _item("other-repo", target_repo="elsewhere", severity="high"),
                  _item("mine-feature-high", target_repo="myrepo", type="feature", severity="high")))
    assert [w.title for w in q.candidates()] == [
        "mine-feature-high", "mine-bug-low", "mine-bug-low-2", "mine-docs-high", "star-low", "unscoped-high"]


def test_quality_mode_puts_high_then_medium_first(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("low", target_repo="myrepo", severity="low"), _item("med", severity="medium"),
                            _item("high", target_repo="*", severity="high", type="docs")), quality=True)
    assert [w.title for w in q.candidates()] == ["high", "med", "low"]


@pytest.mark.parametrize("fields", [
    {"consumed": True}, {"claim_status": "in_progress"}, {"claim_status": "consumed"}, {"status": "proposed"},
    {"status": "blocked"}, {"requires": ["human-review"]}, {"disposition": "defer:too big"}, {"title": ""},
])
def test_unselectable_items(tmp_path: Path, fields: dict) -> None:
    q = _q(tmp_path, _entry({**_item("x"), **fields}))
    assert q.candidates() == []


def test_selectable_items_with_explicit_defaults(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("x", claim_status="available", status="ready", requires=[])))
    assert [w.title for w in q.candidates()] == ["x"]


def test_consumed_entry_hides_its_items(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("x"), consumed=True))
    assert q.candidates() == []


def test_lifecycle_claim_finalize_release_keeps_unknown_fields(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a", custom={"k": 1}), _item("b"), epic="E", entry_extra="keep"), b"garbage line")
    a, b = q.candidates()
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    assert [w.title for w in q.candidates()] == ["b"]
    with pytest.raises(ClaimLost):
        q.claim(a, "evolve:cycle-2", "t")
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:02Z")
    q.claim(b, "evolve:cycle-2", "t2")
    q.release(b, "evolve:cycle-2", "t3", "failed")
    lines = q.path.read_bytes().splitlines()
    assert lines[1] == b"garbage line"
    e = orjson.loads(lines[0])
    assert e["entry_extra"] == "keep"
    ia, ib = e["items"]
    assert ia["custom"] == {"k": 1}
    assert (ia["consumed"], ia["claim_status"], ia["consumed_by"], ia["consumed_at"]) == (
        True, "consumed", "evolve:cycle-1", "2026-01-01T00:00:02Z")
    assert ia["claimed_by"] == "evolve:cycle-1"  # the schema keeps the claimer on finalize
    assert (ib["claim_status"], ib["claimed_by"], ib["claimed_at"], ib["failed_at"], ib["consumed"]) == (
        "available", None, None, "t3", False)
    assert e.get("consumed") is not True  # not every item is consumed yet
    q.claim(b, "evolve:cycle-3", "t4")
    q.finalize(b, "evolve:cycle-3", "t5")
    e = orjson.loads(q.path.read_bytes().splitlines()[0])
    assert e["consumed"] is True and e["claim_status"] == "consumed"


def test_finalize_by_another_claimer_is_a_no_op(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a")))
    (a,) = q.candidates()
    q.claim(a, "evolve:cycle-1", "t")
    before = q.path.read_bytes()
    q.finalize(a, "evolve:cycle-9", "t")
    assert q.path.read_bytes() == before


def test_park_blocks_the_item(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a")))
    (a,) = q.candidates()
    q.park(a, "t", "3 failed attempts")
    item = orjson.loads(q.path.read_bytes())["items"][0]
    assert item["status"] == "blocked" and item["blocked_note"] == "3 failed attempts"
    assert q.candidates() == []


def test_rewrite_keeps_the_file_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a")))
    os.chmod(q.path, 0o640)
    (a,) = q.candidates()
    q.claim(a, "c", "t")
    assert (os.stat(q.path).st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["next-work.jsonl"]


def test_concurrent_appender_loses_nothing(tmp_path: Path) -> None:
    """Another process appends lines while we claim and finalize: every appended line survives."""
    q = _q(tmp_path, _entry(*[_item(f"i{n}") for n in range(30)]))
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os, orjson, time
for n in range(300):
    fd = os.open({str(q.path)!r}, os.O_WRONLY | os.O_APPEND)
    os.write(fd, orjson.dumps({{"source_epic": "bg", "n": n, "items": []}}) + b"\\n")
    os.close(fd)
    time.sleep(0.001)
"""])
    for n in range(30):
        item = next(w for w in q.candidates() if w.title == f"i{n}")
        q.claim(item, f"c{n}", "t")
        q.finalize(item, f"c{n}", "t")
    writer.wait(timeout=60)
    lines = [orjson.loads(x) for x in q.path.read_bytes().splitlines()]
    seen = sorted(e["n"] for e in lines if e.get("source_epic") == "bg")
    assert seen == list(range(300))
    main = [e for e in lines if e.get("source_epic") == "ep"]
    assert len(main) == 1 and all(i["claim_status"] == "consumed" for i in main[0]["items"])
