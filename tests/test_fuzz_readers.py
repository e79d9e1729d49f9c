"""Hostile input for every reader (issue 9 §3): hypothesis fuzzers with a bounded number of examples.

Each reader gets random bytes and structured-but-wrong input. The contract checked everywhere: no
exception other than the reader's own documented error, nothing dropped (bad bytes are kept aside or
left in place byte for byte), and what comes out has the types the callers rely on. The last part
sends titles and descriptions full of shell metacharacters, NUL, bidi/zero-width characters and
1 MB strings through a real fire.

Examples per fuzzer are in ``N_*`` below; the whole file runs in well under 30 s.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import string
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from support import Env, entry, git, improved_step, live

from evolve import config as configmod
from evolve.agent import report as reportmod
from evolve.agent import stream
from evolve.errors import ConfigError
from evolve.store import ledger as ledgermod
from evolve.store import session_state
from evolve.store.jsonl import parse_object
from evolve.store.ledger import Ledger
from evolve.work import beads
from evolve.work.goals import GoalsError, load_goals
from evolve.work.harvested import HarvestedQueue
from evolve.work.item import ClaimLost, SourceError, WorkItem

N_FAST = 150  # pure parsers on in-memory input
N_FILES = 80  # readers that touch a temp file per example
N_FIRES = 12  # examples that run a whole in-process fire each

FAST = settings(max_examples=N_FAST, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = settings(max_examples=N_FILES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIRES = settings(max_examples=N_FIRES, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def tmpdir() -> Iterator[Path]:
    """A fresh directory per hypothesis example (pytest's tmp_path is shared by all examples)."""
    with tempfile.TemporaryDirectory(prefix="evolve-fuzz-") as d:
        yield Path(d)


# -- shared strategies -------------------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from([
    "", " ", "\x00", "\n", "\r\n", "\x1b[2J", "\x1b]0;pwned\x07", "\u202e", "\u2066", "\u200b", "\ufeff", "\x9b",
    "$(touch PWNED)", "`id`", "; rm -rf /", "|", "&&", "'", '"', "\\", "{cycle}", "{work_json}", "%s", "\U0001f600",
])
TEXT = st.one_of(st.text(max_size=30), HOSTILE_TEXT)
SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False), TEXT,
)
JSON = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def has_control(s: str) -> bool:
    """C0/C1 controls, bidi overrides/isolates, zero-width characters and the BOM."""
    return bool(re.search(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]", s))


# -- the ledger --------------------------------------------------------------------------------

ENTRY = st.fixed_dictionaries(
    {"cycle": st.one_of(st.integers(-5, 10**6), st.booleans(), st.none(), TEXT, st.floats(allow_nan=False))},
    optional={"result": st.one_of(TEXT, st.sampled_from(["improved", "unchanged", "regressed"])),
              "goals_passing": SCALAR, "goals_total": SCALAR, "junk": JSON},
)
LEDGER_LINE = st.one_of(
    ENTRY.map(dumps),
    JSON.map(dumps),  # lists, strings, numbers: valid JSON, not an entry
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"", b"   ", b"\t\r", b"{", b'{"cycle": 3', b"\xff\xfe", b"\x00" * 3, b"null", b"[]",
                     b'{"cycle": 1}\r', b'{"cycle": 2} trailing']),
)


@st.composite
def ledger_files(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(LEDGER_LINE, max_size=25))
    data = b"".join(line + b"\n" for line in lines)
    if draw(st.booleans()):  # a torn last line (no newline), possibly empty
        data += draw(st.one_of(LEDGER_LINE, st.binary(max_size=10)).map(lambda b: b.replace(b"\n", b"")))
    return data


def model(data: bytes) -> tuple[list[dict[str, Any]], int, bytes]:
    """What the ledger must read: well-formed complete entries, the malformed count, the torn tail."""
    cut = data.rfind(b"\n") + 1
    complete, torn = data[:cut], data[cut:]
    entries, malformed = [], 0
    for line in complete.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            entries.append(obj)
        else:
            malformed += 1
    return entries, malformed, torn


@FILES
@given(data=ledger_files(), n=st.integers(-1, 40), block=st.sampled_from([1, 2, 7, 64, ledgermod.BLOCK]))
def test_ledger_readers_on_random_bytes(data: bytes, n: int, block: int) -> None:
    entries, malformed, torn = model(data)
    saved = ledgermod.BLOCK
    ledgermod.BLOCK = block  # tiny blocks put line boundaries across every block boundary
    try:
        with tmpdir() as d:
            path = d / "cycle-history.jsonl"
            path.write_bytes(data)
            led = Ledger(path)
            t = led.tail(n)
            assert t.entries == (entries[-n:] if n > 0 else [])
            assert t.torn == (torn != b"" and n > 0)
            full = led.tail(10**6)
            assert full.entries == entries and full.malformed == malformed
            assert list(led.iter_entries()) == entries
            assert list(led.scan_back()) == entries[::-1]
            cycles = [c for e in entries if (c := ledgermod.entry_cycle(e)) is not None]
            assert led.last_cycle() == (cycles[-1] if cycles else 0)
            assert led.last() == (entries[-1] if entries else None)
            assert path.read_bytes() == data  # reading never writes

            aside = led.repair_torn()
            if torn:
                assert aside is not None and aside.read_bytes() == torn  # kept byte for byte
                assert path.read_bytes() == data[: len(data) - len(torn)]
            else:
                assert aside is None and path.read_bytes() == data
            assert led.tail(10**6).entries == entries

            nxt = max(led.last_cycle(), 0) + 1
            led.append({"cycle": nxt, "result": "improved"})
            assert led.last() == {"cycle": nxt, "result": "improved"} and led.last_cycle() == nxt
            assert path.read_bytes().startswith(data[: len(data) - len(torn)])
    finally:
        ledgermod.BLOCK = saved


# -- session-state.json ------------------------------------------------------------------------

STATE_FIELDS = [f.name for f in session_state.OWNED]
TYPES = session_state._TYPES
REFS = ["source_epic=e1:item=a", "source_epic=e1:item=b", "source_epic=e1:item=c"]  # the queue the fires use
KEY = st.one_of(TEXT, st.sampled_from(REFS))


def field_ok(name: str, value: Any) -> bool:
    return session_state._type_ok(name, value)


