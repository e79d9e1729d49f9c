"""JSON that is safe on a terminal: C1 controls, DEL, bidi overrides and zero-width characters escaped.

orjson escapes only C0 controls; people ``cat`` and ``tail`` the ledger and the logs, so evolve writes
the rest as ``\\uXXXX`` too. The escapes are plain JSON: ``jq`` and every parser read the same text.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_UNSAFE = re.compile("[\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def escape(data: bytes) -> bytes:
    text = data.decode("utf-8", "surrogatepass")
    if not _UNSAFE.search(text):
        return data
    return _UNSAFE.sub(_escape, text).encode("utf-8", "surrogatepass")


def dumps(obj: Any, option: int | None = None, default: Any = None) -> bytes:
    return escape(orjson.dumps(obj, option=option, default=default))
