"""Secrets never reach an output: one redactor, called once by every sink (docs/DESIGN.md §9).

What is masked:

- **by name**: the values of environment variables whose names contain KEY, SECRET, TOKEN, PASSWORD,
  PASSWD, CREDENTIAL, AUTH, WEBHOOK, PRIVATE or DSN (case-insensitive substrings). Known harmless
  words are taken out of the name first (AUTHOR as in ``GIT_AUTHOR_EMAIL``, KEYBOARD, KEYMAP,
  TOKENIZER), so ``AUTHOR_TOKEN`` still counts but ``GIT_AUTHOR_NAME`` does not. A value shorter
  than :data:`MIN_LITERAL` is never masked as a literal: ``TOKENS=4096`` or ``AUTH=1`` would
  otherwise mask ordinary numbers and words everywhere.
- **by value**: the password of any URL with userinfo (and, for env values that are such URLs, the
  password on its own too), and well-known token shapes anywhere in text: ``sk-``/``sk-ant-``,
  GitHub (``ghp_``, ``gho_``, ``ghs_``, ``ghu_``, ``ghr_``, ``github_pat_``), Slack (``xox?-``,
  webhook URLs), Discord webhook URLs, AWS access key ids, GitLab/npm/Google keys, JWTs, PEM
  private-key blocks, ``Bearer``/``Authorization``/``Cookie`` values and ``password=...``-style
  assignments.

Over-masking is the safe failure; git SHAs, UUIDs and ordinary words are left alone (the tests
say so). This module imports only ``os`` and ``re``: ``evolve status`` and the hooks load it on
their fast path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
PEM_MASK = "[REDACTED PRIVATE KEY]"
FILE_MASK = "redacted"  # '*' has no place in a file name
MIN_LITERAL = 8
MIN_PREFIX = 6  # a text cut short (a cap, a log field) may end in this much of a literal: masked too

_NAME_WORDS = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH|WEBHOOK|PRIVATE|DSN")
_NAME_HARMLESS = re.compile(r"AUTHOR|KEYBOARD|KEYMAP|TOKENIZER")
_URL_PASSWORD = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:([^\s/]+)@")

# One alternation, so a text is scanned once. Named groups decide the replacement (see _replace):
# ``keep`` is a prefix that stays (the header name, the URL up to the password), ``pem`` a key block.
_SHAPES = re.compile(
    "|".join([
        r"(?P<pem>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z))",
        r"(?P<keep1>(?i:\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:))[^\s/]+(?=@)",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/\-]+",
        r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_\-]+",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        r"(?<![A-Za-z0-9_\-])sk-(?:ant-)?[A-Za-z0-9_\-]{16,}",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,})",
        r"\bxox[abeprs]-[A-Za-z0-9\-]{8,}|\bxapp-[A-Za-z0-9\-]{8,}",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        r"\b(?:glpat-[A-Za-z0-9_\-]{16,}|npm_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_\-]{30,})",
        r"(?P<keep2>(?i:\bbearer\s+))[A-Za-z0-9._~+/\-]{12,}=*",
        r"(?P<keep3>(?i:\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
        r"(?:(?i:bearer|basic|token|digest|negotiate)\s+)?)[^\s\"',;]+",
        r"(?P<keep4>(?i:\b(?:x-api-key|x-auth-token)[\"']?\s*[:=]\s*[\"']?))[^\s\"',;]+",
        r"(?P<keep5>(?i:\b(?:set-)?cookie[\"']?\s*[:=]\s*))[^\r\n\"']+",
        r"(?P<keep6>(?i:\b[A-Za-z0-9_.\-]*(?:api[_\-]?key|access[_\-]?key|secret|password|passwd|token|credentials?"
        r"|private[_\-]?key)[\"']?\s*[:=]\s*[\"']?))[^\s\"',;}]{4,}",
    ])
)
# Every shape above needs one of these (lowercased) in the text. Most texts have none, and a few
# substring tests are far cheaper than the alternation: the report calls ``text`` per table cell.
_TRIGGERS = ("-----begin", "://", "eyj", "sk-", "ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "xox", "xapp-",
             "akia", "asia", "glpat-", "npm_", "aiza", "bearer", "authorization", "x-api-key", "x-auth-token",
             "cookie", "key", "secret", "passw", "token", "credential")
_KEEP = ("keep1", "keep2", "keep3", "keep4", "keep5", "keep6")


def _replace(m: re.Match[str]) -> str:
    if m.group("pem") is not None:
        return PEM_MASK
    for g in _KEEP:
        kept = m.group(g)
        if kept is not None:
            return kept + MASK
    return MASK


# What :func:`shapes` calls each kind it finds, by how the match starts (first match wins). The generic
# ``password=``/``token:``/``Bearer``/cookie forms are left out: code is full of ``token = get_token()``.
_KINDS = (
    ("-----BEGIN", "a private key block"), ("https://hooks.slack.com/", "a Slack webhook URL"),
    ("https://", "a Discord webhook URL"), ("eyJ", "a JWT"), ("sk-", "an API key (sk-...)"),
    ("gh", "a GitHub token"), ("github_pat_", "a GitHub token"), ("xox", "a Slack token"),
    ("xapp-", "a Slack token"), ("AKIA", "an AWS access key id"), ("ASIA", "an AWS access key id"),
    ("glpat-", "a GitLab token"), ("npm_", "an npm token"), ("AIza", "a Google API key"),
)


def shapes(text: str) -> list[str]:
    """The kinds of well-known secret shapes in ``text`` (a PEM private key, ``ghp_...``, ``AKIA...``, a URL
    with a password), one per match, in order: what looks like a secret, whatever its value."""
    low = text.lower()
    if not any(t in low for t in _TRIGGERS):
        return []
    out: list[str] = []
    for m in _SHAPES.finditer(text):
        if m.group("keep1") is not None:
            out.append("a URL with a password")
            continue
        if any(m.group(g) is not None for g in _KEEP):
            continue
        found = m.group(0)
        out.append(next((kind for start, kind in _KINDS if found.startswith(start)), "a token"))
    return out


def _prefix_pattern(value: str) -> str:
    """``abcdefgh`` -> ``abcdef(?:g(?:h)?)?``: the literal's first MIN_PREFIX characters or more."""
    head, rest = re.escape(value[:MIN_PREFIX]), value[MIN_PREFIX:]
    tail = ""
    for ch in reversed(rest):
        tail = f"(?:{re.escape(ch)}{tail})?"
    return head + tail


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret."""
    return bool(_NAME_WORDS.search(_NAME_HARMLESS.sub("", name.upper())))


def env_literals(env: Mapping[str, str]) -> set[str]:
    """The values to mask wherever they appear, verbatim: secret-named values and URL passwords."""
    out: set[str] = set()
    for name, value in env.items():
        if not isinstance(value, str):
            continue
        if secret_name(name) and len(value) >= MIN_LITERAL:
            out.add(value)
        for m in _URL_PASSWORD.finditer(value):
            if len(m.group(1)) >= MIN_LITERAL:
                out.add(m.group(1))
    return out


class Redactor:
    """Masks a fixed set of literal values and every known secret shape; immutable and thread-safe."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        values = sorted({v for v in literals if len(v) >= MIN_LITERAL}, key=len, reverse=True)  # longest first
        self.literals: tuple[str, ...] = tuple(values)
        self._literal = re.compile("|".join(map(re.escape, values))) if values else None
        # A literal's prefix at the very end of a text (before an ellipsis): what a cap leaves of it.
        prefixes = "|".join(_prefix_pattern(v) for v in values)
        self._tail = re.compile(f"(?:{prefixes})(?=(?:…|\\.\\.\\.)?\\Z)") if values else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Redactor:
        """A redactor for ``env`` (default ``os.environ``); built once per distinct set of secrets."""
        literals = frozenset(env_literals(os.environ if env is None else env))
        cached = _CACHE.get(literals)
        if cached is None:
            cached = _CACHE[literals] = cls(literals)
        return cached

    def text(self, s: str) -> str:
        if self._literal is not None:
            s = self._literal.sub(MASK, s)
            if self._tail is not None and len(s) >= MIN_PREFIX:
                n = len(self.literals[0]) + 3  # no cut literal (plus an ellipsis) is longer
                s = s[:-n] + self._tail.sub(MASK, s[-n:])
        low = s.lower()
        return _SHAPES.sub(_replace, s) if any(t in low for t in _TRIGGERS) else s

    def bytes(self, b: bytes) -> bytes:
        return self.text(b.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def json(self, obj: Any) -> Any:
        """A copy of a JSON-shaped value with every string (dict keys included) redacted."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {(self.text(k) if isinstance(k, str) else k): self.json(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.json(v) for v in obj]
        return obj

    def filename(self, s: str) -> str:
        """A redacted file-name component: secrets gone, only ``[A-Za-z0-9._-]`` left."""
        clean = self.text(s).replace(PEM_MASK, FILE_MASK).replace(MASK, FILE_MASK)
        return re.sub(r"[^A-Za-z0-9._\-]+", "-", clean).strip("-.")

    def unclosed_pem(self, s: str) -> int:
        """Where an unterminated private-key block starts in ``s`` (-1: none): a stream holds it back."""
        start = s.rfind("-----BEGIN ")
        if start < 0 or "PRIVATE KEY-----" not in s[start : start + 80]:
            return -1
        return -1 if re.search(r"-----END [A-Z0-9 ]*PRIVATE KEY-----", s[start:]) else start


_CACHE: dict[frozenset[str], Redactor] = {}
_active: Redactor | None = None
_default: tuple[frozenset[Any] | None, Redactor] | None = None


def activate(env: Mapping[str, str]) -> Redactor:
    """Make the secrets of ``env`` (a fire's environment) masked by every sink of this process.

    The process's own environment stays covered too: a fire may run with an env of its own
    (the daemon, tests) while sinks such as the ledger have no env to hand.
    """
    global _active
    literals = env_literals(os.environ) | env_literals(env)
    _active = _CACHE.get(frozenset(literals)) or Redactor(literals)
    _CACHE.setdefault(frozenset(literals), _active)
    return _active


def current() -> Redactor:
    """The redactor every sink uses: the activated one, else one for ``os.environ``."""
    if _active is not None:
        return _active
    global _default
    # Per-cell callers (the report's ``t``) must not rescan the environment each time; a changed
    # environment (tests, a daemon's reload) is noticed through the raw mapping's items.
    raw = getattr(os.environ, "_data", None)
    key = frozenset(raw.items()) if isinstance(raw, dict) else None
    if _default is None or key is None or key != _default[0]:
        _default = (key, Redactor.from_env())
    return _default[1]


__all__ = ["MASK", "MIN_LITERAL", "Redactor", "activate", "current", "env_literals", "secret_name", "shapes"]
