"""Cleaning and capping a check's output, so what lands in snapshots and work items is short and printable."""

from __future__ import annotations

import re

OUTPUT_LIMIT = 500
OUTPUT_HEAD = 240
OUTPUT_TAIL = 240

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def strip_control(text: str) -> str:
    """Printable text with newlines and tabs kept: escape sequences and other controls removed."""
    return _CONTROL.sub("", _ANSI.sub("", text.replace("\r\n", "\n")))


def cap_output(text: str) -> str:
    """At most OUTPUT_LIMIT characters: the head names the failure, the tail often says how to fix it."""
    s = strip_control(text).strip()
    if len(s) <= OUTPUT_LIMIT:
        return s
    return s[:OUTPUT_HEAD] + "…" + s[-OUTPUT_TAIL:]
