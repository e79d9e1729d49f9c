"""One model for a unit of work, whatever source it came from, and the interface sources implement."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def clean_text(text: object, limit: int = 200) -> str:
    """A single printable line: control and invisible characters become spaces, length capped."""
    s = _CONTROL.sub(" ", str(text)).strip()
    s = re.sub(r"\s{2,}", " ", s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def fast_clean(text: object, limit: int = 200) -> str:
    """:func:`clean_text`, skipping its regexes when the text is already one short printable line."""
    s = text if isinstance(text, str) else str(text)
    # Printable strings hold no control or invisible characters and no whitespace but " ".
    if len(s) <= limit and s.isprintable() and "  " not in s and s.strip() == s:
        return s
    return clean_text(s, limit)


_PUNCT = re.compile(r"[^\w\s]")


def normalise_title(title: object) -> str:
    """Lower case, punctuation to spaces, whitespace collapsed: two spellings of one title compare equal."""
    return " ".join(_PUNCT.sub(" ", str(title).lower()).split())


def item_keys(item: Mapping[str, Any]) -> set[str]:
    """What identifies a queued item for deduplication: its normalised title and its ``dedup_key``."""
    keys = {"title:" + normalise_title(item.get("title", ""))}
    key = item.get("dedup_key")
    if isinstance(key, str) and key:
        keys.add("dedup:" + key)
    return keys


def keys_of(items: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every key of these items (what :func:`evolve.work.generators.dedup` compares)."""
    return set().union(*(item_keys(it) for it in items))


def short_ref(ref: str, limit: int = 512) -> str:
    """``ref`` itself when short; else a prefix plus a digest that still identifies it."""
    if len(ref) <= limit:
        return ref
    import hashlib

    return f"{ref[: limit - 20]}…#{hashlib.sha256(ref.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


@dataclass(frozen=True)
class WorkItem:
    source: str  # harvested | beads | goal | directive | generator
    ref: str  # stable identity within its source
    title: str
    description: str = ""
    type: str = ""
    severity: str = ""
    created_at: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    # Where the source found the item, for its own lifecycle calls (a hint it re-verifies): not identity.
    locator: Any = field(default=None, compare=False, repr=False)

    @property
    def is_red_reducing(self) -> bool:
        """Work allowed in restorative mode: bugs, gate fixes, failing goals."""
        if self.source == "goal":
            return True
        return self.type.lower() in ("bug", "gate-fix", "fix", "regression")

    def as_json(self) -> dict[str, Any]:
        """A bounded view for env vars and displays: argv/env have a size limit (E2BIG), refs do not."""
        return {
            "source": self.source,
            "ref": short_ref(self.ref),
            "title": self.title,
            "description": self.description,
            "type": self.type,
            "severity": self.severity,
        }


class LazyItems(Sequence[WorkItem]):
    """A source's ranked items, each turned into a WorkItem only when read (and then kept).

    The ladder stops at the first eligible item and looks a few past it, so a selection converts a
    handful of a long rung, not all of it.
    """

    def __init__(self, count: int, make: Callable[[int], WorkItem]) -> None:
        self._make = make
        self._items: list[WorkItem | None] = [None] * count

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> WorkItem: ...
    @overload
    def __getitem__(self, i: slice) -> list[WorkItem]: ...
    def __getitem__(self, i: int | slice) -> WorkItem | list[WorkItem]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        item = self._items[i]
        if item is None:
            item = self._items[i] = self._make(i % len(self._items) if i < 0 else i)
        return item

    def __iter__(self) -> Iterator[WorkItem]:
        for i in range(len(self._items)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyItems, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def hold_note(pending_ref: str, cycle: int | None) -> str:
    """What a held claim says it waits for: the pending ref and the cycle whose work is there."""
    return clean_text(f"{pending_ref or 'refs/evolve/pending'} (cycle {cycle if cycle is not None else '?'})", 300)


class SourceError(Exception):
    """A source could not be read (a probe error): never to be mistaken for "no work"."""


class ClaimLost(Exception):
    """The item is no longer selectable (another process took it, or it was edited away)."""


class WorkSource(Protocol):
    """A source's whole lifecycle, so the cycle never asks which source an item came from.

    Implemented by the harvested queue (which generators feed), beads and goals/directives. Every
    method takes an item this source's :meth:`candidates` returned; ``now`` is an ISO timestamp.
    """

    name: str

    def candidates(self) -> Sequence[WorkItem]:
        """Selectable items in the source's own priority order; raises SourceError."""
        ...

    def claim(self, item: WorkItem, claimer: str, now: str) -> None:
        """Take the item for a cycle; raises ClaimLost when it is no longer selectable."""
        ...

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None:
        """The cycle that claimed it landed: the item is done."""
        ...

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None:
        """Give a claimed item back (a failed cycle, a crash, a scout); ``claimer`` None: whoever holds it."""
        ...

    def defer(self, item: WorkItem, now: str, reason: str) -> None:
        """A scout's defer: not now. Sources that cannot record it do nothing (the item comes back)."""
        ...

    def hold(self, item: WorkItem, claimer: str, now: str, note: str) -> None:
        """The cycle's green work waits to land (a ``pending`` result, docs/DESIGN.md §8.3): keep the
        item's claim and mark it, where the source can, as held for that work (``note``:
        :func:`hold_note`), so that no reader takes it over however old it grows; :meth:`finalize`
        and :meth:`release` end the hold. Sources that cannot mark a claim do nothing (this evolve's
        ``pending.json`` still keeps the item out of its own selection)."""
        ...

    def park(self, item: WorkItem, now: str, note: str) -> bool:
        """Hold the item out of selection until an operator looks (attempt budget spent, a scout's park).

        False when the source has no way to do that (the caller says so); True otherwise.
        """
        ...

    def split(self, item: WorkItem, now: str, children: Sequence[Mapping[str, Any]]) -> None:
        """A scout's split: ``children`` are already queued as new work; record that the item was split."""
        ...
