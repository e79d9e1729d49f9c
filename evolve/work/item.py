"""One model for a unit of work, whatever source it came from, and the interface sources implement."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def clean_text(text: object, limit: int = 200) -> str:
    """A single printable line: control and invisible characters become spaces, length capped."""
    s = _CONTROL.sub(" ", str(text)).strip()
    s = re.sub(r"\s{2,}", " ", s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


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


class SourceError(Exception):
    """A source could not be read (a probe error): never to be mistaken for "no work"."""


class ClaimLost(Exception):
    """The item is no longer selectable (another process took it, or it was edited away)."""


class WorkSource(Protocol):
    """What the cycle needs from a source; beads, goals and generators implement the same."""

    name: str

    def candidates(self) -> list[WorkItem]:
        """Selectable items in the source's own priority order; raises SourceError."""
        ...

    def claim(self, item: WorkItem, claimer: str, now: str) -> None: ...

    def finalize(self, item: WorkItem, claimer: str, now: str) -> None: ...

    def release(self, item: WorkItem, claimer: str | None, now: str, reason: str) -> None: ...