@st.composite
def state_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Known fields with any JSON value (often the wrong type), unknown keys, right containers of junk."""
    obj: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(STATE_FIELDS), max_size=len(STATE_FIELDS), unique=True)):
        kind = TYPES[name][0]
        if kind is dict and draw(st.booleans()):
            obj[name] = draw(st.dictionaries(KEY, st.one_of(JSON, st.sampled_from(REFS)), max_size=4))
        elif kind is list and draw(st.booleans()):
            obj[name] = draw(st.lists(st.one_of(JSON, st.sampled_from(REFS)), max_size=4))
        else:
            obj[name] = draw(JSON)
    obj.update(draw(st.dictionaries(TEXT.filter(lambda k: k not in TYPES), JSON, max_size=3)))
    return obj


def check_state(state: session_state.SessionState) -> None:
    for name in TYPES:
        assert field_ok(name, getattr(state, name)), (name, getattr(state, name))


@FILES
@given(raw=st.one_of(st.binary(max_size=200), JSON.map(dumps), state_objects().map(dumps)),
       ledger=ledger_files())
def test_session_state_load_random_bytes(raw: bytes, ledger: bytes) -> None:
    with tmpdir() as d:
        path, lpath = d / "session-state.json", d / "cycle-history.jsonl"
        path.write_bytes(raw)
        lpath.write_bytes(ledger)
        led = Ledger(lpath)
        ro = session_state.load(path, led, readonly=True)
        check_state(ro.state)
        assert sorted(p.name for p in d.iterdir()) == ["cycle-history.jsonl", "session-state.json"]
        assert path.read_bytes() == raw  # --dry-run writes nothing

        res = session_state.load(path, led)
        check_state(res.state)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = None
        asides = sorted(p for p in d.iterdir() if p.name.startswith("session-state.json."))
        if not isinstance(obj, dict):
            assert res.moved_to is not None and res.moved_to.read_bytes() == raw
            assert not path.exists() and asides == [res.moved_to] and res.warnings
        else:
            assert path.read_bytes() == raw
            bad = [k for k in TYPES if k in obj and not field_ok(k, obj[k])]
            if bad:  # the original bytes are kept aside, the wrong fields reset to their defaults
                assert len(asides) == 1 and asides[0].read_bytes() == raw
                for k in bad:
                    assert getattr(res.state, k) == getattr(session_state.SessionState(), k) or k == "last_logged_cycle"
            else:
                assert asides == []
            assert res.state.extra == {k: v for k, v in obj.items() if k not in TYPES}
        # The state is usable: it saves, and loads back with the same owned values.
        session_state.save(path, res.state)
        again = session_state.load(path, led)
        assert not again.warnings
        for name in TYPES:
            if name != "updated_at":
                assert getattr(again.state, name) == getattr(res.state, name)


# -- the harvested queue (next-work.jsonl) -----------------------------------------------------

ITEM = st.fixed_dictionaries(
    {},
    optional={
        "title": st.one_of(TEXT, SCALAR, JSON), "description": st.one_of(TEXT, JSON),
        "type": st.one_of(st.sampled_from(["bug", "task", "docs", "chore"]), SCALAR),
        "severity": st.one_of(st.sampled_from(["high", "medium", "low"]), SCALAR),
        "claim_status": st.one_of(st.sampled_from(["available", "in_progress", "consumed"]), SCALAR),
        "consumed": SCALAR, "status": st.one_of(st.just("ready"), SCALAR), "requires": st.one_of(st.just([]), JSON),
        "disposition": st.one_of(st.just("defer:later"), SCALAR), "target_repo": st.one_of(st.just("*"), SCALAR),
        "dedup_key": st.one_of(TEXT, SCALAR), "timestamp": SCALAR, "extra": JSON,
    },
)
# Mostly selectable items, so that claim/finalize run on most examples.
GOOD_ITEM = st.fixed_dictionaries({"title": st.text(min_size=1, max_size=20).filter(str.strip)},
                                  optional={"type": st.sampled_from(["bug", "docs"]), "dedup_key": TEXT,
                                            "description": TEXT, "extra": JSON})
QUEUE_LINE = st.one_of(
    st.fixed_dictionaries({"items": st.lists(st.one_of(GOOD_ITEM, ITEM, JSON), max_size=4)},
                          optional={"source_epic": SCALAR, "consumed": SCALAR, "timestamp": SCALAR,
                                    "claim_status": SCALAR, "unknown": JSON}).map(dumps),
    ITEM.map(dumps),  # legacy flat rows
    st.one_of(JSON.map(dumps), st.fixed_dictionaries({"items": JSON}).map(dumps)),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"{broken", b"\x00\x01", b"\xff", b'{"items": [{"title": "a"}', b"  ", b"",
                     b'{"title": "crlf"}\r', b'{"items": [{"title": "dup"}, {"title": "dup"}]}']),
)


def blank(line: bytes) -> bool:
    return not line.strip()


@FILES
@given(lines=st.lists(QUEUE_LINE, max_size=12), torn=st.booleans(), quality=st.booleans(),
       repo=st.sampled_from([(), ("repo",), ("owner/repo", "repo")]),
       good=st.one_of(st.none(), st.tuples(st.integers(0, 12), st.lists(GOOD_ITEM, min_size=1, max_size=3))))
def test_harvested_queue_on_random_lines(lines: list[bytes], torn: bool, quality: bool, repo: tuple[str, ...],
                                         good: tuple[int, list[dict[str, Any]]] | None) -> None:
    if good is not None:  # most examples get something selectable among the junk
        lines = [*lines[: good[0]], dumps({"source_epic": "e", "items": good[1]}), *lines[good[0]:]]
    data = b"\n".join(lines) + (b"" if torn or not lines else b"\n")
    with tmpdir() as d:
        path = d / "next-work.jsonl"
        path.write_bytes(data)
        q = HarvestedQueue(path, repo_names=repo, quality=quality)
        cands = q.candidates()
        assert path.read_bytes() == data  # reading never writes
        for c in cands:
            assert isinstance(c, WorkItem) and c.source == "harvested"
            assert isinstance(c.title, str) and not has_control(c.title)  # (may be "" for a title of controls)
            assert isinstance(c.ref, str) and isinstance(c.description, str) and len(c.description) <= 4000
        assert HarvestedQueue(path, repo_names=repo, quality=quality).candidates() == cands  # deterministic
        event("queue: an item to claim" if cands else "queue: nothing selectable")
        if not cands:
            return
        item = cands[0]
        q.claim(item, "evolve:cycle-1", "2026-01-01T00:00:00Z")
        # In place: one line's bytes changed, at the same offset and length (its new content, or a
        # tombstone when it moved to the end); every other byte (malformed lines too) is where it was.
        after_claim = path.read_bytes()
        old_lines, new_lines = data.split(b"\n"), after_claim[: len(data)].split(b"\n")
        changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True)) if a != b]
        assert len(changed) == 1 and len(old_lines[changed[0]]) == len(new_lines[changed[0]])
        assert after_claim[len(data):].count(b"\n") <= 2  # a move's copy (after a newline for a torn tail)
        assert item.ref not in {c.ref for c in q.candidates()} or sum(c.ref == item.ref for c in cands) > 1
        q.finalize(item, "evolve:cycle-1", "2026-01-01T00:00:01Z")
        after = path.read_bytes()
        assert after[: len(data)].split(b"\n")[: changed[0]] == old_lines[: changed[0]]
        done = []
        for raw in after.split(b"\n"):
            line = parse_object(raw) or {}
            items = line["items"] if isinstance(line.get("items"), list) else [line]
            done += [i for i in items if isinstance(i, dict) and i.get("claim_status") == "consumed"
                     and i.get("consumed_by") == "evolve:cycle-1"]
        assert len(done) == 1 and done[0].get("claimed_at") == "2026-01-01T00:00:00Z"
        with pytest.raises(ClaimLost):  # a consumed item cannot be claimed again
            q.claim(WorkItem("harvested", item.ref + "\x00gone", "x"), "evolve:cycle-2", "2026-01-01T00:00:02Z")


# -- beads (bd ready --json) -------------------------------------------------------------------

BEAD = st.fixed_dictionaries(
    {"id": st.one_of(TEXT, SCALAR)},
    optional={"title": st.one_of(TEXT, JSON), "priority": SCALAR, "labels": st.one_of(st.lists(
        st.one_of(st.sampled_from(["operator-shape", "OPERATOR-SHAPE", "ci-red", "x"]), SCALAR), max_size=3), JSON),
        "created_at": SCALAR, "description": st.one_of(TEXT, JSON), "issue_type": SCALAR, "type": SCALAR},
)
BEADS_OUTPUT = st.one_of(
    st.binary(max_size=100),
    JSON.map(dumps),
    st.lists(st.one_of(BEAD, JSON), max_size=8).map(dumps),
    st.tuples(st.sampled_from(["issues", "items", "data", "other"]), st.lists(st.one_of(BEAD, JSON), max_size=8))
    .map(lambda kv: dumps({kv[0]: kv[1]})),
)


@FAST
@given(raw=BEADS_OUTPUT)
def test_beads_parse_and_rank_on_random_output(raw: bytes) -> None:
    try:
        parsed = beads.parse_ready(raw)
    except SourceError:
        event("beads: SourceError")
        return  # a probe error: never "no work"
    event(f"beads: {min(len(parsed), 3)}+ parsed")
    ranked = beads.rank(parsed)
    assert all(b in parsed for b in ranked)
    assert [beads._priority(b) for b in ranked] == sorted(beads._priority(b) for b in ranked)
    for b in ranked:
        item = beads.to_item(b)
        assert item.ref == f"bead:{b['id']}" and not has_control(item.title)
        assert isinstance(item.description, str) and item.severity in ("high", "medium", "low")


# -- GOALS.yaml / GOALS.md ---------------------------------------------------------------------

YAML_SCALAR = st.one_of(
    st.sampled_from(["1", "2", "3", "'2'", "4", "true", "null", "~", "''", "[]", "{}", "1.5", "0x10", "1e3",
                     "2020-01-01", "2020-13-45", "2024-02-30 10:00:00", "12:30:00", "'²'", "'٣'", "!!str 1",
                     "!!binary aGk=", "&a x", "*a", "|\n  block", ">\n  folded", "'" + "9" * 5000 + "'",
                     "echo ok", "exit 1", "\"a\\x00b\"", "'$(touch PWNED)'"]),
    st.text(alphabet=string.printable, max_size=15),
)


VALID_YAML = {
    "version": st.sampled_from(["1", "2", "3", "'2'"]), "id": st.sampled_from(["tests", "lint", "'g-1'", "7"]),
    "check": st.sampled_from(["make test", "'exit 0'", "echo ok && true"]), "weight": st.sampled_from(["1", "5", "10"]),
    "type": st.sampled_from(["health", "quality", "meta"]), "tags": st.sampled_from(["[a, b]", "'x, y'", "[]"]),
    "description": st.sampled_from(["a goal", "''"]), "continuous": st.sampled_from(["{metric: m, threshold: 0.5}"]),
    "other": st.just("1"),
}


def yaml_value(draw: st.DrawFn, key: str) -> str:
    return draw(VALID_YAML[key]) if draw(st.integers(0, 3)) else draw(YAML_SCALAR)


@st.composite
def goals_yaml(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=80))
    lines = [f"version: {yaml_value(draw, 'version')}"]
    if draw(st.integers(0, 3)) == 0:
        lines.append(f"goals: {draw(YAML_SCALAR)}")
    else:
        lines.append("goals:")
        for i in range(draw(st.integers(0, 3))):
            keys = ["id", "check", "weight"] if draw(st.integers(0, 5)) else []
            keys += draw(st.lists(st.sampled_from(["id", "check", "weight", "type", "tags", "description",
                                                   "continuous", "other"]), max_size=4))
            keys = list(dict.fromkeys(keys))
            for j, k in enumerate(keys):
                value = f"g-{i}" if k == "id" and draw(st.integers(0, 3)) else yaml_value(draw, k)
                lines.append(f"  {'- ' if j == 0 else '  '}{k}: {value}")
            if not keys:
                lines.append(f"  - {draw(YAML_SCALAR)}")
    return "\n".join(lines) + "\n"


MD_CELL = st.one_of(st.sampled_from(["a", "`echo ok`", "3", "11", "0", "x", "", "\\|", "`a | b`", "``", "health",
                                      "meta", "bogus", "t1, t2", "9" * 5000, "²", "\x00", "\u202e"]),
                    st.text(max_size=8))


@st.composite
def goals_md(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=80))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["table", "directives", "fence", "text", "heading"]))
        if kind == "table":
            cols = draw(st.permutations(["ID", "Check", "Weight", "Description", "Tags", "Type"]))[
                : draw(st.integers(2, 6))]
            if draw(st.integers(0, 3)):  # mostly the gates table (only it holds goals), sometimes any table
                out.append(draw(st.sampled_from(["## Gates", "## gates", "## Gates ##"])))
            out.append("| " + " | ".join(cols) + " |")
            out.append("|" + "---|" * len(cols))
            for _ in range(draw(st.integers(0, 3))):
                n = len(cols) + draw(st.sampled_from([0, 0, 0, -1, 1]))
                out.append("| " + " | ".join(draw(MD_CELL) for _ in range(max(n, 0))) + " |")
        elif kind == "directives":
            out.append("## Directives")
            for _ in range(draw(st.integers(0, 3))):
                num = draw(st.sampled_from(["1", "2", "٣", "9" * 5000, "x"]))
                out.append(f"### {num}. {draw(st.text(max_size=10))}")
                out.append(f"**{draw(st.sampled_from(['Steer', 'Directive ID', 'Scenarios']))}:** {draw(MD_CELL)}")
                out.append(draw(st.text(max_size=20)))
        elif kind == "fence":
            out.append(draw(st.sampled_from(["```", "~~~"])))
        elif kind == "heading":
            out.append("#" * draw(st.integers(1, 7)) + " " + draw(st.text(max_size=10)))
        else:
            out.append(draw(st.text(max_size=40)))
    return "\n".join(out) + "\n"


def check_goals(name: str, text: str | bytes) -> None:
    with tmpdir() as d:
        p = d / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            gf = load_goals(d)
        except GoalsError as exc:
            event("goals: GoalsError")
            msg = str(exc)
            assert msg.startswith(str(p)) and "\n" not in msg  # one line naming the file
            return
        event(f"goals: parsed, {min(len(gf.goals), 2) if gf else 0}+ goals")
        assert gf is not None and len(gf.era) == 12
        for g in gf.goals:
            assert isinstance(g.id, str) and g.id and not re.search(r"[\x00-\x1f\x7f]", g.id)
            assert isinstance(g.check, str) and g.check.strip() and 1 <= g.weight <= 10
            assert all(isinstance(t, str) and t for t in g.tags)
        assert len({g.id for g in gf.goals}) == len(gf.goals)


@FAST
@given(text=st.one_of(goals_yaml(), st.binary(max_size=60)), name=st.sampled_from(["GOALS.yaml", "GOALS.yml"]))
def test_goals_yaml_only_goals_error(text: str | bytes, name: str) -> None:
    check_goals(name, text)


@FAST
@given(text=st.one_of(goals_md(), st.binary(max_size=60)))
def test_goals_md_only_goals_error(text: str | bytes) -> None:
    check_goals("GOALS.md", text)


@pytest.mark.parametrize(("name", "text"), [
    ("GOALS.yaml", "version: 2020-13-45\ngoals: []\n"),
    ("GOALS.yaml", "version: 1\ngoals:\n  - id: a\n    check: 'true'\n    weight: 1\n    added: 2024-02-30\n"),
    ("GOALS.yaml", "version: '²'\ngoals: []\n"),
    ("GOALS.yaml", "version: 1\ngoals:\n  - id: a\n    check: x\n    weight: '" + "1" * 5000 + "'\n"),
    ("GOALS.yaml", "[" * 2000),
    ("GOALS.md", "## Directives\n### " + "1" * 5000 + ". t\n"),
], ids=["bad-date-version", "bad-date-field", "superscript-version", "long-weight-yaml", "deep-nesting",
        "long-directive-number"])
def test_goals_found_by_the_fuzzers_are_goals_errors(name: str, text: str) -> None:
    """These escaped load_goals as ValueError/RecursionError (PyYAML dates, int() digit limit, '²', nesting)."""
    with tmpdir() as d:
        (d / name).write_text(text, encoding="utf-8")
        with pytest.raises(GoalsError, match="unusable content"):
            load_goals(d)


def test_a_markdown_weight_too_long_for_int_costs_its_row_the_default_weight() -> None:
    """It escaped as ValueError (int() digit limit); now, like any bad weight, it gets weight 5 and a warning."""
    with tmpdir() as d:
        table = "## Gates\n| ID | Check | Weight |\n|---|---|---|\n"
        (d / "GOALS.md").write_text(table + "| a | x | " + "1" * 5000 + " |\n")
        gf = load_goals(d)
        assert gf is not None and [(g.id, g.weight) for g in gf.goals] == [("a", 5)]
        (w,) = gf.warnings
        assert "weight is no integer 1-10; default weight 5 used" in w and len(w) < 400


# -- agent stream-json ---------------------------------------------------------------------------

USAGE = st.one_of(JSON, st.fixed_dictionaries({}, optional={
    k: st.one_of(st.integers(-10, 10**9), st.floats(allow_nan=False), SCALAR)
    for k in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")}))
STREAM_MSG = st.one_of(
    st.fixed_dictionaries({"type": st.just("system"), "subtype": st.sampled_from(
        ["init", "compact_boundary", "api_retry", "other"])}, optional={
        "session_id": st.one_of(TEXT, SCALAR, JSON), "model": st.one_of(TEXT, SCALAR),
        "error_status": st.one_of(st.just(429), SCALAR), "retry_delay_ms": SCALAR, "compact_metadata": JSON}),
    st.fixed_dictionaries({"type": st.just("assistant")}, optional={
        "session_id": st.one_of(TEXT, SCALAR),
        "message": st.one_of(JSON, st.fixed_dictionaries({}, optional={
            "model": st.one_of(st.just("<synthetic>"), TEXT, SCALAR), "usage": USAGE, "content": JSON}))}),
    st.fixed_dictionaries({"type": st.just("result")}, optional={
        "subtype": st.one_of(st.sampled_from(["success", "error_max_turns", "error_during_execution"]), SCALAR),
        "is_error": SCALAR, "session_id": st.one_of(TEXT, SCALAR, JSON), "num_turns": SCALAR,
        "total_cost_usd": SCALAR, "usage": USAGE, "api_error_status": st.one_of(
            st.sampled_from([429, 401, 500, 529, 408]), SCALAR),
        "terminal_reason": st.one_of(st.just("prompt_too_long"), SCALAR), "errors": JSON,
        "modelUsage": st.one_of(JSON, st.dictionaries(TEXT, st.one_of(JSON, st.fixed_dictionaries(
            {"contextWindow": SCALAR})), max_size=3)),
        "result": st.one_of(TEXT, SCALAR, st.builds(
            lambda body: f"done\n```evolve-report\n{body}\n```", st.one_of(JSON.map(lambda o: dumps(o).decode()),
                                                                          TEXT)))}),
    st.fixed_dictionaries({"type": st.one_of(TEXT, SCALAR)}, optional={"subtype": SCALAR, "session_id": SCALAR}),
    JSON,
)


def check_report(rep: reportmod.AgentReport) -> None:
    assert rep.result in reportmod.AGENT_RESULTS
    assert rep.session_id is None or (isinstance(rep.session_id, str) and rep.session_id)
    assert isinstance(rep.disposition, str) and len(rep.disposition) <= 500
    assert isinstance(rep.summary, str) and isinstance(rep.error, str)
    assert all(isinstance(w, dict) for w in rep.new_work)
    assert all(isinstance(p, str) and len(p) <= 500 for p in rep.percepts) and len(rep.percepts) <= 20
    assert isinstance(rep.cost_usd, float) and math.isfinite(rep.cost_usd) and rep.cost_usd >= 0
    for n in (rep.num_turns, rep.context_window, *rep.usage.as_json().values()):
        assert isinstance(n, int) and not isinstance(n, bool) and n >= 0
    assert rep.error_class is None or rep.error_class in reportmod.ERROR_CLASSES
    assert (rep.error_class is not None) == (rep.result == "failed")
    orjson.dumps({**rep.__dict__, "usage": rep.usage.as_json()})  # the ledger can always record it


@FAST
@given(msgs=st.lists(STREAM_MSG, max_size=8), junk=st.lists(st.binary(max_size=20), max_size=2),
       chunk=st.integers(1, 64), tail=TEXT)
def test_stream_state_on_structured_random_messages(msgs: list[Any], junk: list[bytes], chunk: int,
                                                    tail: str) -> None:
    data = b"".join(dumps(m) + b"\n" for m in msgs) + b"\n".join(junk)
    s = stream.StreamState()
    for i in range(0, len(data), chunk):
        s.feed(data[i:i + chunk])
    s.finish()
    assert s.session_id is None or isinstance(s.session_id, str)
    assert s.model is None or isinstance(s.model, str)
    assert isinstance(s.turns, int) and isinstance(s.compactions, int)
    p = s.progress()
    assert all(isinstance(v, int) and v >= 0 for v in p.values())
    wait = stream.retry_after_s(s)
    assert wait is None or (isinstance(wait, float) and math.isfinite(wait) and wait >= 0)
    stream.invalid_session(tail, s.result)
    if s.result is not None:
        stream.classify(s.result, tail)
    check_report(stream.to_report(s, output_tail=tail))
    check_report(stream.to_report(s, output_tail=tail, window_override=1000))


# -- the agent's JSON report ---------------------------------------------------------------------

REPORT_OBJ = st.fixed_dictionaries({}, optional={
    "result": st.one_of(st.sampled_from(list(reportmod.AGENT_RESULTS)), SCALAR, JSON),
    "disposition": st.one_of(TEXT, SCALAR, st.text(min_size=600, max_size=700)), "summary": st.one_of(TEXT, JSON),
    "new_work": st.one_of(JSON, st.lists(st.one_of(JSON, st.dictionaries(TEXT, JSON, max_size=3)), max_size=4)),
    "percepts": st.one_of(JSON, st.lists(st.one_of(TEXT, SCALAR, st.text(min_size=501, max_size=510)),
                                         max_size=25)),
    "session_id": st.one_of(TEXT, SCALAR), "usage": USAGE, "cost_usd": st.one_of(
        st.floats(), SCALAR), "context_window": SCALAR, "num_turns": SCALAR, "context_heavy": SCALAR,
    "compacted": SCALAR, "context_overflow": SCALAR, "error_class": st.one_of(
        st.sampled_from(list(reportmod.ERROR_CLASSES)), SCALAR), "error": st.one_of(TEXT, JSON),
})


@FAST
@given(obj=st.one_of(REPORT_OBJ, JSON, st.floats()))
def test_parse_report_on_random_objects(obj: Any) -> None:
    rep = reportmod.parse_report(obj)
    check_report(rep)
    if isinstance(obj, dict) and obj.get("result") in reportmod.AGENT_RESULTS:
        assert rep.result == obj["result"]
    else:
        assert (rep.result, rep.error_class) == ("failed", "crashed")


# -- config.toml, EVOLVE_* env and flags -----------------------------------------------------------

SECTION_NAMES = list(configmod.SECTIONS)
FIELDS = {s: list(configmod._section_fields(s)) for s in SECTION_NAMES}
TOML_VALUE = st.recursive(
    st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), TEXT,
              st.datetimes(), st.dates(), st.times(), st.sampled_from(["claude", "command", "http", "burst", "loop"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)


def near(default: Any) -> st.SearchStrategy[Any]:
    """A value of the default's own type, often valid: the default, a neighbour, or an edge."""
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int | float):
        kind = type(default)
        return st.sampled_from([default, kind(0), kind(1), default * 2, kind(-1), kind(10**6)])
    if isinstance(default, str):
        return st.one_of(st.just(default), TEXT)
    return st.one_of(st.just(default), st.lists(TEXT, max_size=3), st.lists(st.lists(TEXT, max_size=2), max_size=2))


