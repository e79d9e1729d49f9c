"""evolve's record of its own queue writes (evolve/work/queue_record.py, docs/DESIGN.md §6.1): the
pure decision between a stale save (evolve's write is made again) and a deliberate edit (it stands),
as a table, and the record's chains and file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from evolve.work import queue_record as qr
from evolve.work.queue_record import DROP, KEEP, REAPPLY, Chain, Occurrence, Record, decide, digest, noted

REF = "source_epic=e1:item=fix it"
FRESH = {"title": "fix it", "type": "task"}
CLAIM = {"claim_status": "in_progress", "claimed_by": "evolve:cycle-1", "claimed_at": "t1"}
FINAL = {"consumed": True, "claim_status": "consumed", "consumed_by": "evolve:cycle-1", "consumed_at": "t2"}
CLAIMED = {**FRESH, **CLAIM}
CONSUMED = {**CLAIMED, **FINAL}
B0, C1 = "line-as-harvested", "line-as-moved"  # line digests: the harvester's line, evolve's moved copy


def _chain() -> Chain:
    """Claimed (a move: B0 left a tombstone, its copy C1 appended), then finalized (a put into C1)."""
    chains = noted({}, REF, FRESH, CLAIMED, op="claim", at="t1", entry=None, line=B0)
    return noted(chains, REF, CLAIMED, CONSUMED, op="finalize", at="t2", entry=None, line=C1)[digest(REF)]


def _at(line: int, item: dict[str, Any], raw: str = C1) -> Occurrence:
    return Occurrence(line, 0, item, raw)


CASES = [
    # (what the file holds, verdict, the occurrence written over, lines made tombstones again)
    ("evolve's last write", [_at(5, CONSUMED)], KEEP, None, []),
    ("the operator fixed a typo in it", [_at(5, {**CONSUMED, "title": "fix it "})], KEEP, None, []),
    ("a save from before the claim", [_at(0, FRESH, B0)], REAPPLY, 0, []),
    ("a save from between claim and finalize", [_at(5, CLAIMED)], REAPPLY, 5, []),
    ("requeued by hand (consumed back to false)", [_at(5, {**CONSUMED, "consumed": False,
                                                           "claim_status": "available"})], DROP, None, []),
    ("claimed by another tool since", [_at(5, {**CONSUMED, "claim_status": "in_progress",
                                               "claimed_by": "upstream", "consumed": False})], DROP, None, []),
    ("a stale buffer in which the operator also edited the item", [_at(0, {**FRESH, "type": "bug"}, B0)],
     DROP, None, []),
    ("the item removed", [], DROP, None, []),
    # The limit of the rule: a hand edit that deletes every field evolve added is the item's exact
    # earlier state, which is what a stale save looks like.
    ("requeued by deleting every field evolve added", [_at(5, FRESH)], REAPPLY, 5, []),
    ("the moved line brought back beside its finalized copy", [_at(0, FRESH, B0), _at(5, CONSUMED)], KEEP, None,
     [0]),
    ("the moved line and its copy, both from before the finalize", [_at(0, FRESH, B0), _at(5, CLAIMED)], REAPPLY,
     5, [0]),
    ("the same line twice (a duplicate, not a leftover)", [_at(0, FRESH, B0), _at(1, FRESH, B0)], REAPPLY, 0, []),
]


@pytest.mark.parametrize(("found", "verdict", "target", "tombs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_stale_save_is_undone_and_a_deliberate_edit_stands(found: list[Occurrence], verdict: str,
                                                               target: int | None, tombs: list[int]) -> None:
    d = decide(_chain(), found)
    assert d.verdict == verdict
    assert (d.target.line if d.target else None) == target
    assert [o.line for o in d.leftovers] == tombs


def test_reapplying_writes_evolves_fields_over_an_earlier_state() -> None:
    chain = _chain()
    for earlier in (FRESH, CLAIMED):
        item = dict(earlier)
        chain.apply(item)
        assert item == CONSUMED and chain.holds(item)
    assert not chain.holds(CLAIMED) and not chain.holds(FRESH)


def test_an_adopted_edit_becomes_the_state_evolve_last_saw() -> None:
    chain = _chain()
    typo = {**CONSUMED, "title": "fix it "}
    d = decide(chain, [_at(5, typo)])
    assert d.chain is not None and d.chain.last == digest(typo) and digest(CONSUMED) in d.chain.prior
    assert decide(d.chain, [_at(5, CLAIMED)]).verdict == REAPPLY  # a save from before still comes undone


def test_a_chain_starts_over_after_a_deliberate_change_and_records_removals() -> None:
    chain = _chain()
    assert chain.prior == (digest(FRESH), digest(CLAIMED)) and chain.lines == (B0, C1)
    assert chain.sets == {**CLAIM, **FINAL}
    requeued = {**CONSUMED, "consumed": False, "claim_status": "available"}
    again = {**requeued, "claim_status": "in_progress", "claimed_by": "evolve:cycle-9", "claimed_at": "t9"}
    fresh = noted({chain.key: chain}, REF, requeued, again, op="claim", at="t9", entry=None, line=C1)[chain.key]
    assert fresh.prior == (digest(requeued),)  # the old states are not this chain's
    assert fresh.sets == {"claim_status": "in_progress", "claimed_by": "evolve:cycle-9", "claimed_at": "t9"}
    parked = {**FRESH, "status": "blocked", "blocked_note": "3 attempts"}
    unparked = {**FRESH, "requeued_at": "t3"}
    c = noted({}, REF, FRESH, parked, op="park", at="t2", entry=None, line=B0)
    c = noted(c, REF, parked, unparked, op="requeue", at="t3", entry=None, line=B0)[digest(REF)]
    assert (c.sets, c.unsets) == ({"requeued_at": "t3"}, ("blocked_note", "status"))
    assert c.holds(unparked) and not c.holds(parked)
    item = dict(parked)
    c.apply(item)
    assert item == unparked


def test_the_record_is_bounded() -> None:
    chains: dict[str, Chain] = {}
    for n in range(qr.MAX_CHAINS + 5):
        chains = noted(chains, f"{REF}-{n}", FRESH, CLAIMED, op="claim", at="t", entry=None, line=B0)
    assert len(chains) == qr.MAX_CHAINS and digest(f"{REF}-0") not in chains  # the oldest go first
    one: dict[str, Chain] = {}
    item = dict(FRESH)
    for n in range(qr.MAX_PRIOR + 4):
        after = {**item, "claimed_at": f"t{n}"}
        one = noted(one, REF, item, after, op="claim", at="t", entry=None, line=f"l{n}")
        item = after
    c = one[digest(REF)]
    assert len(c.prior) == qr.MAX_PRIOR and len(c.lines) == qr.MAX_PRIOR


def test_the_record_file_round_trips_and_holds_no_byte_of_the_operators(tmp_path: Path) -> None:
    secret = "ghp_" + "A" * 36
    ref = f"source_epic=e1:item=rotate {secret}"
    item = {"title": f"rotate {secret}", "description": f"the token {secret} leaked"}
    chains = noted({}, ref, item, {**item, **CLAIM}, op="claim", at="t1", entry=None, line=B0)
    dfd = os.open(tmp_path, os.O_RDONLY)
    try:
        q = tmp_path / "next-work.jsonl"
        q.write_bytes(b"")
        os.chmod(q, 0o640)
        Record(chains).save(dfd, q.name, os.stat(q))
        path = tmp_path / Record.name(q.name)
        assert secret not in path.read_text() and "rotate" not in path.read_text()
        assert os.stat(path).st_mode & 0o777 == 0o640  # readable by whoever reads the queue
        back = Record.load(dfd, q.name)
        assert back.chains == chains == Record.load_path(path).chains
        path.write_bytes(b'{"v":1,"chains":[{"key":1},"x",' + orjson.dumps(chains[digest(ref)].to_json()) + b"]}")
        assert Record.load(dfd, q.name).chains == chains  # a malformed chain is skipped, the rest read
        path.write_bytes(b"{not json")
        assert Record.load(dfd, q.name).chains == {}  # an unreadable record protects nothing, breaks nothing
        assert sorted(p.name for p in tmp_path.iterdir()) == [Record.name(q.name), q.name]  # no temp left
    finally:
        os.close(dfd)


@pytest.mark.parametrize("entry", [
    {"source_epic": "e", "items": [{"title": "a"}, {"title": "b", "dedup_key": "k"}, "junk", {"x": 1}]},
    {"source_epic": None, "items": [{"title": 7}, {"title": "c", "dedup_key": ""}]},
    {"title": "flat row", "source_epic": "legacy"},
    {"title": "flat, keyed", "dedup_key": "fk"},
    {"items": "not a list", "title": "t"},
    {"source_epic": 0, "items": [{"title": "zero epic"}]},
])
def test_the_parse_finds_each_recorded_item_by_the_ref_a_claim_uses(tmp_path: Path, entry: dict) -> None:
    """The queue's parse spells refs itself (for speed); it must spell them as ``item_ref`` does."""
    from evolve.work.harvested import HarvestedQueue, entry_items, item_ref

    q = HarvestedQueue(tmp_path / "next-work.jsonl")
    refs = [item_ref(entry, it) for it in entry_items(entry)]
    q._watch = frozenset(digest(r) for r in refs)
    q._tags = frozenset(qr.ref_tag(r) for r in refs)
    q._hit(3, entry)
    assert q._hits == {digest(r): [(3, n)] for n, r in enumerate(refs)}
