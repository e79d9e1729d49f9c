"""The pure half of the beads source (docs/DESIGN.md §6.2): parsing ``bd ready --json``, ranking, items, command."""

from __future__ import annotations

import orjson
import pytest

from evolve.work.beads import parse_ready, rank, resolve_command, to_item
from evolve.work.item import SourceError


def dumps(obj: object) -> bytes:
    return orjson.dumps(obj)


B1 = {"id": "bd-1", "title": "one", "priority": 1}
B2 = {"id": "bd-2", "title": "two", "priority": 0}

# -- parse_ready ----------------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [lambda xs: xs, lambda xs: {"issues": xs}, lambda xs: {"items": xs},
                                  lambda xs: {"data": xs}])
def test_parse_accepts_array_and_wrappers(wrap):
    assert parse_ready(dumps(wrap([B1, B2]))) == [B1, B2]


def test_parse_empty_list_and_wrapper_with_extra_keys():
    assert parse_ready(b"[]") == []
    assert parse_ready(dumps({"issues": [], "count": 0})) == []
    assert parse_ready(dumps({"meta": {"v": 1}, "data": [B1]})) == [B1]
    # A wrapper key that is not a list is passed over for the next one.
    assert parse_ready(dumps({"issues": "none", "items": [B2]})) == [B2]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"results": []}',
        b'{"issues": {"bd-1": {}}}',
        b"{}",
        b'"bd-1"',
        b"42",
        b"null",
        b"true",
    ],
)
def test_parse_rejects_other_shapes(raw):
    with pytest.raises(SourceError):
        parse_ready(raw)


@pytest.mark.parametrize("raw", [b"[{", b"not json", b"Error: no .beads directory", b"\xff\xfe[]",
                                 b"[1,]"])
def test_parse_rejects_invalid_json(raw):
    with pytest.raises(SourceError, match="invalid JSON"):
        parse_ready(raw)


def test_parse_skips_entries_without_an_id():
    raw = dumps([
        B1,
        {"title": "no id"},
        {"id": None, "title": "null id"},
        {"id": "", "title": "empty id"},
        {"id": "   ", "title": "blank id"},
        {"id": ["x"], "title": "list id"},
        "bd-3",
        7,
        None,
        {"id": 42, "title": "numeric id"},
        B2,
    ])
    got = parse_ready(raw)
    assert [b["id"] for b in got] == ["bd-1", 42, "bd-2"]


def test_parse_keeps_unknown_fields():
    bead = {**B1, "dependencies": [{"issue_id": "bd-1", "depends_on_id": "bd-0", "type": "blocks"}], "x": {"y": 1}}
    assert parse_ready(dumps({"issues": [bead]})) == [bead]


# -- rank -----------------------------------------------------------------------------------------


def ids(beads):
    return [b["id"] for b in beads]


@pytest.mark.parametrize("label", ["operator-shape", "meta-runtime", "human-coordinate", "Operator-Shape",
                                   "META-RUNTIME", "Human-Coordinate"])
def test_rank_drops_operator_labels_case_insensitively(label):
    beads = [{"id": "a", "priority": 0, "labels": ["backend", label]}, {"id": "b", "priority": 3, "labels": []}]
    assert ids(rank(beads)) == ["b"]


def test_rank_keeps_other_and_malformed_labels():
    beads = [
        {"id": "a", "priority": 1, "labels": ["operator-shaped", "meta"]},
        {"id": "b", "priority": 1, "labels": "operator-shape"},  # not a list: no labels
        {"id": "c", "priority": 1},
    ]
    assert ids(rank(beads)) == ["a", "b", "c"]


