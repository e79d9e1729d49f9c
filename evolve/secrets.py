"""Secrets never reach what evolve writes: the values of secret-named env vars are masked.

Agent output, structured logs, the ledger's error texts and hand-off artifacts pass through
:func:`redact`; anything that looks like a well-known key format is masked too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|AUTHORIZATION|CREDENTIALS?)$", re.I)
_KEY_SHAPES = re.compile(
    r"(sk-[A-Za-z0-9_\-]{8,}|ghp_[A-Za-z0-9]{8,}|github_pat_[A-Za-z0-9_]{8,}|xox[abp]-[A-Za-z0-9\-]{8,}"
    r"|AKIA[0-9A-Z]{16}|(?i:bearer)\s+[A-Za-z0-9._\-]{12,})"
)
MASK = "***"
MIN_SECRET = 6  # shorter values would mask ordinary words


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    values = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET}
    return sorted(values, key=len, reverse=True)  # longest first: no partial masks


def redact(text: str, values: Iterable[str] = ()) -> str:
    for v in values:
        if v in text:
            text = text.replace(v, MASK)
    return _KEY_SHAPES.sub(MASK, text)


def redact_bytes(data: bytes, values: Iterable[str] = ()) -> bytes:
    for v in values:
        b = v.encode()
        if b in data:
            data = data.replace(b, MASK.encode())
    return _KEY_SHAPES.sub(MASK, data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
