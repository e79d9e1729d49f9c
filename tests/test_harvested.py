"""The harvested queue (docs/DESIGN.md §6.1): selection order, the claim lifecycle, field preservation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from support import live

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
    assert lines[1] == b"garbage line"  # every other line stays where it was
    assert orjson.loads(lines[0])["superseded"] is True  # the entry outgrew its line: moved to the end
    (e,) = live(q.path)
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
    (e,) = live(q.path)
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
    item = live(q.path)[0]["items"][0]
    assert item["status"] == "blocked" and item["blocked_note"] == "3 failed attempts"
    assert q.candidates() == []


def test_rewrite_keeps_the_file_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a")))
    os.chmod(q.path, 0o640)
    (a,) = q.candidates()
    q.claim(a, "c", "t")
    assert (os.stat(q.path).st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".next-work.jsonl.lifecycle", ".next-work.jsonl.redo", "next-work.jsonl"]
    assert orjson.loads((tmp_path / ".next-work.jsonl.redo").read_bytes()) == {"state": "done"}
    for side in (".next-work.jsonl.redo", ".next-work.jsonl.lifecycle"):  # readable as the queue is
        assert (os.stat(tmp_path / side).st_mode & 0o777) == 0o640, side


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


# -- the in-memory index: re-checked against the file at every call ---------------------------------


def _fresh(q: HarvestedQueue) -> list[str]:
    """What a full parse of the file gives now (a new queue object has no index)."""
    return [w.ref for w in HarvestedQueue(q.path, repo_names=q.repo_names, quality=q.quality).candidates()]


def _count(monkeypatch: pytest.MonkeyPatch, q: HarvestedQueue, name: str) -> list[int]:
    calls = [0]
    fn = getattr(q, name)

    def counted(*a, **kw):
        calls[0] += 1
        return fn(*a, **kw)

    monkeypatch.setattr(q, name, counted)
    return calls


def _settle(q: HarvestedQueue) -> None:
    """Make the file's timestamps old, as between two real selections (no racy re-read)."""
    past = os.stat(q.path).st_mtime_ns - 10**10
    os.utime(q.path, ns=(past, past))


def test_unchanged_file_reuses_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _q(tmp_path, _entry(_item("a"), _item("b")))
    _settle(q)
    first = q.candidates()
    rebuilds, rereads = _count(monkeypatch, q, "_rebuild"), _count(monkeypatch, q, "_same_lines")
    for _ in range(3):
        assert q.candidates() == first
    assert rebuilds == [0] and rereads == [0]


def test_external_append_is_parsed_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _q(tmp_path, _entry(_item("a", severity="low")), b"garbage")
    _settle(q)
    assert [w.title for w in q.candidates()] == ["a"] and q.malformed == 1
    rebuilds, appends = _count(monkeypatch, q, "_rebuild"), _count(monkeypatch, q, "_append")
    rereads = _count(monkeypatch, q, "_same_lines")
    with open(q.path, "ab") as fh:
        fh.write(orjson.dumps(_entry(_item("b", severity="high"))) + b"\n\n" + b"more garbage\n")
    assert [w.title for w in q.candidates()] == ["b", "a"]  # ranked in, not just appended
    assert q.malformed == 2
    assert (rebuilds, appends, rereads) == ([0], [1], [0])  # only the appended bytes were read
    assert [w.ref for w in q.candidates()] == _fresh(q)


def test_append_right_after_a_read_is_checked_in_full(tmp_path: Path) -> None:
    """The file was written just before we read it: the append path compares every indexed line."""
    q = _q(tmp_path, _entry(_item("a", description="x" * 6000)))  # the title is not in the last 4 KiB
    assert [w.title for w in q.candidates()] == ["a"]
    assert q._racy
    with open(q.path, "r+b") as fh:  # same size, earlier bytes: "a" becomes "z" …
        data = fh.read()
        fh.seek(0)
        fh.write(data.replace(b'"title":"a"', b'"title":"z"'))
    with open(q.path, "ab") as fh:  # … and a line appended, in the same timestamp tick for all we know
        fh.write(orjson.dumps(_entry(_item("b"))) + b"\n")
    assert [w.title for w in q.candidates()] == ["z", "b"]