@st.composite
def toml_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if draw(st.booleans()):  # known sections and keys, values of the right type (often in range)
        for section in draw(st.lists(st.sampled_from(SECTION_NAMES), max_size=4, unique=True)):
            keys = draw(st.lists(st.sampled_from(FIELDS[section]), max_size=4, unique=True))
            doc[section] = {k: draw(near(getattr(configmod.SECTIONS[section](), k))) for k in keys}
        return doc
    for section in draw(st.lists(st.one_of(st.sampled_from(SECTION_NAMES), TEXT), max_size=4, unique=True)):
        if section in FIELDS and draw(st.integers(0, 5)):
            keys = st.one_of(st.sampled_from(FIELDS[section]), TEXT) if draw(st.integers(0, 3)) == 0 \
                else st.sampled_from(FIELDS[section])
            doc[section] = {}
            for key in draw(st.lists(keys, max_size=4, unique=True)):
                default = getattr(configmod.SECTIONS[section](), key, None)
                doc[section][key] = default if default is not None and draw(st.booleans()) else draw(TOML_VALUE)
        else:
            doc[section] = draw(TOML_VALUE)
    return doc


ENV_NAMES = sorted({f"EVOLVE_{s.upper()}_{k.upper()}" for s in SECTION_NAMES for k in FIELDS[s]}
                   | set(configmod.LEGACY_ENV))