def test_rank_orders_priority_then_the_trackers_order():
    beads = [
        {"id": "z", "priority": 2, "created_at": "2024-01-01T00:00:00Z"},
        {"id": "no-prio", "created_at": "2020-01-01T00:00:00Z"},
        {"id": "b", "priority": 0, "created_at": "2024-03-01T00:00:00Z"},
        {"id": "a", "priority": 0, "created_at": "2024-03-01T00:00:00Z"},
        {"id": "c", "priority": 0, "created_at": "2024-02-01T00:00:00Z"},
        {"id": "str-prio", "priority": "0", "created_at": "2019-01-01T00:00:00Z"},
        {"id": "bool-prio", "priority": True, "created_at": "2019-01-01T00:00:00Z"},
        {"id": "p4", "priority": 4, "created_at": "2018-01-01T00:00:00Z"},
        {"id": "y", "priority": 2, "created_at": "2023-01-01T00:00:00Z"},
    ]
    # priority asc (0 = critical), missing or non-integer priority last; equal priorities as the tracker
    # listed them (``bd ready`` ranks its own answer; neither created_at nor the id reorders it).
    assert ids(rank(beads)) == ["b", "a", "c", "z", "y", "p4", "no-prio", "str-prio", "bool-prio"]


def test_rank_is_stable_within_a_priority():
    beads = [{"id": f"bd-{i}", "priority": i % 3, "created_at": f"2024-01-0{i % 5 + 1}"} for i in range(12)]
    for order in (beads, list(reversed(beads)), beads[5:] + beads[:5]):
        want = [b["id"] for p in range(3) for b in order if b["priority"] == p]
        assert ids(rank(order)) == want


def test_rank_numeric_ids_compare_as_text():
    assert ids(rank([{"id": 10, "priority": 1}, {"id": 9, "priority": 1}])) == [10, 9]


# -- to_item --------------------------------------------------------------------------------------


def test_to_item_fields():
    bead = {
        "id": "bd-7",
        "title": "Fix\nthe\tparser",
        "description": "d" * 5000,
        "issue_type": "feature",
        "priority": 2,
        "labels": ["backend"],
        "created_at": "2024-05-01T12:00:00Z",
        "status": "open",
    }
    it = to_item(bead)
    assert it.source == "beads"
    assert it.ref == "bead:bd-7"
    assert it.title == "bd-7: Fix the parser"
    assert it.description == "d" * 4000
    assert it.type == "feature"
    assert it.severity == "medium"
    assert it.created_at == "2024-05-01T12:00:00Z"
    assert dict(it.data) == bead
    assert not it.is_red_reducing


@pytest.mark.parametrize(("priority", "severity"), [(0, "high"), (1, "high"), (2, "medium"), (3, "low"), (4, "low"),
                                                    (None, "low"), ("0", "low"), (9, "low")])
def test_to_item_severity_from_priority(priority, severity):
    bead = {"id": "x", "title": "t"}
    if priority is not None:
        bead["priority"] = priority
    assert to_item(bead).severity == severity


@pytest.mark.parametrize(
    ("bead", "kind"),
    [
        ({"id": "x", "issue_type": "task", "labels": ["gate-fix"]}, "gate-fix"),
        ({"id": "x", "issue_type": "chore", "labels": ["CI-Red"]}, "gate-fix"),
        ({"id": "x", "issue_type": "feature", "labels": ["regression"]}, "gate-fix"),
        ({"id": "x", "issue_type": "bug", "labels": ["gate-fix"]}, "bug"),
        ({"id": "x", "issue_type": "task", "labels": ["backend"]}, "task"),
        ({"id": "x", "type": "docs"}, "docs"),
        ({"id": "x"}, "task"),
        ({"id": "x", "issue_type": ""}, "task"),
    ],
)
def test_to_item_type(bead, kind):
    it = to_item(bead)
    assert it.type == kind
    assert it.is_red_reducing == (kind in ("bug", "gate-fix"))


def test_to_item_numeric_id_and_odd_fields():
    it = to_item({"id": 42, "created_at": 1700000000, "description": None})
    assert it.ref == "bead:42" and it.title == "42:" and it.created_at is None and it.description == ""


