"""Issue 15 item 3: no appended queue line is ever lost while the queue is edited (docs/DESIGN.md §6.1).

Three real appender processes — open-write-close, a shell ``>>`` loop, and one holding an
``O_APPEND`` descriptor for its whole run — write while an in-process :class:`HarvestedQueue` and a
second editor process claim, finalize and release items of the same file. At the end every line each
appender wrote is in the file exactly once, every line is JSON, and every lifecycle change holds.

Nothing waits on time: the held-descriptor appender writes half its lines, then waits (a bounded
poll) until the editors have made a number of edits after it opened, so its descriptor spans them
under any interleaving; the editors loop until the appenders have finished and their work is done.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import orjson
from invariants import GitWatch
from support import Env, entry, improved_step, jsonl, live

from evolve.work.harvested import HarvestedQueue
from evolve.work.item import ClaimLost

LINES = 60  # per appender
SEEDS = 30  # seeded items per editor
HELD_EDITS = 4  # edits the held descriptor must outlive before writing its second half
DEADLINE_S = 120  # only a hung run gets here


def _line(who: str, n: int) -> bytes:
    return orjson.dumps({"source_epic": who, "items": [{"title": f"{who}-{n}", "type": "task"}]})


def _appenders(q: Path, marks: Path) -> list[subprocess.Popen[bytes]]:
    closing = f"""
import os, orjson
for n in range({LINES}):
    fd = os.open({str(q)!r}, os.O_WRONLY | os.O_APPEND)
    os.write(fd, orjson.dumps({{"source_epic": "A", "items": [{{"title": f"A-{{n}}", "type": "task"}}]}}) + b"\\n")
    os.close(fd)
"""
    held = f"""
import os, orjson, time
fd = os.open({str(q)!r}, os.O_WRONLY | os.O_APPEND)
def put(n):
    os.write(fd, orjson.dumps({{"source_epic": "C", "items": [{{"title": f"C-{{n}}", "type": "task"}}]}}) + b"\\n")
