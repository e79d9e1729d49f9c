"""The append-only ledger (docs/DESIGN.md §3): appends, torn-line repair, malformed lines, backwards tail reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evolve.store.ledger as ledger_mod
from evolve.errors import LedgerError
from evolve.store.ledger import Ledger

TORN_NAME = re.compile(r"^cycle-history\.jsonl\.torn-\d{8}T\d{6}Z(\.\d+)?$")


def line(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def entries(*cycles: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"cycle": c, "result": "improved", "target": f"t{c}", **extra} for c in cycles]


@pytest.fixture
def led(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "evolve" / "cycle-history.jsonl")


def write(led: Ledger, data: bytes) -> None:
    led.path.parent.mkdir(parents=True, exist_ok=True)
    led.path.write_bytes(data)


def asides(led: Ledger) -> list[Path]:
    return sorted(p for p in led.path.parent.iterdir() if p.name != led.path.name)


# -- append ----------------------------------------------------------------------------------


def test_append_creates_file_and_writes_one_line_per_entry(led: Ledger) -> None:
    e1, e2 = entries(1, 2)
    assert led.append(e1) is e1
    led.append(e2)
    data = led.path.read_bytes()
    assert data == line(e1) + line(e2)
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 2
    assert list(led.iter_entries()) == [e1, e2]


def test_append_assigns_nothing(led: Ledger) -> None:
    e = {"cycle": 1, "result": "unchanged", "target": "idle"}
    before = dict(e)
    led.append(e)
    assert e == before
    assert orjson.loads(led.path.read_bytes()) == before


def test_append_accepts_gaps_but_only_increasing(led: Ledger) -> None:
    led.append({"cycle": 3})
    led.append({"cycle": 10})
    assert led.last_cycle() == 10


@pytest.mark.parametrize("cycle", [5, 4, 1, 0, -1])
def test_append_equal_or_lower_cycle_raises(led: Ledger, cycle: int) -> None:
    led.append({"cycle": 5})
    before = led.path.read_bytes()
    with pytest.raises(LedgerError):
        led.append({"cycle": cycle})
    assert led.path.read_bytes() == before


@pytest.mark.parametrize(
    "bad", [{}, {"cycle": None}, {"cycle": "6"}, {"cycle": 6.0}, {"cycle": True}, {"cycle": [6]}, {"result": "x"}]
)
def test_append_without_int_cycle_raises(led: Ledger, bad: dict[str, Any]) -> None:
    with pytest.raises(LedgerError):
        led.append(bad)
    assert not led.path.exists()


def test_append_on_empty_file_starts_anywhere_positive(led: Ledger) -> None:
    write(led, b"")
    led.append({"cycle": 1})
    assert led.last_cycle() == 1


def test_append_compares_against_last_well_formed_cycle(led: Ledger) -> None:
    write(led, line({"cycle": 7}) + b"garbage\n" + line({"note": "no cycle"}) + line({"cycle": True}))
    with pytest.raises(LedgerError):
        led.append({"cycle": 7})
    led.append({"cycle": 8})
    assert led.last_cycle() == 8


def test_append_after_torn_tail_keeps_new_entry_intact(led: Ledger) -> None:
    """docs/DESIGN.md §3: before appending, a torn last line is moved aside, so it never fuses with the new line."""
    write(led, line({"cycle": 1}) + b'{"cycle": 2, "res')
    led.append({"cycle": 2, "result": "improved"})
    assert led.path.read_bytes() == line({"cycle": 1}) + line({"cycle": 2, "result": "improved"})
    assert [e["cycle"] for e in led.iter_entries()] == [1, 2]
    (aside,) = asides(led)
    assert aside.read_bytes() == b'{"cycle": 2, "res'


# -- torn-line repair ------------------------------------------------------------------------


def test_repair_torn_moves_exact_bytes_and_truncates(led: Ledger) -> None:
    good = line({"cycle": 1}) + line({"cycle": 2})
    torn = b'{"cycle": 3, "result": "impr\xff\xfe'
    write(led, good + torn)
    aside = led.repair_torn()
    assert aside is not None
    assert TORN_NAME.match(aside.name), aside.name
    assert aside.parent == led.path.parent
    assert aside.read_bytes() == torn
    assert led.path.read_bytes() == good
    assert asides(led) == [aside]
    assert led.repair_torn() is None  # now clean
    assert led.path.read_bytes() == good


def test_repair_torn_whole_file_is_one_torn_line(led: Ledger) -> None:
    write(led, b'{"cycle": 1')
    aside = led.repair_torn()
    assert aside is not None and aside.read_bytes() == b'{"cycle": 1'
    assert led.path.read_bytes() == b""
    assert led.last_cycle() == 0


def test_repair_torn_valid_json_without_newline_still_torn(led: Ledger) -> None:
    """A line counts only when it ends with a newline, even when its bytes parse."""
    write(led, line({"cycle": 1}) + b'{"cycle": 2}')
    assert led.last_cycle() == 1
    assert [e["cycle"] for e in led.tail(5).entries] == [1]
    aside = led.repair_torn()
    assert aside is not None and aside.read_bytes() == b'{"cycle": 2}'
    assert led.path.read_bytes() == line({"cycle": 1})


@pytest.mark.parametrize("data", [None, b"", b"\n", line({"cycle": 1}), line({"cycle": 1}) + b"junk\n"])
def test_repair_torn_is_noop_on_clean_or_missing_file(led: Ledger, data: bytes | None) -> None:
    if data is not None:
        write(led, data)
        mtime = led.path.stat().st_mtime_ns
    assert led.repair_torn() is None
    if data is None:
        assert not led.path.exists()
        return
    assert led.path.read_bytes() == data
    assert led.path.stat().st_mtime_ns == mtime
    assert asides(led) == []


def test_repair_torn_twice_in_one_second_keeps_both_asides(led: Ledger) -> None:
    write(led, line({"cycle": 1}) + b"first-torn")
    a1 = led.repair_torn()
    with open(led.path, "ab") as fh:
        fh.write(b"second-torn")
    a2 = led.repair_torn()
    assert a1 is not None and a2 is not None and a1 != a2
    assert a1.read_bytes() == b"first-torn"
    assert a2.read_bytes() == b"second-torn"


def test_repair_torn_across_block_boundaries(led: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_mod, "BLOCK", 3)
    good = b"".join(line(e) for e in entries(1, 2, 3))
    torn = b"x" * 50
    write(led, good + torn)
    aside = led.repair_torn()
    assert aside is not None and aside.read_bytes() == torn
    assert led.path.read_bytes() == good


# -- reading ---------------------------------------------------------------------------------


def test_missing_file_reads_empty(led: Ledger) -> None:
    t = led.tail(5)
    assert t.entries == [] and t.malformed == 0 and not t.torn
    assert led.last_cycle() == 0
    assert led.last() is None
    assert list(led.iter_entries()) == []
    assert list(led.scan_back()) == []


def test_tail_returns_last_n_oldest_first(led: Ledger) -> None:
    write(led, b"".join(line(e) for e in entries(*range(1, 11))))
    assert [e["cycle"] for e in led.tail(3).entries] == [8, 9, 10]
    assert [e["cycle"] for e in led.tail(100).entries] == list(range(1, 11))
    assert led.tail(0).entries == []
    assert led.tail(-1).entries == []
    assert led.last() == entries(10)[0]


def test_readers_skip_and_count_malformed_lines(led: Ledger) -> None:
    data = (
        line({"cycle": 1})
        + b"not json at all\n"
        + b"\xff\xfe\x00 binary\n"
        + b"[1, 2, 3]\n"
        + b'"a string"\n'
        + b"42\n"
        + b"null\n"
        + b"\n"
        + b"   \n"
        + line({"cycle": 2})
        + b'{"cycle": 3, "trunc\n'
    )
    write(led, data)
    t = led.tail(10)
    assert [e["cycle"] for e in t.entries] == [1, 2]
    assert t.malformed == 7  # blank lines are not entries and not counted
    assert not t.torn
    assert led.last_cycle() == 2
    assert [e["cycle"] for e in led.iter_entries()] == [1, 2]
    # tail(1) stops at the first good entry from the end: only the lines after it are counted
    t1 = led.tail(1)
    assert [e["cycle"] for e in t1.entries] == [2] and t1.malformed == 1


def test_tail_reports_torn_without_counting_it(led: Ledger) -> None:
    write(led, line({"cycle": 1}) + b'{"cycle": 2')
    t = led.tail(5)
    assert t.torn and t.malformed == 0
    assert [e["cycle"] for e in t.entries] == [1]


def test_last_cycle_skips_malformed_and_cycleless_lines(led: Ledger) -> None:
    data = (
        line({"cycle": 4, "result": "improved"})
        + line({"result": "note", "cycle": None})
        + line({"cycle": "5"})
        + line({"cycle": True})
        + line({"cycle": 5.5})
        + line({"legacy": "entry"})
        + b"{broken\n"
        + b'{"cycle": 99'
    )
    write(led, data)
    assert led.last_cycle() == 4
    # tail returns any well-formed object, cycle or not
    assert led.tail(1).entries == [{"legacy": "entry"}]


def test_iter_entries_full_scan_stops_at_torn_tail(led: Ledger) -> None:
    es = entries(*range(1, 50))
    write(led, b"".join(line(e) for e in es) + b"junk\n" + line({"cycle": 50}) + b'{"cycle": 51}')
    got = list(led.iter_entries())
    assert got == [*es, {"cycle": 50}]


def test_scan_back_is_newest_first(led: Ledger) -> None:
    write(led, b"".join(line(e) for e in entries(1, 2, 3)) + b"junk\n")
    assert [e["cycle"] for e in led.scan_back()] == [3, 2, 1]


def test_huge_line_longer_than_a_block(led: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_mod, "BLOCK", 16)
    big = {"cycle": 2, "summary": "s" * 1000}
    write(led, line({"cycle": 1}) + line(big) + line({"cycle": 3}))
    assert led.tail(2).entries == [big, {"cycle": 3}]
    assert led.last_cycle() == 3


# -- property: backwards reads equal a naive forward parse ----------------------------------


def naive(data: bytes) -> tuple[list[dict[str, Any]], list[int]]:
    """Complete lines only; blank lines ignored; returns well-formed entries and, per entry, how many
    malformed lines follow it before the next entry (index -1 counts those before the first entry)."""
    complete = data[: data.rfind(b"\n") + 1] if b"\n" in data else b""
    good: list[dict[str, Any]] = []
    malformed_after: list[int] = [0]
    for raw in complete.split(b"\n")[:-1]:
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            good.append(obj)
            malformed_after.append(0)
        else:
            malformed_after[-1] += 1
    return good, malformed_after


def naive_last_cycle(good: list[dict[str, Any]]) -> int:
    for e in reversed(good):
        c = e.get("cycle")
        if isinstance(c, int) and not isinstance(c, bool):
            return c
    return 0


json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=12), st.floats(allow_nan=False)
)
entry_st = st.builds(
    lambda cycle, extra: {**({"cycle": cycle} if cycle is not None else {}), **extra},
    st.one_of(st.integers(0, 10**6), st.none(), st.just(True), st.text(max_size=3)),
    st.dictionaries(st.sampled_from(["result", "target", "work_ref", "note", "x\n"]), json_scalar, max_size=3),
)
garbage_st = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.lists(json_scalar, max_size=3).map(orjson.dumps),
    st.sampled_from([b"", b" ", b"\t\r", b"[]", b"{", b"}", b'{"cycle": 3', b"\xff\xfe\xfd", b"null", b"7", b'"s"']),
)
item_st = st.one_of(entry_st.map(lambda e: ("entry", e)), garbage_st.map(lambda g: ("garbage", g)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(item_st, max_size=30),
    torn=st.one_of(st.none(), st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"\n", b"") or b"{")),
    block=st.sampled_from([1, 2, 7, 64, 65536]),
    n=st.integers(1, 35),
)
def test_tail_matches_naive_forward_parse(
    items: list[tuple[str, Any]], torn: bytes | None, block: int, n: int
) -> None:
    data = b"".join(line(x) if kind == "entry" else x + b"\n" for kind, x in items) + (torn or b"")
    good, malformed_after = naive(data)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cycle-history.jsonl"
        path.write_bytes(data)
        led = Ledger(path)
        saved = ledger_mod.BLOCK
        ledger_mod.BLOCK = block
        try:
            t = led.tail(n)
            last_cycle = led.last_cycle()
            backwards = list(led.scan_back())
        finally:
            ledger_mod.BLOCK = saved
        forward = list(led.iter_entries())

        assert t.entries == good[-n:]
        assert t.torn == bool(torn)
        # malformed lines seen walking back until the n-th entry from the end was found
        # (when fewer than n entries exist the walk reaches the front: every malformed line is seen)
        first_kept = max(len(good) - n, -1)
        expected_malformed = sum(malformed_after[first_kept + 1 :])
        assert t.malformed == expected_malformed
        assert last_cycle == naive_last_cycle(good)
        assert backwards == list(reversed(good))
        assert forward == good
        assert path.read_bytes() == data  # readers never write


@settings(max_examples=100, deadline=None)
@given(
    good_count=st.integers(0, 20),
    torn=st.binary(min_size=1, max_size=200).map(lambda b: b.replace(b"\n", b"") or b"x"),
    block=st.sampled_from([1, 7, 64]),
)
def test_repair_torn_property(good_count: int, torn: bytes, block: int) -> None:
    good = b"".join(line(e) for e in entries(*range(1, good_count + 1)))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cycle-history.jsonl"
        path.write_bytes(good + torn)
        saved = ledger_mod.BLOCK
        ledger_mod.BLOCK = block
        try:
            aside = Ledger(path).repair_torn()
        finally:
            ledger_mod.BLOCK = saved
        assert aside is not None and aside.read_bytes() == torn
        assert path.read_bytes() == good


# -- concurrency: two real processes under the fire lock --------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from evolve.store.ledger import Ledger
    from evolve.store.lock import FireLock

    ledger_path, lock_path, writer, count = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    led = Ledger(ledger_path)
    lock = FireLock(lock_path)
    sys.stdin.readline()  # start together
    for i in range(count):
        assert lock.acquire(30), "lock not acquired"
        try:
            led.repair_torn()
            cycle = led.last_cycle() + 1
            led.append({"cycle": cycle, "writer": writer, "i": i, "pad": writer * (200 + 37 * (i % 50))})
        finally:
            lock.release()
    """
)


