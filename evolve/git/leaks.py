"""What a chain would leak (docs/DESIGN.md §8.3, *Secrets*): the secrets evolve holds, looked for in what lands.

Pure: the shell (:func:`evolve.git.landing.leaks`) streams the chain's commits through :func:`scan` — each
commit's author, committer and message, the name of every file it adds or changes, every line it adds —
and the landing plan refuses a chain with a *hit*: the literal value of a secret evolve holds or passes.
A secret's *shape* alone (a PEM private key, ``ghp_...``, ``AKIA...``: test fixtures are full of them) is
a *warning*. No text this module returns holds a secret's value: a reason names the variable, and a path
shown has every value masked.

Which values are secrets (:func:`held`): the ones :mod:`evolve.redact` masks (secret-named variables of the
fire's environment, URL passwords), plus any value a ``pass_env`` key hands a child that looks like a token
(:data:`TOKEN_LIKE`: 20+ characters of letters, digits and ``_-+=.``, with both a letter and a digit). Other
``pass_env`` values (``AWS_REGION=us-east-1``, a path, a URL without a password) are configuration that a
commit may well name. ``[agent] api_key_env`` names the HTTP runner's credential: its value counts, whatever
the variable is called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from evolve.childenv import matches
from evolve.redact import MASK, MIN_LITERAL, secret_name, shapes

TOKEN_LIKE = re.compile(r"(?=[^\s]*[A-Za-z])(?=[^\s]*[0-9])[A-Za-z0-9_\-+=.]{20,}")
FRAGMENT_MIN = 16  # a line of a multi-line secret (a PEM key's body) that identifies it on its own
KEPT = 50  # findings of each kind kept (the rest counted): a fixture of a thousand tokens stays a short record
SHOWN = 2  # hits a refusal's reason spells out (it is cut to 300 characters in the ledger)
_URL_PASSWORD = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:([^\s/]+)@")

MESSAGE, PERSON, NAME, LINE = "message", "person", "name", "line"


class Secrets:
    """The values to look for: each literal (or a line of a multi-line one) -> what holds it, as a reason
    says it (``the value of GITHUB_TOKEN``, ``the password in DATABASE_URL``). Immutable once made."""

    def __init__(self, labels: Mapping[str, str] | None = None) -> None:
        self.labels: dict[str, str] = dict(labels or {})
        values = sorted(self.labels, key=len, reverse=True)  # longest first: a value inside another is the other
        self._pattern = re.compile("|".join(map(re.escape, values))) if values else None

    def __bool__(self) -> bool:
        return bool(self.labels)

    def find(self, text: str) -> list[str]:
        """The labels of the values ``text`` holds, each once, in order."""
        if self._pattern is None:
            return []
        return list(dict.fromkeys(self.labels[m.group(0)] for m in self._pattern.finditer(text)))

    def mask(self, text: str) -> str:
        return self._pattern.sub(MASK, text) if self._pattern is not None else text


def held(env: Mapping[str, str], pass_env: Iterable[str] = (), credentials: Iterable[str] = ()) -> Secrets:
    """The secrets of ``env`` (a fire's environment), what ``pass_env`` (every such key's names) passes that
    looks like a token, and the variables ``credentials`` names (``[agent] api_key_env``) whatever they hold."""
    passed = tuple(pass_env)
    named = set(credentials)
    labels: dict[str, str] = {}

    def add(value: str, label: str) -> None:
        labels.setdefault(value, label)
        if "\n" in value:  # a PEM key in a variable: each body line is the key, wherever it lands
            for part in value.splitlines():
                part = part.strip()
                if len(part) >= FRAGMENT_MIN and not part.startswith("-----"):
                    labels.setdefault(part, label)

    for name, value in sorted(env.items()):
        if not isinstance(value, str):
            continue
        if len(value) >= MIN_LITERAL and (secret_name(name) or name in named or (
                passed and matches(name, passed) and TOKEN_LIKE.fullmatch(value))):
            add(value, f"the value of {name}")
        for m in _URL_PASSWORD.finditer(value):
            if len(m.group(1)) >= MIN_LITERAL:
                add(m.group(1), f"the password in {name}")
    return Secrets(labels)


@dataclass(frozen=True)
class Finding:
    commit: str
    where: str  # MESSAGE (its message), PERSON (author or committer), NAME (a file's name), LINE (an added line)
    what: str  # a hit: the label of the secret; a warning: the kind of shape
    path: str = ""  # NAME, LINE: the file, every secret's value masked

    def hit(self) -> str:
        c = self.commit[:12]
        if self.where == MESSAGE:
            return f"commit {c}'s message holds {self.what}"
        if self.where == PERSON:
            return f"commit {c}'s author or committer holds {self.what}"
        if self.where == NAME:
            return f"commit {c} adds a file {self.path} whose name holds {self.what}"  # never "NAME_TOKEN: x"
        return f"commit {c} adds a line holding {self.what} to {self.path}"

    def warning(self) -> str:
        c = self.commit[:12]
        if self.where == MESSAGE:
            return f"commit {c}'s message holds what looks like {self.what}"
        if self.where == PERSON:
            return f"commit {c}'s author or committer holds what looks like {self.what}"
        if self.where == NAME:
            return f"commit {c} adds a file {self.path} whose name holds what looks like {self.what}"
        return f"commit {c} adds what looks like {self.what} to {self.path}"


@dataclass
class Found:
    """What :func:`scan` found: hits refuse the landing, shapes are warnings (each kept up to :data:`KEPT`)."""

    hits: list[Finding] = field(default_factory=list)
    shapes: list[Finding] = field(default_factory=list)
    more_hits: int = 0
    more_shapes: int = 0

    def reasons(self) -> tuple[str, ...]:
        return tuple(f.hit() for f in self.hits)

    def warnings(self) -> tuple[str, ...]:
        out = [f.warning() for f in self.shapes]
        return (*out, f"and {self.more_shapes} more") if self.more_shapes else tuple(out)


def scan(
    secrets: Secrets,
    messages: Iterable[tuple[str, str, str]] = (),
    names: Iterable[tuple[str, str]] = (),
    lines: Iterable[tuple[str, str, str]] = (),
) -> Found:
    """Every hit and shape in a chain's commits, each (commit, where, what, path) once.

    ``messages``: (commit, where, text) with ``where`` MESSAGE or PERSON; ``names``: (commit, path) of each
    file a commit adds or changes; ``lines``: (commit, path, text) of each line a commit adds. Consumed once,
    in order, holding nothing but the findings: the shell streams a change of any size through it.
    """
    found = Found()
    seen: set[Finding] = set()

    def note(f: Finding, hit: bool) -> None:
        if f in seen:
            return
        if len(found.hits if hit else found.shapes) >= KEPT:
            if hit:
                found.more_hits += 1
            else:
                found.more_shapes += 1
            return
        seen.add(f)
        (found.hits if hit else found.shapes).append(f)

    def look(commit: str, where: str, text: str, path: str = "") -> None:
        shown = secrets.mask(path) if path else ""
        for label in secrets.find(text):
            note(Finding(commit, where, label, shown), True)
        for kind in dict.fromkeys(shapes(text)):
            note(Finding(commit, where, kind, shown), False)

    for commit, where, text in messages:
        look(commit, where, text)
    for commit, path in names:
        look(commit, NAME, path, path)
    for commit, path, text in lines:
        look(commit, LINE, text, path)
    return found


def refusal(reasons: tuple[str, ...], more: int = 0) -> str:
    """The landing's reason for a chain with hits: the first few, the secrets named, never their values.
    ``more``: hits found past the ones ``reasons`` keeps."""
    shown = "; ".join(reasons[:SHOWN])
    rest = len(reasons) - SHOWN + more
    return (f"the change holds secrets evolve holds, so nothing lands: {shown}"
            + (f"; and {rest} more" if rest > 0 else ""))
