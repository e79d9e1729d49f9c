"""The HANDOFF marker's four lines and the ``context-handoff`` milestone text (docs/DESIGN.md §2, §4.3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

NEXT_ACTION = "next-action: cron-fire will resume on compacted/fresh context"


def handoff_text(timestamp: str, streak: int, parked: Sequence[Any]) -> str:
    return (
        f"{timestamp}\n"
        f"context_streak={streak} (this session's context grew too heavy)\n"
        f"parked_work: {orjson.dumps(list(parked)).decode()}\n"
        f"{NEXT_ACTION}\n"
    )


def milestone(heavy_cycles: int, parked_refs: Sequence[str]) -> str:
    refs = ", ".join(parked_refs) if parked_refs else "none"
    return (
        f"Context-handoff after {heavy_cycles} heavy cycles. Parked: {refs}. Next cron-fire (compacted/fresh) resumes."
    )
