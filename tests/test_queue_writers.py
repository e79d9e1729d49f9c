"""Issue 22 item 9: the queue survives every writer (docs/DESIGN.md §6.1).

Real writers in real processes: an editor that saves by renaming a new file over
``next-work.jsonl`` (as most editors, ``sed -i`` and upstream's own rewrite do) or vim's way (the
original renamed to a backup, a new file written under the name), and an appender that writes one
line in two ``write()`` calls. Against them: an in-process :class:`HarvestedQueue` and real
``evolve fire`` processes, some killed at every step of an edit. After each: no crash, no item done
twice, no claim left in progress that nobody holds, no line lost or glued, and an operator's
deliberate edit of an item's lifecycle stands where an editor's stale save is undone.

Nothing waits on time to decide an outcome: every writer is stepped by marker files (a bounded poll
is a hang guard), so the order of the writes is the one the test names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from invariants import GitWatch, History
from support import Env, entry, git, improved_step, live

from evolve.work.harvested import HarvestedQueue

WAIT_S = 120  # hang guards only
ROOT = str(Path(__file__).resolve().parents[1])

# An editor: loads the whole file into its buffer, says so, waits to be told to save, applies the
# operator's edits (by item title) to the lines they touch, and saves: "rename" writes a temp file and
# renames it over the queue; "backup" renames the queue to ``<name>~``, writes a new file under the
# name (waiting first for "write" when told to, so that the queue is missing meanwhile), removes the backup.
EDITOR = textwrap.dedent(r"""
    import os, sys, time, orjson
    path, marks, mode = sys.argv[1:4]
    def wait(name):
        end = time.monotonic() + 120
        while not os.path.exists(os.path.join(marks, name)):
            if time.monotonic() > end:
                sys.exit(3)
            time.sleep(0.002)
    def mark(name):
        open(os.path.join(marks, name), "w").close()
    with open(path, "rb") as fh:
        buf = fh.read()
    mark("loaded")
    wait("save")
    edits = os.path.join(marks, "edits.json")
    if os.path.exists(edits):
        want = orjson.loads(open(edits, "rb").read())
        lines = buf.split(b"\n")
        for n, raw in enumerate(lines):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            hit = False
            for it in obj.get("items") or []:
                for k, v in want.get(it.get("title"), {}).items():
                    hit = True
                    if v is None:
                        it.pop(k, None)
                    else:
                        it[k] = v
            if hit:
                lines[n] = orjson.dumps(obj)
        buf = b"\n".join(lines)
    d, base = os.path.split(path)
    if mode == "rename":
        tmp = os.path.join(d, "." + base + ".swp")
        with open(tmp, "wb") as fh:
            fh.write(buf)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    else:
        os.rename(path, path + "~")
        mark("aside")
        if os.path.exists(os.path.join(marks, "hold")):
            wait("write")
        with open(path, "wb") as fh:
            fh.write(buf)
            fh.flush()
            os.fsync(fh.fileno())
        os.unlink(path + "~")
    mark("saved")
