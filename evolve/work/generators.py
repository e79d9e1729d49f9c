"""Generators: configured commands that print JSON work items when every other rung is empty.

Their items are appended to the harvested queue as one ``evolve-generator`` entry (deduplicated by
``dedup_key`` or normalised title against open and consumed items) and then selected through the
harvested rung, so generated work has the same lifecycle as any harvested item.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from evolve.procgroup import CaptureError, run_capture
from evolve.work.item import SourceError, item_keys


def parse_output(raw: bytes, name: str) -> list[dict[str, Any]]:
    """A JSON array of items or ``{"items": [...]}``; items need a non-empty string title."""
    try:
        obj = orjson.loads(raw) if raw.strip() else []
    except orjson.JSONDecodeError as exc:
        raise SourceError(f"generator {name} printed invalid JSON: {exc}") from exc
    if isinstance(obj, dict) and isinstance(obj.get("items"), list):
        obj = obj["items"]
    if not isinstance(obj, list):
        raise SourceError(f"generator {name} did not print a list of items")
    out = []
    for it in obj:
        if not isinstance(it, dict) or not isinstance(it.get("title"), str) or not it["title"].strip():
            continue
        item = {"description": "", "type": "task", "severity": "medium", **it, "source": "evolve-generator"}
        item["generator"] = name
        out.append(item)
    return out


def dedup(new: Iterable[dict[str, Any]], existing_keys: set[str]) -> list[dict[str, Any]]:
    """Items whose title or dedup key is not already in the queue (nor earlier in ``new``)."""
    seen = set(existing_keys)
    out = []
    for item in new:
        keys = item_keys(item)
        if keys & seen:
            continue
        seen |= keys
        out.append(item)
    return out


def run_all(
    argvs: Sequence[Sequence[str]], *, repo: Path, env: Mapping[str, str], timeout_s: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every generator's items, and the errors of those that failed (each failure is a probe error)."""
    items: list[dict[str, Any]] = []
    errors: list[str] = []
    for argv in argvs:
        name = Path(argv[0]).name if argv else "?"
        try:
            items.extend(parse_output(run_capture(list(argv), cwd=repo, env=env, timeout_s=timeout_s), name))
        except (CaptureError, SourceError) as exc:
            errors.append(str(exc))
    return items, errors


def generator_entry(items: list[dict[str, Any]], now: str) -> dict[str, Any]:
    return {
        "source_epic": "evolve-generator",
        "timestamp": now,
        "items": items,
        "consumed": False,
        "claim_status": "available",
        "claimed_by": None,
        "claimed_at": None,
        "consumed_by": None,
        "consumed_at": None,
    }
