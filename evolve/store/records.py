"""Typed records inside ``session-state.json`` (docs/DESIGN.md §2, §5): frozen, validated, lossless.

``agent_session``, ``claimed_work``, ``fire`` and ``post_compact`` were free-form dicts that every
reader defended with ``isinstance`` checks. Each is now a frozen dataclass that validates its own
fields from their annotations when read (:meth:`Record.from_json`): a field of the wrong type falls
back to its default and is reported, so no caller sees a list where it expects an int. Keys a record
does not know (written by another tool, or by a newer evolve) ride along in ``extra`` and are
written back by :meth:`Record.to_json`: the merge-save contract holds inside the records too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Self


def _accepts(hint: Any, value: Any) -> bool:
    """Whether ``value`` (decoded JSON) fits the annotation ``hint`` (the few shapes records use)."""
    if hint is Any:
        return True
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_accepts(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin in (int, float) and isinstance(value, bool):
        return False  # JSON true is not a number
    if origin is float:
        return isinstance(value, int | float)
    return isinstance(value, origin)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return {f.name: typing.get_type_hints(cls)[f.name] for f in dataclasses.fields(cls) if f.name != "extra"}


class Record:
    """Shared reading and writing for the records below (each is a frozen dataclass with ``extra``)."""

    extra: Mapping[str, Any]

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> tuple[Self, list[str]]:
        """The record and the names of fields that had the wrong type (reset to their defaults)."""
        hints = _hints(cls)
        known: dict[str, Any] = {}
        bad: list[str] = []
        for name, hint in hints.items():
            if name in obj:
                if _accepts(hint, obj[name]):
                    known[name] = obj[name]
                else:
                    bad.append(name)
        extra = {k: v for k, v in obj.items() if k not in hints}
        return cls(**known, extra=extra), bad  # type: ignore[call-arg]

    @classmethod
    def from_json(cls, obj: object) -> Self | None:
        """Lenient read: None unless ``obj`` is a non-empty object (an empty one records nothing)."""
        return cls.read(obj)[0] if isinstance(obj, Mapping) and obj else None

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        for name in _hints(type(self)):
            value = getattr(self, name)
            if value is None and name in self._omit_when_none:
                continue
            out[name] = value
        return out

    _omit_when_none: typing.ClassVar[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class AgentSession(Record):
    """The loop's agent session (docs/DESIGN.md §5): which conversation a cycle resumes."""

    id: str = ""
    runner: str = ""
    started_cycle: int = 0
    last_cycle: int = 0
    need_ref: str | None = None  # the work ref the session last worked on
    need_set_at: int = 0
    events_since: int = 0  # cycles and foreign commits the session did not see
    ended_heavy: bool = False  # a context hand-off ended it: never resume it
    summary: str = ""
    last_head: str | None = None
    fork_handback: dict[str, Any] | None = None  # a fork's summary, delivered to the parent's next run
    extra: Mapping[str, Any] = field(default_factory=dict)

    _omit_when_none: typing.ClassVar[frozenset[str]] = frozenset({"fork_handback"})

    @property
    def resumable_id(self) -> str | None:
        return self.id if self.id and not self.ended_heavy else None


@dataclass(frozen=True)
class ClaimedWork(Record):
    """The claim a running fire holds; the next fire finalizes or releases it if this one dies."""

    ref: str = ""
    source: str = ""
    claimed_by: str = ""
    claimed_at: str = ""
    cycle: int | None = None
    title: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FireRecord(Record):
    """A running fire: who it is, its process groups and its cycle (``null`` once it ends)."""

    pid: int | None = None
    pgid: int | None = None
    agent_pgid: int | None = None
    started_at: str | None = None
    cycle: int | None = None
    fire_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PostCompact(Record):
    """The state block that leads the next resumed run after a compaction (docs/DESIGN.md §7)."""

    session_id: str = ""
    cycle: int = 0
    text: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


RECORDS: dict[str, type[Record]] = {
    "agent_session": AgentSession,
    "claimed_work": ClaimedWork,
    "fire": FireRecord,
    "post_compact": PostCompact,
}
