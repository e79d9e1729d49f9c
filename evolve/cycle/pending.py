"""Green work that has not landed yet, and a landing in progress (docs/DESIGN.md §8.3): two small records.

``pending.json`` holds, per branch, the *chain* of green commits waiting to land there
(``refs/evolve/pending/<branch>`` mirrors its tip) and the cycles whose work it carries: each keeps its
item's claim (no other fire or tool takes it over) until its commit is on the branch (finalized) or
cannot get there (released). ``landing.json`` is written before any ref moves and removed once the
ledger says what happened, so a fire that dies in between is settled from git: landed means
``improved`` with the landed sha, never redone.

Both files are evolve's own; a reader takes what validates and drops the rest (with a warning),
never crashes on them. The rules that map a chain's cycles onto replayed commits are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evolve import redact
from evolve.store.atomic import read_json, write_json
from evolve.store.records import Record


@dataclass(frozen=True)
class Held(Record):
    """One cycle whose green commits are in a chain, and the item whose claim waits with them."""

    cycle: int = 0
    work_ref: str = ""
    source: str = ""
    claimed_by: str = ""
    title: str = ""
    sha: str = ""  # the cycle's last commit in the chain (it changes when the chain is replayed)
    commits: int = 1  # how many commits of the chain are this cycle's
    start: str = ""  # the commit the cycle started from
    result: str = "improved"  # what the gate judged: the result its settling entry carries once it lands
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Chain:
    """Green commits ``base..new`` for ``branch``: all evolve's, ``base`` the branch tip they started on."""

    branch: str
    base: str
    new: str
    held: tuple[Held, ...] = ()
    reason: str = ""  # why it waits (pending) or why it could not land
    since: str = ""
    # Settled, and the fire has yet to say so in the ledger: "" (waiting), "landed" or "released"
    # (``fate_ref``: where the work is kept, if anywhere; ``reason``: why).
    fate: str = ""
    fate_ref: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"branch": self.branch, "base": self.base, "new": self.new,
                "held": [h.to_json() for h in self.held], "reason": self.reason, "since": self.since,
                "fate": self.fate, "fate_ref": self.fate_ref}

    @classmethod
    def from_json(cls, obj: object) -> Chain | None:
        if not isinstance(obj, Mapping):
            return None
        branch, base, new = obj.get("branch"), obj.get("base"), obj.get("new")
        if not (isinstance(branch, str) and branch.startswith("refs/heads/") and _sha(base) and _sha(new)):
            return None
        raw = obj.get("held") if isinstance(obj.get("held"), list) else []
        held = tuple(h for h in (Held.from_json(x) for x in raw) if h is not None and h.cycle > 0 and h.work_ref)
        text = {k: str(obj.get(k) or "")[:500] for k in ("reason", "since", "fate", "fate_ref")}
        return cls(branch, str(base), str(new), held, **text)

    def refs(self) -> frozenset[str]:
        return frozenset(h.work_ref for h in self.held)


def _sha(value: object) -> bool:
    return isinstance(value, str) and len(value) >= 40 and all(c in "0123456789abcdef" for c in value)


def load(path: Path) -> dict[str, Chain]:
    """``pending.json``: branch -> chain (what does not validate is left out)."""
    raw = read_json(path)
    if not isinstance(raw, Mapping):
        return {}
    chains = (Chain.from_json(v) for v in (raw.get("chains") or {}).values()) if isinstance(
        raw.get("chains"), Mapping) else ()
    return {c.branch: c for c in chains if c is not None}


def save(path: Path, chains: Mapping[str, Chain]) -> None:
    if not chains:
        path.unlink(missing_ok=True)
        return
    # The sink: a title (or a ref made of one) may carry a secret; a redacted ref still finds its item.
    doc = {"version": 1, "chains": {b: c.as_json() for b, c in sorted(chains.items())}}
    write_json(path, redact.current().json(doc))


def held_refs(path: Path) -> frozenset[str]:
    """The work refs every chain holds: selection skips them, and DORMANT never hides them."""
    out: frozenset[str] = frozenset()
    for chain in load(path).values():
        out |= chain.refs()
    return out


@dataclass(frozen=True)
class Intent:
    """A landing under way: what to resolve against git if the fire dies before the ledger says.

    ``kind`` ``cycle``: the cycle ``held[-1]`` is landing (earlier ``held`` entries rode in its chain);
    ``chain``: a fire is landing a chain that waited. ``phase`` is the step under way (``replay``,
    ``cas``, ``fast_forward``, ``hold``); ``old`` the branch tip it moves from; ``checkout`` the
    operator's checkout a fast-forward writes into.
    """

    kind: str
    branch: str
    base: str
    new: str
    held: tuple[Held, ...]
    phase: str = ""
    old: str = ""
    checkout: str = ""
    written_at: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "branch": self.branch, "base": self.base, "new": self.new,
                "held": [h.to_json() for h in self.held], "phase": self.phase, "old": self.old,
                "checkout": self.checkout, "written_at": self.written_at}

    @classmethod
    def from_json(cls, obj: object) -> Intent | None:
        chain = Chain.from_json(obj)
        if chain is None or not isinstance(obj, Mapping) or obj.get("kind") not in ("cycle", "chain"):
            return None
        keys = ("phase", "old", "checkout", "written_at")
        text = {k: obj.get(k) if isinstance(obj.get(k), str) else "" for k in keys}
        return cls(str(obj["kind"]), chain.branch, chain.base, chain.new, chain.held, **text)

    def chain(self) -> Chain:
        return Chain(self.branch, self.base, self.new, self.held)


def read_intent(path: Path) -> Intent | None:
    return Intent.from_json(read_json(path)) if path.exists() else None


def write_intent(path: Path, intent: Intent) -> None:
    write_json(path, redact.current().json(intent.as_json()))


# -- pure ---------------------------------------------------------------------------------------------


def remap(held: Sequence[Held], commits: Sequence[tuple[str, str]], tip: str) -> tuple[Held, ...]:
    """Each held cycle's sha after its chain was replayed into ``commits`` ((sha, subject), oldest first).

    A replay keeps the order of the commits, so when none was dropped each cycle's commits are the next
    ``commits`` of the list. When some were dropped (already on the branch), a cycle is found by the
    subject evolve gave its commit (``evolve: cycle N -- ...``); one not found at all is on the branch
    already: its sha becomes ``tip``.
    """
    if sum(h.commits for h in held) == len(commits):
        out, i = [], 0
        for h in held:
            i += h.commits
            out.append(replace(h, sha=commits[i - 1][0] if h.commits else (commits[i - 1][0] if i else tip)))
        return tuple(out)
    by_cycle = {}
    for sha, subject in commits:
        if subject.startswith("evolve: cycle "):
            num = subject[len("evolve: cycle "):].split(" ", 1)[0]
            if num.isdigit():
                by_cycle[int(num)] = sha
    return tuple(replace(h, sha=by_cycle.get(h.cycle, tip), commits=1 if h.cycle in by_cycle else 0) for h in held)