for n in range({LINES} // 2):
    put(n)
open({str(marks / "held-open")!r}, "w").close()
end = time.monotonic() + {DEADLINE_S}
while not os.path.exists({str(marks / "go")!r}) and time.monotonic() < end:
    time.sleep(0.005)
for n in range({LINES} // 2, {LINES}):
    put(n)
os.close(fd)
"""
    line = '{\\"source_epic\\":\\"B\\",\\"items\\":[{\\"title\\":\\"B-$i\\",\\"type\\":\\"task\\"}]}'
    shell = f'for i in $(seq 0 {LINES - 1}); do echo "{line}" >> {q}; done'  # one `>>` open per line
    return [subprocess.Popen([sys.executable, "-c", closing]), subprocess.Popen([sys.executable, "-c", held]),
            subprocess.Popen(["sh", "-c", shell])]


# The second editor: claims, finalizes or releases the items whose titles start with its prefix.
EDITOR = textwrap.dedent("""
    import sys, orjson
    from pathlib import Path
    sys.path[:0] = [{root!r}]
    from evolve.work.harvested import HarvestedQueue
    from evolve.work.item import ClaimLost
    q = HarvestedQueue(Path({q!r}), claim_visibility_s=None)
    done = {{}}
    while len(done) < {n}:
        for w in q.candidates():
            if w.title.startswith({prefix!r}) and w.title not in done:
                try:
                    q.claim(w, "p2", "2026-01-01T00:00:00Z")
                except ClaimLost:
                    continue
                n = int(w.title.rsplit("-", 1)[1])
                if n % 2:
                    q.release(w, "p2", "2026-01-01T00:00:01Z", "failed")
                else:
                    q.finalize(w, "p2", "2026-01-01T00:00:01Z")
                done[w.title] = n % 2
                break
    print(orjson.dumps(done).decode())
""")


def _edit_one(q: HarvestedQueue, prefixes: tuple[str, ...], done: dict[str, int]) -> bool:
    """Claim the first open item of ours, then finalize (even) or release (odd) it; True if one was."""
    for w in q.candidates():
        if w.title.startswith(prefixes) and w.title not in done:
            try:
                q.claim(w, "p1", "2026-01-01T00:00:00Z")
            except ClaimLost:
                continue
            n = int(w.title.rsplit("-", 1)[1])
            if n % 2:
                q.release(w, "p1", "2026-01-01T00:00:01Z", "failed")
            else:
                q.finalize(w, "p1", "2026-01-01T00:00:01Z")
            done[w.title] = n % 2
            return True
    return False


def _check(path: Path, done: dict[str, int]) -> None:
    for raw in path.read_bytes().splitlines():
        assert not raw.strip() or isinstance(orjson.loads(raw), dict), raw  # every line valid JSON
    entries = live(path)
    titles = Counter(i["title"] for e in entries for i in e["items"])
    want = [f"{w}-{n}" for w in "ABC" for n in range(LINES)] + [f"S{p}-{n}" for p in (1, 2) for n in range(SEEDS)]
    assert sorted(titles) == sorted(want), set(want) ^ set(titles)  # every line there …
    assert all(c == 1 for c in titles.values()), [t for t, c in titles.items() if c > 1]  # … exactly once
    by_title = {i["title"]: i for e in entries for i in e["items"]}
    for title, released in done.items():
        item = by_title[title]
        if released:
            assert (item["claim_status"], item["claimed_by"], item.get("failed_at")) == (
                "available", None, "2026-01-01T00:00:01Z"), item
        else:
            assert (item["consumed"], item["claim_status"]) == (True, "consumed"), item


def test_three_appenders_and_two_editors_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "next-work.jsonl"
    marks = tmp_path / "marks"
    marks.mkdir()
    path.write_bytes(b"".join(_line(f"S{p}", n) + b"\n" for p in (1, 2) for n in range(SEEDS)))
    root = str(Path(__file__).resolve().parents[1])
    editor = subprocess.Popen([sys.executable, "-c", EDITOR.format(root=root, q=str(path), n=SEEDS, prefix="S2-")],
                              stdout=subprocess.PIPE)
    appenders = _appenders(path, marks)
    end = time.monotonic() + DEADLINE_S
    while not (marks / "held-open").exists() and time.monotonic() < end:
        time.sleep(0.005)  # every edit of ours comes after the held descriptor was opened
    q = HarvestedQueue(path, claim_visibility_s=None)
    done: dict[str, int] = {}
    edits_after_open = 0
    # Ours: the seeds S1-*, and every tenth line of each appender (edits while they append).
    prefixes = ("S1-", *(f"{w}-{n}" for w in "ABC" for n in range(0, LINES, 10)))
    mine = SEEDS + 3 * len(range(0, LINES, 10))
    while (len(done) < mine or any(p.poll() is None for p in appenders)) and time.monotonic() < end:
        if _edit_one(q, prefixes, done):
            edits_after_open += 1
            if edits_after_open == HELD_EDITS:
                (marks / "go").touch()  # the held descriptor has now outlived HELD_EDITS edits
    (marks / "go").touch()
    assert [p.wait(timeout=60) for p in appenders] == [0, 0, 0]
    out, _ = editor.communicate(timeout=DEADLINE_S)
    assert editor.returncode == 0
    done.update(orjson.loads(out))
    assert len(done) == mine + SEEDS and edits_after_open >= HELD_EDITS
    _check(path, done)
    assert jsonl(path)  # and the index of a fresh reader agrees with the file
    fresh = HarvestedQueue(path, claim_visibility_s=None)
    open_titles = sorted(w.title for w in fresh.candidates())
    assert open_titles == sorted(w.title for w in q.candidates())


CLAIMER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path[:0] = [{root!r}]
    from evolve.work.harvested import HarvestedQueue
    q = HarvestedQueue(Path({q!r}))
    w = next(iter(q.candidates()))
    q.claim(w, "dead", "2026-01-01T00:00:00Z")
    q.finalize(w, "dead", "2026-01-01T00:00:01Z")
""")


def test_an_editor_killed_mid_edit_is_finished_by_the_next_reader(tmp_path: Path) -> None:
    """SIGKILL after the journal, after a move's copy is appended (the old line not yet a tombstone),
    and after a put's journal: the next reader replays it; no line lost or left twice."""
    root = str(Path(__file__).resolve().parents[1])
    for point in ("queue.journal:1", "queue.replace:1", "queue.journal:2"):
        path = tmp_path / point.replace(":", "-") / "next-work.jsonl"
        path.parent.mkdir()
        path.write_bytes(_line("S", 0) + b"\n" + _line("S", 1) + b"\n")
        env = {**os.environ, "EVOLVE_CRASHPOINT": point}
        r = subprocess.run([sys.executable, "-c", CLAIMER.format(root=root, q=str(path))], env=env)
        assert r.returncode == -9, point  # killed where it was told to die
        for raw in path.read_bytes().splitlines():
            assert isinstance(orjson.loads(raw), dict)  # whatever moment: every line parses
        q = HarvestedQueue(path)
        titles = sorted(w.title for w in q.candidates())  # the read finishes the edit first
        items = [i for e in live(path) for i in e["items"]]
        assert sorted(i["title"] for i in items) == ["S-0", "S-1"], point  # once each
        s0 = next(i for i in items if i["title"] == "S-0")
        # journal:1, the claim before it touched the file, and replace:1, its copy appended but the
        # old line not yet a tombstone, are both finished as the claim; journal:2 is the finalize
        # (a put into the copy's slack), finished too.
        assert s0["claim_status"] == ("consumed" if point == "queue.journal:2" else "in_progress"), point
        assert titles == ["S-1"]
        assert orjson.loads((path.parent / ".next-work.jsonl.redo").read_bytes()) == {"state": "done"}


def test_evolve_fires_and_three_appenders_lose_nothing(env: Env) -> None:
    """The same three appenders against real ``evolve fire`` processes (claim, finalize, and the moves
    of the one many-item line they all edit) and an in-process editor between the fires."""
    q_path = env.paths.nextwork
    env.queue(entry(*[f"item-{n}" for n in range(6)]))
    env.steps([improved_step()])
    marks = env.root / "marks"
    marks.mkdir()
    appenders = _appenders(q_path, marks)
    end = time.monotonic() + DEADLINE_S
    while not (marks / "held-open").exists() and time.monotonic() < end:
        time.sleep(0.005)
    q = HarvestedQueue(q_path, claim_visibility_s=None)
    done: dict[str, int] = {}
    fires = 0
    while (fires < HELD_EDITS or any(p.poll() is None for p in appenders)) and time.monotonic() < end:
        r = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                           env=env.env(), capture_output=True)
        assert r.returncode == 0, r.stderr[-2000:]
        fires += 1
        _edit_one(q, ("A-1", "B-1", "C-1"), done)  # (A-1, A-10, …: claimed and finalized or released)
        if fires == HELD_EDITS:
            (marks / "go").touch()  # the held descriptor has outlived HELD_EDITS fires
    (marks / "go").touch()
    assert [p.wait(timeout=60) for p in appenders] == [0, 0, 0]
    for raw in q_path.read_bytes().splitlines():
        assert isinstance(orjson.loads(raw), dict)
    entries = live(q_path)
    titles = Counter(i["title"] for e in entries for i in e["items"])
    want = [f"{w}-{n}" for w in "ABC" for n in range(LINES)] + [f"item-{n}" for n in range(6)]
    assert sorted(titles) == sorted(want) and set(titles.values()) == {1}
    items = [i for e in entries for i in e["items"]]
    improved = [e for e in env.ledger() if e["result"] == "improved"]
    assert len(improved) == fires
    consumed = {i["title"] for i in items if i.get("claim_status") == "consumed"}
    assert {e["title"] for e in improved} <= consumed  # every fire's claim and finalize applied
    assert not [i for i in items if i.get("claim_status") == "in_progress"]
    by_title = {i["title"]: i for i in items}
    for title, released in done.items():
        assert by_title[title]["claim_status"] == ("available" if released else "consumed"), title
    GitWatch(env).check()  # no index.lock; every improved cycle's commit exists, on a ref