def test_two_processes_appending_under_fire_lock(tmp_path: Path) -> None:
    ledger_path = tmp_path / "cycle-history.jsonl"
    lock_path = tmp_path / "fire.lock"
    count = 150
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(ledger_path), str(lock_path), name, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name in ("A", "B")
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.flush()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()

    data = ledger_path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 2 * count
    parsed = [orjson.loads(raw) for raw in lines]  # every line is one whole JSON object
    assert all(isinstance(e, dict) for e in parsed)
    assert [e["cycle"] for e in parsed] == list(range(1, 2 * count + 1))
    for name in ("A", "B"):
        mine = [e for e in parsed if e["writer"] == name]
        assert [e["i"] for e in mine] == list(range(count))
        assert all(set(e["pad"]) == {name} for e in mine)
    assert [p.name for p in tmp_path.iterdir() if ".torn-" in p.name] == []
    assert lock_path.exists()
    t = Ledger(ledger_path).tail(10)
    assert t.malformed == 0 and not t.torn


def test_appends_are_durable_lines_readable_by_another_process(led: Ledger) -> None:
    for e in entries(1, 2, 3):
        led.append(e)
    out = subprocess.run(
        [sys.executable, "-c", "import sys; d = open(sys.argv[1], 'rb').read(); print(d.count(b'\\n'), d[-1:])",
         str(led.path)],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "3 b'\\n'"
    assert os.path.getsize(led.path) == len(b"".join(line(e) for e in entries(1, 2, 3)))