def test_external_atomic_rewrite_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _q(tmp_path, _entry(_item("a"), _item("b")))
    _settle(q)
    assert [w.title for w in q.candidates()] == ["a", "b"]
    rebuilds = _count(monkeypatch, q, "_rebuild")
    tmp = tmp_path / "new.jsonl"
    tmp.write_bytes(orjson.dumps(_entry(_item("a", consumed=True), _item("b"), _item("c"))) + b"\n")
    os.replace(tmp, q.path)  # a new inode, as other tools rewrite the queue
    assert [w.title for w in q.candidates()] == ["b", "c"]
    assert rebuilds == [1]


def test_in_place_same_size_edit_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _q(tmp_path, _entry(_item("aaa"), _item("bbb")), _entry(_item("ccc")))
    _settle(q)
    before = os.stat(q.path)
    assert [w.title for w in q.candidates()] == ["aaa", "bbb", "ccc"]
    rebuilds = _count(monkeypatch, q, "_rebuild")
    with open(q.path, "r+b") as fh:
        data = fh.read()
        fh.seek(0)
        fh.write(data.replace(b'"title":"aaa"', b'"title":"zzz"'))
    os.utime(q.path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # a different mtime
    after = os.stat(q.path)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert [w.title for w in q.candidates()] == ["zzz", "bbb", "ccc"]
    assert rebuilds == [1]


def test_racy_stat_is_verified_by_content(tmp_path: Path) -> None:
    """A write in the same timestamp tick as our read can leave every stat field as it was."""
    q = _q(tmp_path, _entry(_item("aaa")))
    assert [w.title for w in q.candidates()] == ["aaa"]
    assert q._racy  # written a moment before the read
    with open(q.path, "r+b") as fh:
        data = fh.read()
        fh.seek(0)
        fh.write(data.replace(b'"title":"aaa"', b'"title":"zzz"'))
    st = os.stat(q.path)
    q._sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # as if the write kept the old stat
    assert [w.title for w in q.candidates()] == ["zzz"]


def test_grown_file_with_changed_tail_rebuilds(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a")), _entry(_item("b")))
    _settle(q)
    assert [w.title for w in q.candidates()] == ["a", "b"]
    with open(q.path, "r+b") as fh:  # same inode, rewritten in place and longer
        fh.write(orjson.dumps(_entry(_item("a"))) + b"\n" + orjson.dumps(_entry(_item("bb"), _item("c"))) + b"\n")
    assert [w.title for w in q.candidates()] == ["a", "bb", "c"]


def test_partial_last_line_completed_by_an_append(tmp_path: Path) -> None:
    line = orjson.dumps(_entry(_item("b")))
    q = _q(tmp_path, _entry(_item("a")))
    with open(q.path, "ab") as fh:
        fh.write(line[:20])  # a writer caught mid-line
    _settle(q)
    assert [w.title for w in q.candidates()] == ["a"] and q.malformed == 1
    with open(q.path, "ab") as fh:
        fh.write(line[20:] + b"\n")
    assert [w.title for w in q.candidates()] == ["a", "b"] and q.malformed == 0


def test_file_removed_and_recreated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evolve.work import harvested

    monkeypatch.setattr(harvested, "REAPPEAR_S", 0.05)  # (how long a read waits for a save vim's way)
    q = _q(tmp_path, _entry(_item("a")))
    assert len(q.candidates()) == 1
    q.path.unlink()
    assert q.candidates() == []
    q.path.write_bytes(orjson.dumps(_entry(_item("b"))) + b"\n")
    assert [w.title for w in q.candidates()] == ["b"]


def test_rewrite_updates_the_index_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _q(tmp_path, *[_entry(_item(f"i{n}", severity=("high", "low")[n % 2]), epic=f"e{n}") for n in range(8)])
    _settle(q)
    q.candidates()
    rebuilds = _count(monkeypatch, q, "_rebuild")
    for n in range(3):
        top = q.candidates()[0]
        q.claim(top, f"c{n}", "t")
        assert top.ref not in [w.ref for w in q.candidates()]
        q.finalize(top, f"c{n}", "t")
        assert [w.ref for w in q.candidates()] == _fresh(q)
    assert rebuilds == [0]


def test_claim_after_an_external_append_keeps_it(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a")))
    (a,) = q.candidates()
    with open(q.path, "ab") as fh:
        fh.write(orjson.dumps(_entry(_item("b"), epic="other")) + b"\n")
    q.claim(a, "c", "t")
    lines = [orjson.loads(x) for x in q.path.read_bytes().splitlines()]
    assert [e.get("source_epic") for e in lines] == [None, "other", "ep"]  # a tombstone; the claim moved on
    assert [e["source_epic"] for e in live(q.path)] == ["other", "ep"]
    assert [w.title for w in q.candidates()] == ["b"] == [w.title for w in HarvestedQueue(q.path).candidates()]


def test_same_ref_on_two_lines_claims_the_first_selectable(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("dup", consumed=True)), _entry(_item("dup")), _entry(_item("dup")))
    first, second = q.candidates()
    assert first.ref == second.ref
    q.claim(first, "c1", "t")
    q.claim(second, "c2", "t")
    items = [e["items"][0] for e in live(q.path)]
    assert [i.get("claimed_by") for i in items] == [None, "c1", "c2"]
    q.finalize(second, "c2", "t")
    q.release(first, "c1", "t", "failed")
    items = [e["items"][0] for e in live(q.path)]  # (the claims' slack took these edits in place)
    assert [i.get("claim_status") for i in items] == [None, "available", "consumed"]
    assert [w.ref for w in q.candidates()] == _fresh(q) == [first.ref]


def test_random_operations_keep_the_index_equal_to_a_full_parse(tmp_path: Path) -> None:
    import random

    rnd = random.Random(7)
    q = _q(tmp_path, *[_entry(_item(f"i{n}", severity=rnd.choice(["high", "low"]), target_repo=rnd.choice(
        [None, "*", "myrepo", "elsewhere"])), _item(f"j{n}"), epic=f"e{n}") for n in range(6)], b"{broken")
    claimed: dict[str, object] = {}
    for step in range(60):
        op = rnd.randrange(7)
        cands = q.candidates()
        if op == 0 and cands:
            w = rnd.choice(cands)
            q.claim(w, f"c{step}", "t")
            claimed[f"c{step}"] = w
        elif op == 1 and claimed:
            who = rnd.choice(sorted(claimed))
            q.finalize(claimed.pop(who), who, "t")  # type: ignore[arg-type]
        elif op == 2 and claimed:
            who = rnd.choice(sorted(claimed))
            q.release(claimed.pop(who), who, "t", "failed")  # type: ignore[arg-type]
        elif op == 3 and cands:
            q.park(rnd.choice(cands), "t", "budget")
        elif op == 4 and cands:
            q.annotate(rnd.choice(cands), "t", disposition=rnd.choice(["defer:later", "keep"]))
        elif op == 5:
            with open(q.path, "ab") as fh:  # another process appends
                fh.write(orjson.dumps(_entry(_item(f"x{step}", severity="high"), epic=f"x{step}")) + b"\n")
        else:
            lines = q.path.read_bytes().splitlines()  # another tool rewrites atomically
            tmp = tmp_path / "other.jsonl"
            tmp.write_bytes(b"\n".join(lines[1:] + lines[:1]) + b"\n")
            os.replace(tmp, q.path)
        if rnd.random() < 0.5:
            _settle(q)
        assert [w.ref for w in q.candidates()] == _fresh(q), step
        assert q.malformed == 1


def test_concurrent_appender_and_rewrites_keep_the_index_exact(tmp_path: Path) -> None:
    """Appended items (selectable ones) show up while we claim and finalize; nothing is lost."""
    q = _q(tmp_path, _entry(*[_item(f"i{n}", severity="high") for n in range(20)]))
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os, orjson, time
for n in range(200):
    fd = os.open({str(q.path)!r}, os.O_WRONLY | os.O_APPEND)
    os.write(fd, orjson.dumps({{"source_epic": "bg", "items": [{{"title": f"bg{{n}}", "severity": "low"}}]}}) + b"\\n")
    os.close(fd)
    time.sleep(0.001)
"""])
    for n in range(20):
        item = next(w for w in q.candidates() if w.title == f"i{n}")
        q.claim(item, f"c{n}", "t")
        q.finalize(item, f"c{n}", "t")
    writer.wait(timeout=60)
    titles = [w.title for w in q.candidates()]
    assert sorted(titles) == sorted(f"bg{n}" for n in range(200))
    assert [w.ref for w in q.candidates()] == _fresh(q)


def test_rewrite_never_writes_over_an_in_place_edit_the_tail_check_missed(tmp_path: Path) -> None:
    """An append is taken on the last 4 KiB alone; before writing the file back, every line is compared."""
    q = _q(tmp_path, _entry(_item("aaa", description="x" * 6000), epic="A"), _entry(_item("b"), epic="B"))
    _settle(q)
    assert [w.title for w in q.candidates()] == ["aaa", "b"]
    with open(q.path, "r+b") as fh:  # same length, more than 4 KiB before the end
        data = fh.read()
        fh.seek(0)
        fh.write(data.replace(b'"title":"aaa"', b'"title":"zzz"'))
    with open(q.path, "ab") as fh:
        fh.write(orjson.dumps(_entry(_item("c"), epic="C")) + b"\n")
    _settle(q)
    b = next(w for w in q.candidates() if w.title == "b")
    q.claim(b, "c1", "t")
    lines = live(q.path)
    assert [e["items"][0]["title"] for e in lines] == ["zzz", "c", "b"]  # the edit survived; "b" moved on
    assert lines[2]["items"][0]["claimed_by"] == "c1"
    assert [w.title for w in q.candidates()] == ["zzz", "c"] == [w.title for w in HarvestedQueue(q.path).candidates()]


def test_gc_paused_restores_the_collector_and_leaves_a_freeze_alone() -> None:
    import gc

    from evolve.store.jsonl import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        keep = [[n] for n in range(20_000)]  # many new objects: promoted to the oldest generation
    assert gc.isenabled() and gc.get_count()[0] < 1_000 and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
    gc.freeze()  # someone else's frozen objects must stay frozen
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            keep += [[n] for n in range(20_000)]
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


# -- streaming: the index holds positions and rank keys, never the file ------------------------------


def test_memory_is_a_few_bytes_per_line_not_the_file(tmp_path: Path) -> None:
    """Selecting, claiming and finalizing in a ~17 MB queue allocates a small fraction of the file
    (the old index held every line: more than the file's size)."""
    import tracemalloc

    pad = "p" * 600
    lines = [_entry(*[_item(f"t{n}-{k}", description=pad, severity=("high", "low")[k % 2]) for k in range(10)],
                    epic=f"e{n}") for n in range(2400)]
    q = _q(tmp_path, *lines)
    size = q.path.stat().st_size
    assert size > 16_000_000
    tracemalloc.start()
    try:
        cands = q.candidates()
        top = cands[0]
        q.claim(top, "c", "t")
        q.finalize(top, "c", "t")
        assert len(q.candidates()) == len(cands) - 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 5, (peak, size)
    assert [w.ref for w in q.candidates()][:50] == _fresh(q)[:50]


def test_rewrite_keeps_blank_lines_and_every_other_byte(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a"), epic="A"), b"", b"  ", _entry(_item("b"), epic="B"), b"{torn")
    before = q.path.read_bytes()
    (_a, b) = q.candidates()
    q.claim(b, "c", "t")
    after = q.path.read_bytes().split(b"\n")
    assert after[:3] == before.split(b"\n")[:3] and after[4] == b"{torn"  # (ended by a newline)
    assert len(after[3]) == len(before.split(b"\n")[3]) and orjson.loads(after[3])["superseded"] is True
    assert orjson.loads(after[5])["items"][0]["claimed_by"] == "c" and after[6:] == [b""]
    assert [w.title for w in q.candidates()] == ["a"] == [w.title for w in HarvestedQueue(q.path).candidates()]


def test_lines_after_a_changed_line_move_with_it(tmp_path: Path) -> None:
    """A rewrite changes line lengths; the items after it are still found where they now are."""
    q = _q(tmp_path, *[_entry(_item(f"i{n}"), epic=f"e{n}") for n in range(6)])
    for n in range(6):
        item = next(w for w in q.candidates() if w.title == f"i{n}")
        q.claim(item, f"claimer-with-a-long-name-{n}", "2026-01-01T00:00:00Z")  # each line grows
        q.annotate(next(w for w in HarvestedQueue(q.path).candidates()) if n < 5 else item, "t", note="x" * n)
    q.finalize(item, "claimer-with-a-long-name-5", "t")
    lines = {e["items"][0]["title"]: e for e in live(q.path)}
    assert sorted(lines) == [f"i{n}" for n in range(6)]
    assert [lines[f"i{n}"]["items"][0]["claimed_by"] for n in range(6)] == [
        f"claimer-with-a-long-name-{n}" for n in range(6)]
    assert lines["i5"]["consumed"] is True
    assert list(q.candidates()) == [] == list(HarvestedQueue(q.path).candidates())


def test_claim_finds_the_item_when_another_tool_reordered_the_file(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("a"), epic="A"), _entry(_item("b"), epic="B"), _entry(_item("c"), epic="C"))
    b = next(w for w in q.candidates() if w.title == "b")
    lines = q.path.read_bytes().splitlines()
    tmp = tmp_path / "other.jsonl"
    tmp.write_bytes(b"\n".join([lines[2], lines[0], lines[1]]) + b"\n")  # "b" is now on the last line
    os.replace(tmp, q.path)
    q.claim(b, "c1", "t")
    q.finalize(b, "c1", "t")
    entries = live(q.path)
    assert [(e["source_epic"], e.get("consumed")) for e in entries] == [("C", None), ("A", None), ("B", True)]


def test_a_view_reads_the_file_it_was_made_from(tmp_path: Path) -> None:
    """Items are parsed when read; a file replaced meanwhile does not change what the view shows."""
    q = _q(tmp_path, *[_entry(_item(f"i{n}"), epic=f"e{n}") for n in range(5)])
    view = q.candidates()
    tmp = tmp_path / "other.jsonl"
    tmp.write_bytes(orjson.dumps(_entry(_item("other"))) + b"\n")
    os.replace(tmp, q.path)
    assert [w.title for w in view] == [f"i{n}" for n in range(5)]
    assert view[-1].title == "i4" and [w.title for w in view[1:3]] == ["i1", "i2"]
    assert [w.title for w in q.candidates()] == ["other"]


def test_an_item_edited_in_place_after_the_read_is_never_claimed(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("aaaa")))
    view = q.candidates()
    q.path.write_bytes(b"x" * len(q.path.read_bytes()))  # same inode, rewritten in place
    (stale,) = view
    assert stale.title == "" and stale.ref.startswith("changed-on-disk:")
    with pytest.raises(ClaimLost):
        q.claim(stale, "c", "t")
    assert q.path.read_bytes().startswith(b"xxxx")


def test_known_keys_streams_open_and_consumed_items(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("Fix the Parser!"), _item("b", dedup_key="k1", consumed=True)), b"{torn")
    wanted = {"title:fix the parser", "dedup:k1", "dedup:k2", "title:other"}
    assert q.known_keys(wanted) == {"title:fix the parser", "dedup:k1"}
    assert q.known_keys(set()) == set()
    q.path.unlink()
    assert q.known_keys(wanted) == set()


def test_candidates_since_a_line(tmp_path: Path) -> None:
    q = _q(tmp_path, _entry(_item("old", severity="low")))
    at = len(q.candidates()) and q.lines
    q.append_entry(_entry(_item("new1"), _item("new2", severity="high")))
    assert [w.title for w in q.candidates(since_line=at)] == ["new2", "new1"]
    assert [w.title for w in q.candidates()] == ["new2", "new1", "old"]


def test_appends_between_edits_stay_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append lands in every edit's window (an appender writing every few ms): the edit goes ahead
    at once (one attempt, nothing retried) and the appended lines stay where they were written."""
    q = _q(tmp_path, _entry(_item("a"), epic="A"))
    (a,) = q.candidates()
    apply = q._apply
    appended: list[int] = []

    def with_an_append(*args, **kw):
        with open(q.path, "ab") as fh:
            fh.write(orjson.dumps(_entry(_item(f"bg{len(appended)}"), epic="BG")) + b"\n")
        appended.append(1)
        return apply(*args, **kw)

    monkeypatch.setattr(q, "_apply", with_an_append)
    q.claim(a, "c", "t")  # moves: the copy goes after bg0
    q.finalize(a, "c", "t")  # fits the copy's slack: in place, before bg1
    assert len(appended) == 2  # one attempt each
    entries = live(q.path)
    assert [e["source_epic"] for e in entries] == ["BG", "A", "BG"]
    assert entries[1]["items"][0]["claim_status"] == "consumed"
    assert [w.title for w in q.candidates()] == ["bg0", "bg1"] == [w.title for w in HarvestedQueue(q.path).candidates()]


# -- held claims (docs/DESIGN.md §6.1): a pending item's claim of its own ------------------------------

HOLD = ("claim_held", "claim_held_at")
T0 = 1767225600.0  # 2026-01-01T00:00:00Z, when the claims below are made


def _held(tmp_path: Path) -> tuple[HarvestedQueue, list]:
    """Three items: "a" claimed and held (its work waits to land), "b" claimed plainly, "c" unclaimed."""
    q = _q(tmp_path, _entry(_item("a", custom={"k": 1}), _item("b"), _item("c"), entry_extra="keep"), b"garbage")
    items = list(q.candidates())
    q.claim(items[0], "evolve:cycle-1", "2026-01-01T00:00:01Z")
    q.claim(items[1], "evolve:cycle-2", "2026-01-01T00:00:02Z")
    q.hold(items[0], "evolve:cycle-1", "2026-01-01T00:00:03Z", "refs/evolve/pending/main (cycle 1)")
    return q, items


@pytest.mark.parametrize("skew", [365 * 86400.0, -365 * 86400.0])  # a year on; a clock a year behind
def test_a_held_claim_is_never_taken_over_however_old(tmp_path: Path, skew: float) -> None:
    """Another reader with evolve's stale-claim rule (another claimer, claims visible for a millisecond):
    the plain claim on "b" is stale to it and taken over; the held claim on "a" never is, selected or
    claimed directly."""
    q, (a, b, _c) = _held(tmp_path)
    other = HarvestedQueue(q.path, repo_names=("myrepo",), claim_visibility_s=0.001, clock=lambda: T0 + skew)
    assert [w.title for w in other.candidates()] == ["b", "c"]
    before = q.path.read_bytes()
    with pytest.raises(ClaimLost):
        other.claim(a, "another-tool", "2027-01-01T00:00:00Z")
    assert q.path.read_bytes() == before  # refused, nothing written
    other.claim(b, "another-tool", "2027-01-01T00:00:00Z")  # the plain claim: taken over, as §6.1 says
    ia, ib, _ = live(q.path)[0]["items"]
    assert (ia["claim_status"], ia["claimed_by"], ia["claimed_at"]) == (
        "in_progress", "evolve:cycle-1", "2026-01-01T00:00:01Z")  # the claim is kept as it was made
    assert (ia["claim_held"], ia["claim_held_at"]) == ("refs/evolve/pending/main (cycle 1)", "2026-01-01T00:00:03Z")
    assert ia["custom"] == {"k": 1} and ib["claimed_by"] == "another-tool"


def test_finalize_and_release_end_the_hold(tmp_path: Path) -> None:
    q, (a, b, _c) = _held(tmp_path)
    q.hold(b, "evolve:cycle-2", "2026-01-01T00:00:04Z", "refs/evolve/pending/main (cycle 2)")
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:05Z")  # its work landed
    q.release(b, "evolve:cycle-2", "2026-01-01T00:00:06Z", "pending")  # its work could not land
    (e,) = live(q.path)
    ia, ib, _ = e["items"]
    assert (ia["consumed"], ia["claim_status"], ia["consumed_by"]) == (True, "consumed", "evolve:cycle-1")
    assert (ib["claim_status"], ib["claimed_by"], ib["consumed"]) == ("available", None, False)
    assert not (set(HOLD) & (set(ia) | set(ib))) and "failed_at" not in ib, (ia, ib)
    assert e["entry_extra"] == "keep" and ia["custom"] == {"k": 1}
    assert q.path.read_bytes().splitlines()[1] == b"garbage"  # every other line where it was
    assert [w.title for w in HarvestedQueue(q.path, repo_names=("myrepo",)).candidates()] == ["b", "c"]


def test_a_hold_touches_only_its_own_claim_and_is_written_once(tmp_path: Path) -> None:
    q, (a, b, c) = _held(tmp_path)
    before = q.path.read_bytes()
    q.hold(a, "evolve:cycle-1", "2026-01-01T00:09:00Z", "refs/evolve/pending/main (cycle 1)")  # (recovery again)
    q.hold(b, "evolve:cycle-9", "2026-01-01T00:09:00Z", "x (cycle 9)")  # not its claimer
    q.hold(c, "evolve:cycle-3", "2026-01-01T00:09:00Z", "x (cycle 3)")  # not claimed at all
    assert q.path.read_bytes() == before
    # An item requeued by hand that still carries the field is no held claim, and its next claim drops it.
    q.release(a, None, "2026-01-01T00:10:00Z", "pending")
    raw = q.path.read_bytes().replace(b'"claim_status":"available"', b'"claim_status":"available","claim_held":"x"', 1)
    q.path.write_bytes(raw)
    assert live(q.path)[0]["items"][0]["claim_held"] == "x"  # (on "a")
    again = next(w for w in q.candidates() if w.title == "a")
    q.claim(again, "evolve:cycle-4", "2026-01-01T00:11:00Z")
    ia = live(q.path)[0]["items"][0]
    assert ia["claimed_by"] == "evolve:cycle-4" and "claim_held" not in ia, ia


def test_a_held_queue_reads_the_same_to_upstream_s_jq_one_liners(tmp_path: Path) -> None:
    """Upstream's readers know no ``claim_held``: to them the held item is an ordinary in_progress claim,
    on a line that is a plain JSON object with every field it had."""
    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed")
    q, _ = _held(tmp_path)

    def run(*args: str) -> list[str]:
        return subprocess.run([jq, *args, str(q.path)], capture_output=True, text=True, check=True).stdout.split("\n")

    # (jq reads the file line by line; "garbage" is not JSON, so upstream's readers skip it: `fromjson?`.)
    lines = run("-R", "-c", "fromjson? | select(.superseded != true)")
    assert len([x for x in lines if x]) == 1
    ready = run("-R", "-r", 'fromjson? | select(.consumed != true) | .items[] '
                '| select((.claim_status // "available") == "available") | .title')
    assert [x for x in ready if x] == ["c"]
    claimed = run("-R", "-r", 'fromjson? | .items[]? | select(.claim_status == "in_progress") '
                  '| [.title, .claimed_by, .claim_held // "-", .custom.k // "-"] | @tsv')
    assert [x for x in claimed if x] == ["a\tevolve:cycle-1\trefs/evolve/pending/main (cycle 1)\t1",
                                         "b\tevolve:cycle-2\t-\t-"]
