"""Reading GOALS.md (v4): the gates table under ``## Gates`` and numbered directives under ``## Directives``.

The goals are the table directly under the ``## Gates`` heading, as upstream's parser reads them: the
first table in that section whose header names at least ``ID``, ``Check`` and ``Weight``
(``Description``, ``Tags`` and ``Type`` are optional). The section ends at the next heading of any
level (``###`` included). Any other table — a ``## History`` table, an example — is text, and its
"checks" are never run. Headings and tables inside code fences are ignored.

A bad row costs that row only, with a warning naming it (upstream's leniency): a weight that is not
1-10 gets the default 5, a short row is padded with empty cells, a row with an empty id, no check,
an id used before or more cells than the header is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evolve.work.goals.fields import parse_id, parse_tags, parse_weight, unwrap_code
from evolve.work.goals.model import GOAL_TYPES, Directive, Goal, GoalsError

DEFAULT_WEIGHT = 5  # upstream's weight for a row whose weight cannot be read

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_DIRECTIVE = re.compile(r"^(\d+)\.\s+(.+)$")
_LABEL = re.compile(r"^(?:[-*]\s+)?\*\*\s*(steer|directive id|scenarios)\s*(?::\s*\*\*|\*\*\s*:)\s*(.*)$", re.I)
_SEPARATOR = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$")
_FENCE = re.compile(r"^(```|~~~)")


@dataclass
class _DirectiveDraft:
    number: int
    title: str
    body: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def build(self) -> Directive:
        return Directive(
            number=self.number,
            title=self.title,
            description="\n".join(self.body).strip(),
            steer=self.labels.get("steer", ""),
            directive_id=self.labels.get("directive id", ""),
            scenarios=self.labels.get("scenarios", ""),
        )


@dataclass
class _Table:
    """The gates table as it is read: its goals, and a warning per row it could not take whole."""

    goals: list[Goal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read: bool = False  # the section's table was read: later tables are text


def parse_markdown(
    path: Path, text: str
) -> tuple[tuple[Goal, ...], tuple[Directive, ...], tuple[str, ...]]:
    """One pass: the gates table under ``## Gates``, ``### N. Title`` blocks under ``## Directives``,
    the rest ignored. Returns the goals, the directives and one warning per row skipped or repaired."""
    lines = text.splitlines()
    table = _Table()
    directives: list[Directive] = []
    draft: _DirectiveDraft | None = None
    section = ""
    gates = False  # inside the ## Gates section, which any heading ends
    fence: str | None = None
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        i += 1
        if fence is not None or _FENCE.match(s):
            fence = _track_fence(fence, s)
            if draft is not None:
                draft.body.append(lines[i - 1].rstrip())
            continue
        if gates and not table.read and s.startswith("|"):
            header = _split_row(s)
            if _gates_columns(header) is not None:
                i = _read_table(path, lines, i, header, table)
                continue
        heading = _HEADING.match(s)
        if heading:
            gates = len(heading.group(1)) == 2 and heading.group(2).strip().lower() == "gates"
        if heading and len(heading.group(1)) <= 2:
            _flush(draft, directives)
            draft = None
            section = heading.group(2).strip().lower()
            continue
        if section != "directives":
            continue
        if heading and len(heading.group(1)) == 3 and (m := _DIRECTIVE.match(heading.group(2))):
            _flush(draft, directives)
            draft = _DirectiveDraft(number=int(m.group(1)), title=m.group(2).strip())
        elif draft is not None and (label := _LABEL.match(s)):
            draft.labels[label.group(1).lower()] = unwrap_code(label.group(2).strip())
        elif draft is not None and s:
            draft.body.append(s)
    _flush(draft, directives)
    return tuple(table.goals), tuple(directives), tuple(table.warnings)


def _track_fence(fence: str | None, s: str) -> str | None:
    """Open a fence on ``` or ~~~, close it on the same marker; content inside is never structure."""
    m = _FENCE.match(s)
    if fence is None:
        return m.group(1) if m else None
    return None if m and m.group(1) == fence else fence


def _flush(draft: _DirectiveDraft | None, out: list[Directive]) -> None:
    if draft is not None:
        out.append(draft.build())


def _gates_columns(header: Sequence[str]) -> dict[str, int] | None:
    """Column positions when ``header`` is a gates-table header (names matched case-insensitively)."""
    names = [unwrap_code(c.strip().strip("*").strip()).lower() for c in header]
    if not {"id", "check", "weight"} <= set(names):
        return None
    return {n: names.index(n) for n in ("id", "check", "weight", "description", "tags", "type") if n in names}


def _read_table(path: Path, lines: list[str], i: int, header: list[str], table: _Table) -> int:
    """Parse rows after the header line; returns the index of the first line after the table."""
    cols = _gates_columns(header)
    assert cols is not None
    table.read = True
    seen: set[str] = set()
    while i < len(lines) and lines[i].strip().startswith("|"):
        s = lines[i].strip()
        i += 1
        if _SEPARATOR.match(s):
            continue
        cells = _split_row(s)
        if len(cells) > len(header):
            # Columns are ambiguous (an unescaped "|" in a check?): running a guess is worse than skipping.
            table.warnings.append(f"{path}: line {i}: row has {len(cells)} cells, the header {len(header)}; skipped")
            continue
        cells += [""] * (len(header) - len(cells))
        goal = _table_goal(path, i, cells, cols, table.warnings)
        if goal is not None and goal.id in seen:
            table.warnings.append(f"{path}: line {i}: goal {goal.id!r} already defined; row skipped")
        elif goal is not None:
            seen.add(goal.id)
            table.goals.append(goal)
    return i


def _table_goal(path: Path, lineno: int, cells: list[str], cols: Mapping[str, int], warn: list[str]) -> Goal | None:
    """The row's goal, or None (a warning in ``warn``) when it has no usable id or check."""

    def cell(name: str) -> str:
        return cells[cols[name]].strip() if name in cols else ""

    try:
        gid = parse_id(path, unwrap_code(cell("id")), f"line {lineno}")
    except GoalsError as exc:
        warn.append(f"{exc}; row skipped")
        return None
    where = f"line {lineno}: goal {gid!r}"
    check = unwrap_code(cell("check"))
    if not check:
        warn.append(f"{path}: {where}: missing check; row skipped")
        return None
    gtype = cell("type").lower() or "health"
    if gtype not in GOAL_TYPES:
        warn.append(f"{path}: {where}: unknown type {gtype!r}; health used")
        gtype = "health"
    try:
        weight = parse_weight(path, where, cell("weight"))
    except (GoalsError, ValueError) as exc:  # ValueError: more digits than int() takes
        reason = str(exc) if isinstance(exc, GoalsError) else f"{path}: {where}: weight is no integer 1-10"
        warn.append(f"{reason[:300]}; default weight {DEFAULT_WEIGHT} used")
        weight = DEFAULT_WEIGHT
    return Goal(
        id=gid,
        description=cell("description") or gid,
        check=check,
        weight=weight,
        type=gtype,
        tags=parse_tags(path, where, cell("tags") or None),
    )


def _split_row(row: str) -> list[str]:
    """Cells of a markdown table row: ``\\|`` is a literal pipe, and a ``|`` inside a code span never splits."""
    s = row.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and s.startswith("|", i + 1):
            cur.append("|")
            i += 2
        elif ch == "`":
            end = _code_span_end(s, i)
            cur.append(s[i:end].replace("\\|", "|") if end > i + 1 else "`")
            i = max(end, i + 1)
        elif ch == "|":
            cells.append("".join(cur).strip())
            cur = []
            i += 1
        else:
            cur.append(ch)
            i += 1
    cells.append("".join(cur).strip())
    return cells


def _code_span_end(s: str, i: int) -> int:
    """End index of the code span opened by the backtick run at ``i`` (``i + run`` when it never closes)."""
    run = len(s[i:]) - len(s[i:].lstrip("`"))
    j = i + run
    while (k := s.find("`" * run, j)) != -1:
        after = k + run
        if (k == 0 or s[k - 1] != "`") and (after >= len(s) or s[after] != "`"):
            return after
        j = after + len(s[after:]) - len(s[after:].lstrip("`"))
    return i + run if run > 1 else i + 1