def test_parse_rank_to_item_pipeline():
    raw = dumps({"issues": [
        {"id": "bd-3", "title": "later", "priority": 1, "created_at": "2024-02-01", "labels": []},
        {"id": "bd-1", "title": "operator", "priority": 0, "labels": ["human-coordinate"]},
        {"id": "bd-2", "title": "first", "priority": 1, "created_at": "2024-01-01", "labels": ["gate-fix"]},
        {"title": "no id", "priority": 0},
    ]})
    items = [to_item(b) for b in rank(parse_ready(raw))]
    assert [(i.ref, i.type, i.severity) for i in items] == [("bead:bd-3", "task", "high"),
                                                           ("bead:bd-2", "gate-fix", "high")]


# -- resolve_command ------------------------------------------------------------------------------


def fake_which(*present: str):
    asked: list[str] = []

    def which(cmd: str) -> str | None:
        asked.append(cmd)
        return f"/usr/bin/{cmd}" if cmd in present else None

    which.asked = asked  # type: ignore[attr-defined]
    return which


def test_resolve_prefers_bd():
    which = fake_which("bd", "br")
    assert resolve_command(["bd", "ready", "--json"], which=which) == ["bd", "ready", "--json"]
    assert which.asked == ["bd"]


def test_resolve_falls_back_to_br():
    assert resolve_command(["bd", "ready", "--json"], which=fake_which("br")) == ["br", "ready", "--json"]


def test_resolve_none_when_neither_exists():
    assert resolve_command(["bd", "ready", "--json"], which=fake_which()) is None
    assert resolve_command(["bd", "ready", "--json"], which=fake_which("git")) is None


def test_resolve_custom_command_has_no_fallback():
    assert resolve_command(["mytracker", "ready"], which=fake_which("br", "mytracker")) == ["mytracker", "ready"]
    assert resolve_command(["mytracker", "ready"], which=fake_which("br", "bd")) is None
    assert resolve_command(["br", "ready", "--json"], which=fake_which("bd")) is None


def test_resolve_empty_command():
    assert resolve_command([], which=fake_which("bd")) is None


def test_resolve_returns_a_fresh_list():
    argv = ("bd", "ready", "--json")
    out = resolve_command(argv, which=fake_which("bd"))
    assert out == list(argv) and isinstance(out, list)


# -- the fast paths -------------------------------------------------------------------------------


def test_fast_clean_equals_clean_text_on_every_character():
    from evolve.work.item import clean_text, fast_clean

    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        for s in (chr(c), f"a{chr(c)}b", f"a {chr(c)} b", f"{chr(c)}{chr(c)}"):
            assert fast_clean(s) == clean_text(s), hex(c)


@pytest.mark.parametrize("text", ["", " ", "plain title", " lead", "trail ", "two  spaces", "x" * 200, "x" * 201,
                                  "é" * 250, "tab\there", "nl\nhere", "zw\u200bsp", 42, None, ["list"]])
def test_fast_clean_equals_clean_text(text):
    from evolve.work.item import clean_text, fast_clean

    assert fast_clean(text) == clean_text(text)


def test_to_item_keeps_the_parsed_bead_without_copying():
    bead = {"id": "bd-1", "title": "t", "labels": ["x"]}
    assert to_item(bead).data is bead


def test_beads_source_converts_only_when_the_output_changed(tmp_path, monkeypatch):
    from evolve.work import beads

    outputs = iter([dumps([B1, B2]), dumps([B1, B2]), dumps([B1]), dumps([B1])])
    parsed: list[bytes] = []
    src = beads.BeadsSource(["bd", "ready", "--json"], tmp_path, timeout_s=5, env={"PATH": str(tmp_path)})
    monkeypatch.setattr(beads, "resolve_command", lambda argv, which: list(argv))
    monkeypatch.setattr(src, "_run", lambda argv: next(outputs))  # the tracker is asked every time
    real = beads.parse_ready
    monkeypatch.setattr(beads, "parse_ready", lambda raw: parsed.append(raw) or real(raw))
    got = [[w.ref for w in src.candidates()] for _ in range(4)]
    assert got == [["bead:bd-2", "bead:bd-1"], ["bead:bd-2", "bead:bd-1"], ["bead:bd-1"], ["bead:bd-1"]]
    assert parsed == [dumps([B1, B2]), dumps([B1])]  # parsed again only when the output changed