ENV_VALUE = st.one_of(TEXT, st.integers().map(str), st.floats().map(str), JSON.map(lambda v: dumps(v).decode()),
                      st.sampled_from(["1", "0", "yes", "off", "1e400", "-1", "[]", '["a"]', '[["a"]]', "nan",
                                       "'unclosed", "a\udcffb", "\x00", "claude", "loop", "7"]))


@FAST
@given(doc=toml_docs(), env=st.dictionaries(st.sampled_from(ENV_NAMES), ENV_VALUE, max_size=4),
       flags=st.one_of(st.none(), st.dictionaries(st.sampled_from(SECTION_NAMES), st.dictionaries(
           st.sampled_from(sorted({k for ks in FIELDS.values() for k in ks})), TOML_VALUE, max_size=2), max_size=2)))
def test_config_resolve_only_config_error(doc: dict[str, Any], env: dict[str, str],
                                          flags: dict[str, dict[str, Any]] | None) -> None:
    flags = {s: {k: v for k, v in t.items() if k in FIELDS[s]} for s, t in (flags or {}).items()}
    try:
        cfg = configmod.resolve(doc, "/r/.agents/evolve/config.toml", env, flags)
    except ConfigError as exc:
        event("config: ConfigError")
        assert not has_control(str(exc)), str(exc)  # one printable line, whatever the keys hold
        return
    event("config: resolved")
    assert isinstance(cfg, configmod.Config)
    for section in configmod.SECTIONS:
        for key, tp in configmod._section_fields(section).items():
            configmod._check(getattr(getattr(cfg, section), key), tp, "x", key)  # every value has its type