""")


def _wait(pred, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < end, f"{what} not reached within {WAIT_S}s"
        time.sleep(0.002)


class Editor:
    """One editing session of the queue in a real process: :meth:`load` now, :meth:`save` later."""

    def __init__(self, path: Path, marks: Path, mode: str = "rename", *, hold: bool = False) -> None:
        self.path, self.marks, self.mode = path, marks, mode
        marks.mkdir(parents=True)
        if hold:
            (marks / "hold").touch()
        self.proc: subprocess.Popen[bytes] | None = None

    def load(self) -> Editor:
        self.proc = subprocess.Popen([sys.executable, "-c", EDITOR, str(self.path), str(self.marks), self.mode])
        _wait(lambda: (self.marks / "loaded").exists() or self.proc.poll() is not None, "the editor's load")
        assert (self.marks / "loaded").exists(), self.proc.returncode
        return self

    def save(self, edits: dict[str, dict[str, Any]] | None = None, *, wait: bool = True) -> None:
        if edits:
            (self.marks / "edits.json").write_bytes(orjson.dumps(edits))
        (self.marks / "save").touch()
        if wait:
            self.done()

    def done(self) -> None:
        assert self.proc is not None
        assert self.proc.wait(timeout=WAIT_S) == 0
        assert (self.marks / "saved").exists()


def _item(title: str, **kw: Any) -> dict[str, Any]:
    return {"title": title, "description": f"do {title}", "type": "task", "severity": "medium", **kw}


def _entry(*items: dict[str, Any], epic: str = "ep") -> dict[str, Any]:
    return {"source_epic": epic, "timestamp": "2026-01-01T00:00:00Z", "items": list(items)}


def _queue(tmp_path: Path, *entries: dict[str, Any]) -> HarvestedQueue:
    p = tmp_path / "next-work.jsonl"
    p.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    return HarvestedQueue(p)


def _items(path: Path) -> dict[str, dict[str, Any]]:
    """Every live item by title; each title must be live exactly once."""
    out: dict[str, dict[str, Any]] = {}
    for e in live(path):
        for it in e["items"]:
            assert it["title"] not in out, f"{it['title']} is live twice"
            out[it["title"]] = it
    return out


def _parses(path: Path) -> None:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), raw[-200:]
    for line in raw.split(b"\n")[:-1]:
        assert not line.strip() or isinstance(orjson.loads(line), dict), line[:200]


def _by_title(q: HarvestedQueue, title: str):
    return next(w for w in q.candidates() if w.title == title)


# -- a save-by-rename editor ----------------------------------------------------------------------


def test_a_stale_save_between_claim_and_finalize_is_undone(tmp_path: Path) -> None:
    """The editor loaded the queue before the claim and saves during the cycle: its save brings back
    the item unclaimed. The finalize still consumes it (the claim re-applied from evolve's record
    first), so no later selection does it again."""
    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b"), epic="other"))
    a = _by_title(q, "a")
    ed = Editor(q.path, tmp_path / "ed").load()
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    ed.save()  # the queue is now the editor's buffer: "a" unclaimed
    assert _items(q.path)["a"].get("claim_status") is None  # (the stale save did land)
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:02Z")
    items = _items(q.path)
    assert (items["a"]["consumed"], items["a"]["claim_status"], items["a"]["claimed_by"]) == (
        True, "consumed", "evolve:cycle-1")
    assert items["b"].get("claim_status") is None  # the item nobody touched is as it was
    assert [w.title for w in HarvestedQueue(q.path).candidates()] == ["b"]  # "a" is never done again
    _parses(q.path)


@pytest.mark.parametrize("mode", ["rename", "backup"])
def test_a_stale_save_after_finalize_and_release_leaves_no_claim_in_progress(tmp_path: Path, mode: str) -> None:
    """The editor loaded the queue while two items were claimed and saves after one was finalized and
    the other released: both come back ``in_progress`` under a claimer that is done with them. The next
    read re-applies the finalize and the release; nothing stays claimed, nothing is done twice."""
    q = _queue(tmp_path, _entry(_item("a"), _item("b")), _entry(_item("c"), epic="other"))
    a, b = _by_title(q, "a"), _by_title(q, "b")
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    q.claim(b, "evolve:cycle-2", "2026-01-01T00:00:02Z")
    ed = Editor(q.path, tmp_path / "ed", mode).load()
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:03Z")
    q.release(b, "evolve:cycle-2", "2026-01-01T00:00:04Z", "failed")
    ed.save()
    assert {_items(q.path)[t]["claim_status"] for t in "ab"} == {"in_progress"}  # what the save brought back
    fresh = HarvestedQueue(q.path)  # a new fire's first read
    assert sorted(w.title for w in fresh.candidates()) == ["b", "c"]
    items = _items(q.path)
    assert (items["a"]["consumed"], items["a"]["claim_status"]) == (True, "consumed")
    assert (items["b"]["claim_status"], items["b"]["claimed_by"], items["b"]["failed_at"]) == (
        "available", None, "2026-01-01T00:00:04Z")
    assert sorted(w.title for w in q.candidates()) == ["b", "c"]  # the first queue agrees
    _parses(q.path)


def test_a_deliberate_requeue_stands_where_a_stale_save_is_undone(tmp_path: Path) -> None:
    """One save carries both: item "a", which the operator requeued by hand (consumed back to false,
    claim_status to available, as they saw it consumed), and item "b", which evolve finalized after the
    buffer was loaded (the buffer still has it in progress). "a" stays requeued and is selectable;
    "b" is consumed again. An item the operator edited otherwise (a title typo fixed) keeps its edit."""
    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")), _entry(_item("c")))
    a, b, c = (_by_title(q, t) for t in "abc")
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:02Z")
    q.claim(b, "evolve:cycle-2", "2026-01-01T00:00:03Z")
    q.claim(c, "evolve:cycle-3", "2026-01-01T00:00:04Z")
    ed = Editor(q.path, tmp_path / "ed").load()
    q.finalize(b, "evolve:cycle-2", "2026-01-01T00:00:05Z")
    ed.save({"a": {"consumed": False, "claim_status": "available"}, "c": {"description": "do c, carefully"}})
    fresh = HarvestedQueue(q.path)
    assert sorted(w.title for w in fresh.candidates()) == ["a"]  # requeued by hand: selectable again
    items = _items(q.path)
    assert (items["a"]["consumed"], items["a"]["claim_status"]) == (False, "available")
    assert (items["b"]["consumed"], items["b"]["claim_status"]) == (True, "consumed")
    assert (items["c"]["claim_status"], items["c"]["description"]) == ("in_progress", "do c, carefully")
    q.finalize(c, "evolve:cycle-3", "2026-01-01T00:00:06Z")  # the operator's edit of "c" is no claim change
    assert (_items(q.path)["c"]["consumed"], _items(q.path)["c"]["description"]) == (True, "do c, carefully")
    again = fresh.candidates()[0]
    fresh.claim(again, "evolve:cycle-4", "2026-01-01T00:00:07Z")  # and the requeued item can be done again
    fresh.finalize(again, "evolve:cycle-4", "2026-01-01T00:00:08Z")
    assert _items(q.path)["a"]["consumed_by"] == "evolve:cycle-4"
    _parses(q.path)


def _another_reader(path: Path) -> HarvestedQueue:
    """A second reader of the queue with evolve's stale-claim rule: another claimer to whom every
    ``in_progress`` claim older than a millisecond is stale, its clock a year ahead."""
    return HarvestedQueue(path, claim_visibility_s=0.001, clock=lambda: time.time() + 365 * 86400)


def test_a_stale_save_that_drops_a_hold_gets_it_back_and_a_requeue_of_a_held_item_stands(tmp_path: Path) -> None:
    """A held claim (its cycle's work waits to land) is one of evolve's lifecycle writes like any other.
    The editor loaded the queue with "a" claimed but not yet held and "b" held; it saves after "a" was
    held, and the operator requeued "b" by hand in that buffer. The next reader (here a second one, with
    another claimer and a millisecond's visibility) writes "a"'s hold again before it selects, so it never
    takes "a" over; "b"'s requeue stands, and the reader may take it."""
    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")), _entry(_item("c")))
    a, b = _by_title(q, "a"), _by_title(q, "b")
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    q.claim(b, "evolve:cycle-2", "2026-01-01T00:00:02Z")
    q.hold(b, "evolve:cycle-2", "2026-01-01T00:00:03Z", "refs/evolve/pending/main (cycle 2)")
    ed = Editor(q.path, tmp_path / "ed").load()
    q.hold(a, "evolve:cycle-1", "2026-01-01T00:00:04Z", "refs/evolve/pending/main (cycle 1)")
    ed.save({"b": {"claim_status": "available", "claimed_by": None, "claimed_at": None}})
    assert "claim_held" not in _items(q.path)["a"]  # (the stale save did land: "a" a plain in_progress claim)
    other = _another_reader(q.path)
    assert sorted(w.title for w in other.candidates()) == ["b", "c"]  # never "a"
    assert sorted(other.reconciled) == [("queue.edit_kept", "b"), ("queue.reapplied", "a")]
    items = _items(q.path)
    assert (items["a"]["claim_status"], items["a"]["claimed_by"], items["a"]["claim_held"]) == (
        "in_progress", "evolve:cycle-1", "refs/evolve/pending/main (cycle 1)")
    assert (items["b"]["claim_status"], items["b"].get("claimed_by")) == ("available", None)  # the requeue stands
    other.claim(_by_title(other, "b"), "another-tool", "2026-01-01T00:00:05Z")
    assert (_items(q.path)["b"]["claimed_by"], _items(q.path)["b"].get("claim_held")) == ("another-tool", None)
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:06Z")  # the held work landed
    q.release(b, "evolve:cycle-2", "2026-01-01T00:00:07Z", "pending")  # not evolve's claim any more: a no-op
    items = _items(q.path)
    assert (items["a"]["consumed"], items["a"].get("claim_held"), items["a"].get("claim_held_at")) == (
        True, None, None)
    assert items["b"]["claimed_by"] == "another-tool"
    _parses(q.path)


def test_a_backup_save_while_an_edit_waits_for_the_lock_is_no_crash(tmp_path: Path) -> None:
    """vim's save renames the queue aside, then writes a new file under its name. An edit that was
    waiting for the lock meanwhile finds the name missing (it raised FileNotFoundError, uncaught) and
    then a new file: it claims the item in the file that is there now."""
    import fcntl

    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")))
    a = _by_title(q, "a")
    holder = os.open(q.path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another editor at work: our claim waits
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
        except BaseException as exc:
            errors.append(exc)

    ed = Editor(q.path, tmp_path / "ed", "backup", hold=True).load()
    t = threading.Thread(target=claim)
    t.start()
    ed.save(wait=False)
    _wait(lambda: (ed.marks / "aside").exists(), "the editor's rename aside")
    os.close(holder)  # the lock is free, the queue's name is missing
    t.join(timeout=1.0)  # (the claim may finish now, or wait for the name to come back)
    (ed.marks / "write").touch()
    ed.done()
    t.join(timeout=WAIT_S)
    assert not t.is_alive() and errors == [], errors
    items = _items(q.path)
    assert (items["a"]["claim_status"], items["a"]["claimed_by"]) == ("in_progress", "evolve:cycle-1")
    assert [w.title for w in HarvestedQueue(q.path).candidates()] == ["b"]
    _parses(q.path)


def test_a_selection_during_a_backup_save_sees_the_queue_not_nothing(tmp_path: Path) -> None:
    """A selection made while vim's save has the queue's name missing waits for the new file: it
    sees the work there is (it saw no queue at all, and a fire went idle)."""
    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")))
    assert [w.title for w in q.candidates()] == ["a", "b"]
    ed = Editor(q.path, tmp_path / "ed", "backup", hold=True).load()
    ed.save(wait=False)
    _wait(lambda: (ed.marks / "aside").exists(), "the editor's rename aside")
    seen: list[list[str]] = []
    t = threading.Thread(target=lambda: seen.append([w.title for w in q.candidates()]))
    t.start()
    t.join(timeout=0.5)
    (ed.marks / "write").touch()
    ed.done()
    t.join(timeout=WAIT_S)
    assert seen == [["a", "b"]]


# -- a line written in two write()s ----------------------------------------------------------------

# An appender that writes each line in two write() calls when told: the first half, then (when told
# again) the rest with its newline. It says when each half is out.
HALVES = textwrap.dedent(r"""
    import os, sys, time, orjson
    path, marks, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def wait(name):
        end = time.monotonic() + 120
        while not os.path.exists(os.path.join(marks, name)):
            if time.monotonic() > end:
                sys.exit(3)
            time.sleep(0.002)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    for k in range(n):
        line = orjson.dumps({"source_epic": "halves", "items": [{"title": f"half-{k}", "type": "task"}]})
        wait(f"start-{k}")
        os.write(fd, line[: len(line) // 2])
        open(os.path.join(marks, f"half-{k}"), "w").close()
        wait(f"rest-{k}")
        os.write(fd, line[len(line) // 2 :] + b"\n")
        open(os.path.join(marks, f"whole-{k}"), "w").close()
    os.close(fd)
""")


def _halves(path: Path, marks: Path, n: int) -> subprocess.Popen[bytes]:
    marks.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", HALVES, str(path), str(marks), str(n)])


def _during_half(marks: Path, k: int, action) -> None:
    """Run ``action`` while line ``k``'s first half is out; let the appender finish the line once the
    action is done or has had a moment (an edit that waits for the line to end is then still waiting)."""
    (marks / f"start-{k}").touch()
    _wait(lambda: (marks / f"half-{k}").exists(), f"half of line {k}")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=0.5)
    (marks / f"rest-{k}").touch()
    t.join(timeout=WAIT_S)
    assert not t.is_alive() and errors == [], errors
    _wait(lambda: (marks / f"whole-{k}").exists(), f"the rest of line {k}")


def test_a_line_in_two_writes_is_never_split_by_a_move_or_an_append(tmp_path: Path) -> None:
    """While an appender's line is half written, evolve moves a line that outgrew its place (its copy
    goes to the end) and appends a follow-up entry: both wait for the line to end and start on a line of
    their own. Every line parses; the appender's lines, the moved item and the follow-up are each live
    exactly once."""
    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")))
    marks = tmp_path / "halves"
    app = _halves(q.path, marks, 3)
    a = _by_title(q, "a")
    _during_half(marks, 0, lambda: q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z"))  # a move
    _during_half(marks, 1, lambda: q.append_entry(_entry(_item("follow-up"), epic="evolve-cycle-1")))
    b = _by_title(q, "b")
    _during_half(marks, 2, lambda: q.claim(b, "evolve:cycle-2", "2026-01-01T00:00:02Z"))
    assert app.wait(timeout=WAIT_S) == 0
    _parses(q.path)
    items = _items(q.path)
    assert sorted(items) == ["a", "b", "follow-up", "half-0", "half-1", "half-2"]
    assert items["a"]["claim_status"] == items["b"]["claim_status"] == "in_progress"
    assert sorted(w.title for w in HarvestedQueue(q.path).candidates()) == ["follow-up", "half-0", "half-1", "half-2"]


def test_a_dead_appenders_half_line_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An appender killed mid-line never finishes it: once it has not changed for the wait
    (``inplace.TORN_WAIT_S``, shortened here), evolve starts its own line on a fresh line after it, and
    the half line stays as it was (one malformed line), never overwritten or joined."""
    from evolve.store import inplace

    monkeypatch.setattr(inplace, "TORN_WAIT_S", 0.2, raising=False)
    q = _queue(tmp_path, _entry(_item("a")))
    half = orjson.dumps(_entry(_item("dead")))[:25]
    with open(q.path, "ab") as fh:
        fh.write(half)
    q.append_entry(_entry(_item("follow-up"), epic="evolve-cycle-1"))
    a = _by_title(q, "a")
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    lines = q.path.read_bytes().split(b"\n")
    assert half in lines  # the half line, left as the appender left it, on a line of its own
    assert lines[-1] == b""
    items = _items(q.path)
    assert sorted(items) == ["a", "follow-up"] and items["a"]["claim_status"] == "in_progress"


def test_a_half_line_that_lands_between_the_look_and_the_write_never_swallows_evolves_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race no look can close: another appender's first half lands right after evolve saw a whole
    last line and before its own write. evolve's bytes, glued onto that half, are blanked and its line
    written again on a line of its own: the moved item is live once, every other line as it was."""
    from evolve.store import inplace

    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")))
    half = orjson.dumps(_entry(_item("racer"), epic="racer"))[:40]
    lead = inplace._lead

    def look_then_race(fd: int) -> bytes:
        got = lead(fd)
        with open(q.path, "ab") as fh:  # the other appender, in the window after the look
            fh.write(half)
        return got

    monkeypatch.setattr(inplace, "_lead", look_then_race)
    a = _by_title(q, "a")
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")  # a move: its copy appended
    monkeypatch.setattr(inplace, "_lead", lead)
    lines = q.path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    glued = [ln for ln in lines if ln.startswith(half)]
    assert len(glued) == 1 and not glued[0][len(half):].strip()  # the half, then evolve's bytes blanked
    items = _items(q.path)
    assert sorted(items) == ["a", "b"] and items["a"]["claim_status"] == "in_progress"
    assert [w.title for w in HarvestedQueue(q.path).candidates()] == ["b"]


def test_the_queue_gone_for_a_while_loses_no_finalize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue is moved away during the cycle (longer than an edit waits for its name to come back)
    and then restored as it was when the cycle began: the finalize made meanwhile is applied to it."""
    from evolve.work import harvested

    monkeypatch.setattr(harvested, "REAPPEAR_S", 0.05, raising=False)
    q = _queue(tmp_path, _entry(_item("a")), _entry(_item("b")))
    a = _by_title(q, "a")
    saved = q.path.read_bytes()
    q.claim(a, "evolve:cycle-1", "2026-01-01T00:00:01Z")
    q.path.rename(tmp_path / "aside.jsonl")
    q.finalize(a, "evolve:cycle-1", "2026-01-01T00:00:02Z")  # no queue now
    q.path.write_bytes(saved)  # back, as it was before the claim
    assert [w.title for w in HarvestedQueue(q.path).candidates()] == ["b"]
    items = _items(q.path)
    assert (items["a"]["consumed"], items["a"]["claim_status"]) == (True, "consumed")


# -- real fires ------------------------------------------------------------------------------------


def _held(path: str, marks: Path, name: str) -> dict[str, Any]:
    """An improved step that says it runs (``marks/name``), then waits for ``marks/name.go``."""
    step = improved_step(path)
    step["write"] = [*step["write"], {"path": str(marks / name), "content": "running\n"}]
    return {**step, "wait_for": str(marks / f"{name}.go")}


def _fire(env: Env, *args: str, **extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", *args],
                          capture_output=True, env=env.env(**extra), timeout=WAIT_S)


def test_editors_saving_during_a_fire_undo_none_of_its_claims(env: Env) -> None:
    """The reported run: while a four-cycle fire works through one entry, an editor that loaded the
    queue before the fire saves during cycle 1 (cycle 1's claim undone), and one that saves vim's way
    loads during cycle 2 and saves during cycle 3 (cycle 2's finalize and cycle 3's claim undone).
    Every cycle does a different item, nothing is left in progress, the ledger and the queue agree, and
    the fire never crashes."""
    marks = env.root / "marks"
    marks.mkdir()
    history = History()
    titles = [f"item-{k}" for k in range(5)]
    env.queue(entry(*titles))
    history.append(titles)
    env.steps([_held("src/a.txt", marks, "c1"), _held("src/b.txt", marks, "c2"), _held("src/c.txt", marks, "c3"),
               improved_step("src/d.txt")])
    env.write_config(agent={"timeout_s": 600, "idle_timeout_s": 600})
    gitw = GitWatch(env)
    gitw.plant()
    q = env.paths.nextwork
    e1 = Editor(q, marks / "e1").load()
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())

    def agent(name: str) -> None:
        _wait(lambda: (marks / name).exists() or fire.poll() is not None, f"the agent of {name}")
        assert fire.poll() is None, fire.communicate()[1].decode()[-3000:]

    agent("c1")
    e1.save()
    (marks / "c1.go").touch()
    agent("c2")
    e2 = Editor(q, marks / "e2", "backup").load()
    (marks / "c2.go").touch()
    agent("c3")
    e2.save()
    (marks / "c3.go").touch()
    _out, err = fire.communicate(timeout=WAIT_S)
    assert fire.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err, err.decode()[-3000:]
    ledger = env.ledger()
    assert [e["result"] for e in ledger] == ["improved"] * 4
    refs = [e["work_ref"] for e in ledger]
    assert len(set(refs)) == 4, refs  # four different items: none done twice
    history.observe(env, 1)  # nothing in progress; consumed exactly the items the ledger says
    assert sorted(e["event"] for e in _events(err) if e["event"].startswith("queue.")) == (
        ["queue.reapplied"] * 3)  # cycle 1's claim, cycle 2's finalize, cycle 3's claim
    _parses(q)
    gitw.check()


def test_an_editor_s_stale_save_after_a_pending_cycle_does_not_free_its_item(env: Env) -> None:
    """A real fire whose cycle's work waits to land (the operator's untracked ``w.txt`` is in the way):
    an editor loads the queue while the agent runs (the item claimed, not yet held) and saves after the
    fire held it. The save makes the item a plain in_progress claim again; the next reader, another
    tool's with a millisecond's visibility, writes the hold again first and never takes the item; the
    next fire lands the work and finalizes the item, the hold gone."""
    marks = env.root / "marks"
    marks.mkdir()
    history = History()
    (env.repo / "w.txt").write_text("the operator's\n")
    env.queue(entry("waits", "other"))
    history.append(["waits", "other"])
    env.steps([_held("w.txt", marks, "c1"), {"report": {"result": "unchanged"}}])
    env.write_config(agent={"timeout_s": 600, "idle_timeout_s": 600})
    gitw = GitWatch(env, operator={"w.txt": b"the operator's\n"})
    q = env.paths.nextwork
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    _wait(lambda: (marks / "c1").exists() or fire.poll() is not None, "the agent of cycle 1")
    assert fire.poll() is None, fire.communicate()[1].decode()[-3000:]
    ed = Editor(q, marks / "ed").load()
    (marks / "c1.go").touch()
    _out, err = fire.communicate(timeout=WAIT_S)
    assert fire.returncode == 0, err.decode()[-3000:]
    assert env.ledger()[-1]["result"] == "pending"
    assert _items(q)["waits"]["claim_held"] == "refs/evolve/pending/main (cycle 1)"
    ed.save()
    assert "claim_held" not in _items(q)["waits"]  # what the stale save brought back
    other = _another_reader(q)
    assert [w.title for w in other.candidates()] == ["other"]
    assert other.reconciled == [("queue.reapplied", "waits")]
    assert (_items(q)["waits"]["claimed_by"], _items(q)["waits"]["claim_held"]) == (
        "evolve:cycle-1", "refs/evolve/pending/main (cycle 1)")
    history.observe(env, 1)
    gitw.check()
    (env.repo / "w.txt").unlink()
    del gitw.operator["w.txt"]
    r = _fire(env, "--cycles", "1")
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    it = _items(q)["waits"]
    assert (it["consumed"], it["consumed_by"], it.get("claim_held")) == (True, "evolve:cycle-1", None), it
    assert (env.repo / "w.txt").read_text() == "cycle 1\n"  # the agent's, landed
    _parses(q)
    history.observe(env, 2)
    gitw.check()


def _events(err: bytes) -> list[dict[str, Any]]:
    out = []
    for line in err.splitlines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "event" in obj:
            out.append(obj)
    return out


# -- kills at every step of an edit, with an editor or an appender at work -------------------------

# (point, editor, appender): where the fire dies (evolve/crashpoint.py; a fire of two cycles over one
# entry: cycle 1 claims item-0, a move, and finalizes it; cycle 2 claims item-1 and fails, a release),
# when an editor loads the queue it saves after the kill ("before" the fire: a stale save of
# everything the fire wrote; "after" the kill: a save of the half-done state; "across": loaded after
# the kill, saved after the recovery fire settled it), and whether an appender has half a line out
# while the fire edits.
KILLS = [
    ("queue.record:1", "before", False),  # the claim recorded, the queue untouched
    ("queue.journal:1", "before", False),  # … its redo journal written
    ("queue.replace:1", "before", False),  # … its copy appended, the old line not yet a tombstone
    ("queue.replace:1", "after", False),  # (the save keeps both the old line and the copy)
    ("queue.record:2", "before", False),  # the finalize recorded
    ("queue.journal:2", "after", False),  # … its journal written
    ("queue.record:4", "before", False),  # cycle 2's release recorded
    ("queue.journal:4", "after", False),  # … its journal written
    ("agent.running:2", "before", False),  # cycle 2's agent running (the kill from outside the queue code)
    ("queue.replace:1", "across", False),  # (loaded after the kill, saved after the recovery fire)
    ("queue.torn:1", "after", True),  # the claim's move waiting for the appender's half line to end
]
LOOP = [improved_step("src/a.txt"), {"report": {"result": "failed", "summary": "could not"}}]


def _repo(root: Path) -> Env:
    """A fresh repository wired to the scripted agent, as the ``env`` fixture makes one."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("# test repo\n", encoding="utf-8")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "initial")
    (repo / ".agents").mkdir()
    (repo / ".agents" / ".gitignore").write_text("*\n", encoding="utf-8")
    e = Env(root=root, repo=repo, xdg=root / "xdg", script=root / "agent.json")
    e.write_config(
        agent={"runner": "command", "argv": [sys.executable, "-m", "evolve.agent.scripted", "--script", str(e.script)],
               "timeout_s": 60, "idle_timeout_s": 30, "pass_env": ["PYTHONPATH"]},
        fire={"max_cycles": 5},
    )
    e.steps(LOOP, loop=True)
    return e


def _trial(env: Env, point: str, editor: str, appender: bool) -> None:
    history = History()
    titles = ["item-0", "item-1", "item-2"]
    env.queue(entry(*titles))
    history.append(titles)
    gitw = GitWatch(env)
    gitw.plant()
    q = env.paths.nextwork
    marks = env.root / "halves"
    app = _halves(q, marks, 1) if appender else None
    if app is not None:
        (marks / "start-0").touch()
        _wait(lambda: (marks / "half-0").exists(), "the appender's half line")
        history.append(["half-0"])
    ed = Editor(q, env.root / "editor").load() if editor == "before" else None
    r = _fire(env, "--cycles", "2", EVOLVE_CRASHPOINT=point)
    assert r.returncode == -9, (r.returncode, r.stderr.decode()[-2000:])  # died where it was told to
    if app is not None:
        (marks / "rest-0").touch()
        assert app.wait(timeout=WAIT_S) == 0
    if ed is None:
        ed = Editor(q, env.root / "editor").load()
    if editor != "across":
        ed.save()
    History.claims_held(env)  # before any recovery: in progress only what session-state records
    rec = _fire(env, "--cycles", "1")  # the recovery (and one cycle)
    assert rec.returncode == 0, rec.stderr.decode()[-3000:]
    assert b"Traceback" not in rec.stderr, rec.stderr.decode()[-3000:]
    if editor == "across":
        ed.save()
        rec = _fire(env, "--cycles", "1")
        assert rec.returncode == 0 and b"Traceback" not in rec.stderr, rec.stderr.decode()[-3000:]
    state = env.state()
    assert state["fire"] is None and state["claimed_work"] is None, state
    _parses(q)
    history.observe(env, 1)  # every line once, nothing in progress, consumed exactly when the ledger says
    gitw.check()
    more = _fire(env, "--cycles", "4")  # and on: no item is done twice
    assert more.returncode == 0, more.stderr.decode()[-3000:]
    _parses(q)
    history.observe(env, 2)
    gitw.check()


def test_a_fire_killed_at_every_step_of_an_edit_with_an_editor_or_appender_at_work(tmp_path: Path) -> None:
    """Each of :data:`KILLS` in a repository of its own: the fire dies there, the editor saves, a
    recovery fire and four more cycles run; after each, every invariant of tests/invariants.py."""
    failed = []
    for n, (point, editor, appender) in enumerate(KILLS):
        try:
            _trial(_repo(tmp_path / f"t{n}"), point, editor, appender)
        except AssertionError as exc:
            failed.append(f"{point} (editor {editor}{', appender' if appender else ''}): {str(exc)[:600]}")
    assert not failed, "\n".join(failed)


def test_a_requeue_by_hand_is_taken_again_and_a_stale_claim_is_not(env: Env) -> None:
    """A two-cycle fire consumes item-0 and item-1. The operator's editor loaded the queue while
    cycle 2 ran (item-0 consumed, item-1 in progress); in that buffer they requeue item-0 by hand, and
    save after the fire. The next fire does item-0 again (the requeue stands) and leaves item-1 alone:
    its finalize, which the save undid, is applied again (its claim does not stay in progress)."""
    marks = env.root / "marks"
    marks.mkdir()
    env.queue(entry("item-0", "item-1", "item-2"))
    env.steps([improved_step("src/a.txt"), _held("src/b.txt", marks, "c2"), improved_step("src/c.txt")])
    env.write_config(agent={"timeout_s": 600, "idle_timeout_s": 600})
    gitw = GitWatch(env)
    gitw.plant()
    q = env.paths.nextwork
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    _wait(lambda: (marks / "c2").exists() or fire.poll() is not None, "the agent of cycle 2")
    ed = Editor(q, marks / "ed").load()
    (marks / "c2.go").touch()
    _out, err = fire.communicate(timeout=WAIT_S)
    assert fire.returncode == 0, err.decode()[-3000:]
    ed.save({"item-0": {"consumed": False, "claim_status": "available"}})
    items = _items(q)
    assert (items["item-0"]["claim_status"], items["item-1"]["claim_status"]) == ("available", "in_progress")
    r = _fire(env, "--cycles", "1")
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    ledger = env.ledger()
    assert [e["work_ref"].rsplit("=", 1)[1] for e in ledger] == ["item-0", "item-1", "item-0"]
    items = _items(q)
    assert (items["item-0"]["consumed"], items["item-0"]["consumed_by"]) == (True, "evolve:cycle-3")
    assert (items["item-1"]["consumed"], items["item-1"]["consumed_by"]) == (True, "evolve:cycle-2")
    assert items["item-2"].get("claim_status") is None
    names = [e["event"] for e in _events(r.stderr)]
    assert names.count("queue.reapplied") == 1 and names.count("queue.edit_kept") == 1, names
    _parses(q)
    gitw.check()


# An editor at work for a while. Round k: when told (``go-k``), load; wait until evolve has replaced
# its redo journal ``k % 4 + 1`` times since (at each edit, before and after it writes) or the fire has
# ended (``ended-k``); save (by rename, or vim's way every other round); say so (``saved-k``).
EDITOR_LOOP = textwrap.dedent(r"""
    import os, sys, time
    path, rounds, marks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    d, base = os.path.split(path)
    journal = os.path.join(d, "." + base + ".redo")
    def sig():
        try:
            st = os.stat(journal)
            return (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            return None
    for k in range(rounds):
        end = time.monotonic() + 120
        while not os.path.exists(os.path.join(marks, f"go-{k}")) and time.monotonic() < end:
            time.sleep(0.001)
        with open(path, "rb") as fh:
            buf = fh.read()
        seen, changes, end = sig(), 0, time.monotonic() + 120
        ended = os.path.join(marks, f"ended-{k}")
        while changes < k % 4 + 1 and not os.path.exists(ended) and time.monotonic() < end:
            if sig() != seen:
                seen, changes = sig(), changes + 1
            time.sleep(0.0005)
        if k % 2:
            os.rename(path, path + "~")
            with open(path, "wb") as fh:
                fh.write(buf)
            os.unlink(path + "~")
        else:
            tmp = os.path.join(d, "." + base + ".swp")
            with open(tmp, "wb") as fh:
                fh.write(buf)
            os.rename(tmp, path)
        open(os.path.join(marks, f"saved-{k}"), "w").close()
""")
ROUNDS = 12


def test_an_editor_saving_stale_buffers_during_fire_after_fire(env: Env) -> None:
    """For each of twelve fires, an editor loads the queue as the fire starts and saves it during
    the fire, after its first, second, third or fourth journal write (or after the fire: then the next
    reader settles it). No fire crashes, no item is done twice, no claim is left in progress, every
    line is there once, and every line parses."""
    history = History()
    titles = [f"item-{k}" for k in range(8)]
    env.queue(entry(*titles[:4]), entry(*titles[4:], epic="e2"))
    history.append(titles)
    env.steps(LOOP, loop=True)
    gitw = GitWatch(env)
    gitw.plant()
    q = env.paths.nextwork
    marks = env.root / "marks"
    marks.mkdir()
    ed = subprocess.Popen([sys.executable, "-c", EDITOR_LOOP, str(q), str(ROUNDS), str(marks)])
    for k in range(ROUNDS):
        (marks / f"go-{k}").touch()
        r = _fire(env, "--cycles", "1")
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()[-3000:]
        (marks / f"ended-{k}").touch()
        _wait(lambda k=k: (marks / f"saved-{k}").exists() or ed.poll() is not None, f"the editor's save {k}")
        HarvestedQueue(q).candidates()  # a reader (the next fire's first read): what a save undid is made again
        history.observe(env, k)
    assert ed.wait(timeout=WAIT_S) == 0
    r = _fire(env, "--cycles", "1")  # one more after the editor's last save
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    _parses(q)
    history.observe(env, ROUNDS)
    assert len(env.ledger()) == ROUNDS + 1
    gitw.check()