@FAST
@given(text=st.one_of(st.text(max_size=120), st.binary(max_size=120).map(lambda b: b.decode("latin-1"))))
def test_config_load_random_toml_text(text: str) -> None:
    with tmpdir() as d:
        p = d / "config.toml"
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            configmod.load(p, {})
        except ConfigError as exc:
            assert not has_control(str(exc)), str(exc)


# -- a whole fire on a hostile session-state.json ------------------------------------------------


def make_env(root: Path) -> Env:
    """The ``env`` fixture of tests/support.py, for one hypothesis example."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "README.md").write_text("# test repo\n", encoding="utf-8")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "initial")
    (repo / ".agents").mkdir()
    (repo / ".agents" / ".gitignore").write_text("*\n", encoding="utf-8")
    e = Env(root=root, repo=repo, xdg=root / "xdg", script=root / "agent.json")
    e.steps([improved_step()])
    e.write_config(
        agent={"runner": "command", "argv": [sys.executable, "-m", "evolve.agent.scripted", "--script",
                                             str(e.script)], "timeout_s": 60, "idle_timeout_s": 30},
        fire={"max_cycles": 5},
    )
    return e


def run_fire(e: Env, cycles: int) -> Any:
    from evolve import log
    from evolve.cycle.fire import Fire, FireOptions

    with open(e.root / "log.jsonl", "ab") as fh:
        log.configure(json=True, stream=fh)
        return Fire(e.paths, e.cfg(e.env()), FireOptions(cycles=cycles), env=e.env()).run()


def no_live_pgid(obj: dict[str, Any]) -> dict[str, Any]:
    """session-state.fire.agent_pgid names a process group the next fire kills: never a real one here."""
    fire = obj.get("fire")
    if isinstance(fire, dict) and isinstance(fire.get("agent_pgid"), int) and fire["agent_pgid"] > 1:
        obj = {**obj, "fire": {**fire, "agent_pgid": 2**31 - 1}}  # above any pid_max: never alive
    return obj


@FIRES
@given(obj=state_objects().map(no_live_pgid), steps=st.permutations([
    improved_step(),
    {"report": {"result": "failed", "error_class": "transient", "error": "boom", "percepts": ["p"]}},
    {"report": {"result": "scout", "disposition": "context-too-heavy"}},
]))
@example(obj={"attempts": {REFS[0]: "x"}, "percepts": [1, None]}, steps=[  # found by this fuzzer; fixed
    {"report": {"result": "failed", "error_class": "transient", "error": "boom"}}, improved_step(), improved_step()])
def test_fire_runs_on_a_hostile_session_state(obj: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    with tmpdir() as root:
        e = make_env(root)
        e.queue(entry("a", "b", "c"))
        e.steps(steps)
        e.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
        raw = dumps(obj)
        e.paths.state.write_bytes(raw)
        out = run_fire(e, cycles=3)
        assert out.exit_code == 0, (out, (e.root / "log.jsonl").read_text()[-2000:])
        st_after = session_state.load(e.paths.state, Ledger(e.paths.ledger))
        assert not st_after.warnings  # what the fire saved is well-typed
        assert st_after.state.fire is None and st_after.state.claimed_work is None
        kept = [p for p in e.paths.evolve_dir.iterdir() if p.name.startswith("session-state.json.invalid-")]
        if any(k in obj and not field_ok(k, obj[k]) for k in TYPES):
            assert len(kept) == 1 and kept[0].read_bytes() == raw
        for k, v in obj.items():  # unknown keys survive the fire
            if k not in TYPES:
                assert st_after.state.extra.get(k) == v
        cycles = [c["cycle"] for c in e.ledger()]
        assert cycles == sorted(set(cycles))
        for line in e.paths.nextwork.read_bytes().splitlines():
            for it in orjson.loads(line)["items"]:
                assert it.get("claim_status") != "in_progress"


# -- hostile titles and descriptions through a real fire -----------------------------------------

SGR = re.compile(rb"\x1b\[[0-9;]*m")  # the colours structlog's console renderer adds itself


def payloads(canary: Path) -> dict[str, str]:
    c = str(canary)
    return {
        "shell": f"x'; touch {c} #$(touch {c})`touch {c}`|touch {c}&&touch {c};\ntouch {c} $(IFS=,;touch${{IFS}}{c})",
        "placeholders": "{cycle} {work_json} {prompt_file} {session_id} %s %(x)s ${HOME} $((1+1)) *",
        "nul": "nul\x00byte \x00\x00 end",
        "terminal": "t \x1b]0;PWNED\x07 \x1b[2J \x9b2J \r over\x08 \x7f bell\x07 \x1bc",
        "bidi": "bidi \u202egnp.exe\u202c zw\u200b\u200c\u200d\ufeff \u2066iso\u2069 \u200e\u200f",
    }


def controls_in(text: str) -> set[str]:
    return set(re.findall(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]", text))


def hostile_env(e: Env, titles: dict[str, str], kind: str = "task") -> None:
    e.write_config(agent={"argv": [sys.executable, "-m", "evolve.agent.scripted", "--script", str(e.script),
                                   "--work={work_json}", "{session_id}"]})
    e.steps([{"write": [{"path": "src/out.txt", "content": "cycle {cycle}\n", "append": True}],
              "report": {"result": "improved", "summary": "ok"}}])
    for name, t in titles.items():
        e.queue(entry(t, epic=f"e-{name}", description=f"{t}\n{t}", notes=t, type=kind))


def test_hostile_titles_never_reach_a_shell_and_round_trip(env: Env, cli) -> None:
    canary = env.root / "CANARY"
    titles = payloads(canary)
    hostile_env(env, titles)
    before = env.paths.nextwork.read_bytes()
    r = cli("fire", "--cycles", str(len(titles)))
    assert r.code == 0, r.stderr
    assert not canary.exists() and not (env.repo / "CANARY").exists() and not list(env.repo.rglob("PWNED*"))

    # The ledger round-trips each title exactly (the ref is the raw title); the title is a clean line.
    ledger = env.ledger()
    assert [e["result"] for e in ledger] == ["improved"] * len(titles)
    assert sorted(e["work_ref"] for e in ledger) == sorted(f"source_epic=e-{n}:item={t}" for n, t in titles.items())
    for e in ledger:
        assert not controls_in(e["title"]) and e["title"].strip()
    # The queue keeps every hostile field byte for byte; only the claim fields changed.
    after = {e["source_epic"]: e for e in live(env.paths.nextwork)}  # (claimed lines moved to the end)
    assert len(after) == len(before.splitlines())
    for old in before.splitlines():
        o = orjson.loads(old)["items"][0]
        n = after[orjson.loads(old)["source_epic"]]["items"][0]
        assert n["claim_status"] == "consumed"
        assert {k: n[k] for k in o} == o
    # The agent got the work as data: one argv element, JSON in env, placeholders never re-expanded.
    for call in env.calls():
        assert len(call["argv"]) == 4 and call["argv"][2].startswith("--work=")
        work = orjson.loads(call["env"]["EVOLVE_WORK_JSON"])
        assert call["argv"][2] == "--work=" + call["env"]["EVOLVE_WORK_JSON"]
        assert not controls_in(work["title"]) and work["description"]
    assert any("{cycle} {work_json}" in orjson.loads(c["env"]["EVOLVE_WORK_JSON"])["title"] for c in env.calls())
    # Commit messages are clean lines.
    for msg in git(env.repo, "log", "--format=%B%x1e").split("\x1e"):
        assert not controls_in(msg.strip().replace("\n", " ")), repr(msg)
    # Log lines (JSON, not a terminal here) are one JSON object each, with no raw C0 control.
    for line in r.stderr.splitlines():
        assert isinstance(orjson.loads(line), dict)
        assert not re.search(r"[\x00-\x1f]", line)
    # --dry-run shows the next item's agent plan as JSON, runs nothing.
    hostile_env(env, {"again": titles["shell"] + " 2"}, kind="bug")  # (five "task" cycles in a row: metronome)
    d = cli("fire", "--dry-run")
    assert d.code == 0, d.stderr
    plan = orjson.loads(d.stdout)  # the one document on stdout (logs: stderr)
    assert plan["selection"] is not None, plan["why"]
    assert plan["selection"]["ref"] == f"source_epic=e-again:item={titles['shell']} 2"
    assert not canary.exists()


def run_in_pty(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, bytes]:
    """Run ``argv`` with a pseudo-terminal as stdin/stdout/stderr; returns (exit code, everything it wrote)."""
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
    return proc.wait(timeout=timeout), out


def test_hostile_titles_on_a_terminal_are_escaped(env: Env) -> None:
    canary = env.root / "CANARY"
    titles = payloads(canary)
    hostile_env(env, {k: titles[k] for k in ("shell", "terminal", "bidi", "nul")})
    code, out = run_in_pty([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "4"],
                           env.env())
    assert code == 0, out[-2000:]
    assert b"cycle.end" in out and not canary.exists()
    text = SGR.sub(b"", out).replace(b"\r\n", b"\n").decode()
    assert not controls_in(text.replace("\n", "")), sorted(map(hex, map(ord, controls_in(text.replace("\n", "")))))


def test_one_megabyte_description_and_notes_flow_through_a_fire(env: Env, cli) -> None:
    big = ("D" * 1000 + " $(touch CANARY) \u202e\x00\x1b[2J\n") * 1000  # ~1 MB
    env.queue(entry("big description", description=big, notes=big))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[0]["result"] == "improved"
    work = orjson.loads(env.calls()[0]["env"]["EVOLVE_WORK_JSON"])
    assert big.startswith(work["description"]) and len(work["description"]) <= 4000
    (item,) = live(env.paths.nextwork)[0]["items"]
    assert item["description"] == big and item["notes"] == big and item["claim_status"] == "consumed"
    assert not (env.repo / "CANARY").exists() and len(r.stdout) < 100_000  # the 1 MB never reached the log


def test_one_megabyte_title_flows_through_a_fire(env: Env, cli) -> None:
    """Found here: the raw 1 MB ref went into EVOLVE_WORK_JSON and exec failed with E2BIG (fire exit 1)."""
    big = ("T" * 1000 + " $(touch CANARY) \u202e") * 1000
    env.queue(entry(big))
    r = cli("fire", "--cycles", "1")
    assert not (env.repo / "CANARY").exists()
    led = env.ledger()
    assert led[0]["work_ref"] == f"source_epic=e1:item={big}"
    assert r.code == 0 and led[0]["result"] == "improved", (r.code, led[0].get("error"))


def test_history_on_a_terminal_escapes_agent_text(env: Env) -> None:
    """The agent's disposition lands in the ledger as it is; `evolve history` must not replay it raw."""
    hostile = payloads(env.root / "CANARY")["terminal"]
    env.queue(entry("a"))
    env.steps([{"write": [{"path": "x.txt", "content": "x\n"}],
                "report": {"result": "improved", "disposition": hostile, "summary": hostile}}])
    code, _ = run_in_pty([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                         env.env())
    assert code == 0
    code, out = run_in_pty([sys.executable, "-m", "evolve", "--repo", str(env.repo), "history"], env.env())
    assert code == 0 and b"improved" in out
    text = SGR.sub(b"", out).replace(b"\r\n", b"\n").decode()
    assert not controls_in(text.replace("\n", ""))


def test_json_outputs_escape_c1_bidi_and_zero_width(env: Env, cli) -> None:
    """Found here: JSON escapes C0 only; C1 (U+009B CSI), DEL, bidi and zero-width went out raw."""
    hostile = payloads(env.root / "CANARY")["bidi"] + " \x9b2J \x7f"
    env.queue(entry(hostile), entry(hostile + " 2"))
    outs = [cli("fire", "--cycles", "1").stdout, cli("fire", "--dry-run").stdout, cli("history", "--json").stdout]
    for out in outs:
        assert not controls_in(out.replace("\n", "")), sorted(map(hex, map(ord, controls_in(out))))


# -- the harness: settings.json, the SessionStart hook's stdin and cycle-state, hand-off requests ----

try:
    from evolve.harness import autocompact as ac
    from evolve.harness import handoff as hand
    from evolve.harness import hooks
except ImportError:  # pragma: no cover - the harness modules are optional for this file
    ac = hand = hooks = None  # type: ignore[assignment]
harness = pytest.mark.skipif(hooks is None, reason="evolve/harness is not there yet")

PCT = st.one_of(st.sampled_from(["40", "100", "1", "0", "101", "040", " 40", "4.0", "-1", "", "83", "84"]),
                st.integers(-5, 200), SCALAR, JSON)
SETTINGS = st.one_of(
    st.binary(max_size=60),
    JSON.map(dumps),
    st.fixed_dictionaries({}, optional={
        "env": st.one_of(JSON, st.dictionaries(st.one_of(st.just("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"), TEXT), PCT,
                                               max_size=3)),
        "hooks": st.one_of(JSON, st.fixed_dictionaries({}, optional={"SessionStart": st.one_of(JSON, st.lists(
            st.one_of(JSON, st.fixed_dictionaries({"matcher": st.one_of(st.sampled_from(
                ["startup|resume|clear", "compact"]), TEXT), "hooks": st.one_of(JSON, st.lists(st.fixed_dictionaries(
                    {"type": st.just("command"), "command": st.one_of(st.just("evolve hook session-start"), TEXT)}),
                    max_size=2))})), max_size=3))})),
        "permissions": JSON, "model": TEXT}).map(dumps),
    st.sampled_from([b"", b"  \n", b"{", b'{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "40"}', b"\xff\xfe{}",
                     b'{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "\\ud800"}}', b'"\\u0000"', b"[" * 3000]),
)


def printable_line(s: str) -> bool:
    return not controls_in(s)


@pytest.mark.parametrize("call", ["detect", "load_settings"])
def test_deeply_nested_settings_are_skipped_or_refused(call: str) -> None:
    """Found by the fuzzers: json.loads raised RecursionError out of the detector and the settings writer."""
    from evolve.errors import UsageError

    if hooks is None:
        pytest.skip("evolve/harness is not there yet")
    with tmpdir() as d:
        path = ac.settings_path(d)
        path.parent.mkdir()
        path.write_bytes(b"[" * 3000)
        if call == "detect":
            assert ac.detect(d, {"HOME": str(d)}).status == ac.ABSENT
        else:
            with pytest.raises(UsageError):
                ac.load_settings(path)


def test_lone_surrogate_in_settings_is_reported_printably() -> None:
    """Found by the fuzzers: a lone-surrogate value broke `evolve status`, `status --json` and `doctor`."""
    if hooks is None:
        pytest.skip("evolve/harness is not there yet")
    with tmpdir() as d:
        (d / ".claude").mkdir()
        ac.settings_path(d).write_bytes(b'{"env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "\\ud800"}}')
        info = ac.status_info(d, {"HOME": str(d)})
        assert printable_line(orjson.dumps(info).decode()) and info["status"] == ac.INVALID


@harness
@FILES
@given(project=st.one_of(st.none(), SETTINGS), local=st.one_of(st.none(), SETTINGS),
       user=st.one_of(st.none(), SETTINGS), env_pct=st.one_of(st.none(), PCT.map(str)))
def test_autocompact_detect_on_random_settings(project: bytes | None, local: bytes | None, user: bytes | None,
                                               env_pct: str | None) -> None:
    with tmpdir() as d:
        (d / ".claude").mkdir()
        for data, path in ((project, ac.settings_path(d)), (local, ac.local_settings_path(d)),
                           (user, d / "cfg" / "settings.json")):
            if data is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        env = {"CLAUDE_CONFIG_DIR": str(d / "cfg"), "HOME": str(d / "home")}
        if env_pct is not None:
            env[ac.KEY] = env_pct
        det = ac.detect(d, env)
        assert det.status in (ac.CONFIGURED, ac.INVALID, ac.ABSENT)
        assert (det.status == ac.CONFIGURED) == ac.valid_value(det.value)
        info = ac.status_info(d, env)
        orjson.dumps(info)  # `evolve status --json` can always print it
        assert printable_line(info["line"]) and printable_line(ac.show_value(det.value))
        line = hooks.nudge(d, env)
        assert line is None or printable_line(line)


@harness
@FILES
@given(data=SETTINGS, pct=st.one_of(st.none(), st.sampled_from(["40", "100", "84"])), with_hooks=st.booleans())
def test_settings_writer_refuses_or_merges(data: bytes, pct: str | None, with_hooks: bool) -> None:
    from evolve.errors import UsageError

    with tmpdir() as d:
        path = ac.settings_path(d)
        path.parent.mkdir()
        path.write_bytes(data)
        try:
            before = ac.load_settings(path)
        except UsageError:
            with pytest.raises(UsageError):
                ac.setup(d, {}, pct=pct, hooks=with_hooks)
            assert path.read_bytes() == data  # a refusal leaves the file byte-identical
            return
        try:
            res = ac.setup(d, {}, pct=pct, hooks=with_hooks)
        except UsageError:
            assert path.read_bytes() == data
            return
        after = orjson.loads(path.read_bytes()) if res.wrote else before
        assert isinstance(after, dict)
        for k, v in before.items():  # every other key kept
            if k not in ("env", "hooks"):
                assert after[k] == v
        assert ac.valid_value(after["env"][ac.KEY])
        if isinstance(before.get("env"), dict):
            assert {k: v for k, v in after["env"].items() if k != ac.KEY} == \
                   {k: v for k, v in before["env"].items() if k != ac.KEY}
        again = ac.setup(d, {}, pct=pct, hooks=with_hooks)
        assert not again.wrote  # idempotent


CYCLE_STATE = st.one_of(
    st.binary(max_size=60),
    JSON.map(dumps),
    st.fixed_dictionaries({"phase": st.one_of(st.sampled_from(["agent", "gate", "between-steps"]), TEXT, SCALAR),
                           "step": st.one_of(st.sampled_from(["agent", "gate"]), TEXT, SCALAR),
                           "written_at": st.one_of(st.just("NOW"), st.sampled_from(
                               ["2020-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00+14:00",
                                "garbage"]), SCALAR)},
                          optional={"cycle": SCALAR, "work_ref": st.one_of(TEXT, SCALAR),
                                    "title": st.one_of(TEXT, JSON),
                                    "plan_path": st.one_of(st.sampled_from(["plan.md", "../outside.md", "/etc/passwd",
                                                                            "link.md", "dir", "a\x00b", ""]),
                                                           TEXT, SCALAR),
                                    "plan_items": st.one_of(JSON, st.lists(st.one_of(TEXT, st.text(
                                        min_size=190, max_size=400), SCALAR), max_size=60))}).map(dumps),
)
PLAN = st.one_of(st.text(max_size=200), st.lists(st.one_of(
    st.sampled_from(["## Build Progress", "## build progress  ", "## Other", "- [ ] ", "* [ ] ", "- [x] done"]),
    st.builds(lambda p, t: p + t, st.sampled_from(["- [ ] ", "* [ ] ", "  - [ ] "]), TEXT),
    st.text(max_size=30)), max_size=30).map("\n".join))
PAYLOAD = st.one_of(
    st.binary(max_size=80),
    JSON.map(dumps),
    st.fixed_dictionaries({"source": st.one_of(st.sampled_from(["startup", "resume", "clear", "compact"]), SCALAR)},
                          optional={"cwd": st.one_of(st.just("PROJECT"), TEXT, SCALAR), "session_id": SCALAR,
                                    "hook_event_name": st.just("SessionStart")}).map(dumps),
)


@harness
@FILES
@given(payload=PAYLOAD, state=st.one_of(st.none(), CYCLE_STATE), plan=PLAN, settings=st.one_of(st.none(), SETTINGS))
def test_session_start_hook_on_random_stdin_and_state(payload: bytes, state: bytes | None, plan: str,
                                                      settings: bytes | None) -> None:
    import time

    now = time.time()
    with tmpdir() as d:
        project = d / "repo"
        (project / ".agents" / "evolve").mkdir(parents=True)
        (project / "plan.md").write_text(plan, encoding="utf-8", errors="surrogatepass")
        (project / "dir").mkdir()
        (d / "outside.md").write_text("## Build Progress\n- [ ] secret outside the repo\n")
        os.symlink(d / "outside.md", project / "link.md")
        if settings is not None:
            (project / ".claude").mkdir()
            (project / ".claude" / "settings.json").write_bytes(settings)
        state_path = project / ".agents" / "evolve" / "cycle-state.json"
        if state is not None:
            state_path.write_bytes(state.replace(b'"NOW"', dumps(hooks.utc_iso(now) if hasattr(hooks, "utc_iso")
                                                                else time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                   time.gmtime(now)))))
        payload = payload.replace(b'"PROJECT"', dumps(str(project)))
        env = {"CLAUDE_PROJECT_DIR": str(project), "HOME": str(d / "home")}
        # The pieces behind the fail-open entry point must not raise either: a swallowed exception
        # would mean a silently missing re-injection.
        got = hooks.reinject_text(project, state_path, now)
        hooks.nudge(project, env)
        hooks.read_payload(payload)
        out = hooks.session_start(payload, env, project, now)
        if got is not None:
            text, step = got
            assert len(text) <= hooks.CAP and printable_line(text) and printable_line(step)
            assert "secret outside the repo" not in text
        if out is not None:
            obj = orjson.loads(out)
            ctx = obj["hookSpecificOutput"]["additionalContext"]
            assert isinstance(ctx, str) and len(ctx) <= hooks.CAP and printable_line(ctx)
            assert printable_line(obj["systemMessage"]) and "secret outside the repo" not in ctx


@harness
@FILES
@given(body=st.one_of(st.binary(max_size=60), JSON.map(dumps), st.fixed_dictionaries(
    {"mode": st.one_of(st.sampled_from(["continue", "fork"]), SCALAR),
     "artifact": st.one_of(st.sampled_from(["a.md", "../x.md", "/etc/passwd", ".hidden.md", "a\x00.md", "sub/a.md",
                                            "missing.md", "", "link.md"]), TEXT, SCALAR)},
    optional={"purpose": st.one_of(TEXT, JSON), "requested_at": SCALAR, "parent_session_id": SCALAR}).map(dumps)),
    state=st.one_of(st.none(), CYCLE_STATE), session=st.one_of(st.none(), state_objects().map(no_live_pgid)))
def test_handoff_request_readers_on_random_files(body: bytes, state: bytes | None,
                                                  session: dict[str, Any] | None) -> None:
    from evolve.paths import Paths

    with tmpdir() as d:
        repo = d / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        paths = Paths.for_repo(repo, env={"XDG_CONFIG_HOME": str(d / "xdg")})
        paths.handoffs_dir.mkdir(parents=True)
        (paths.handoffs_dir / "a.md").write_text("artifact\n")
        (paths.handoffs_dir / "sub").mkdir()
        (paths.handoffs_dir / "sub" / "a.md").write_text("nested\n")
        os.symlink(d, paths.handoffs_dir / "link.md")
        hand.pending_path(paths).write_bytes(body)
        if state is not None:
            paths.cycle_state.write_bytes(state)
        if session is not None:
            paths.state.write_bytes(dumps(session))
        req = hand.pending(paths)
        if req is not None:
            assert req.mode in ("continue", "fork") and req.artifact.parent == paths.handoffs_dir
            assert req.artifact.is_file() and isinstance(req.text(), str)
        ctx = hand.gather(paths)
        assert isinstance(ctx.task_ref, str) and isinstance(ctx.task_title, str)
        text = hand.continue_artifact(ctx, "note", 0.0)
        assert isinstance(text, str)
