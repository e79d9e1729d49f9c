"""Reading GOALS.md (v4): gates tables anywhere and numbered directives under ``## Directives``.

A gates table is any markdown table whose header names at least ``ID``, ``Check`` and ``Weight``
(``Description``, ``Tags`` and ``Type`` are optional); headings and tables inside code fences are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evolve.work.goals.fields import file_error, parse_id, parse_tags, parse_weight, unique_goals, unwrap_code
from evolve.work.goals.model import GOAL_TYPES, Directive, Goal

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


def parse_markdown(path: Path, text: str) -> tuple[tuple[Goal, ...], tuple[Directive, ...]]:
    """One pass: gates tables anywhere, ``### N. Title`` blocks under ``## Directives``, the rest ignored."""
    lines = text.splitlines()
    goals: list[Goal] = []
    directives: list[Directive] = []
    draft: _DirectiveDraft | None = None
    section = ""
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
        if s.startswith("|"):
            header = _split_row(s)
            if _gates_columns(header) is not None:
                i = _read_table(path, lines, i, header, goals)
                continue
        heading = _HEADING.match(s)
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
    return unique_goals(path, goals), tuple(directives)


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


def _read_table(path: Path, lines: list[str], i: int, header: list[str], goals: list[Goal]) -> int:
    """Parse rows after the header line; returns the index of the first line after the table."""
    cols = _gates_columns(header)
    assert cols is not None
    while i < len(lines) and lines[i].strip().startswith("|"):
        s = lines[i].strip()
        i += 1
        if _SEPARATOR.match(s):
            continue
        cells = _split_row(s)
        if len(cells) != len(header):
            raise file_error(path, f"line {i}: gates table row has {len(cells)} columns, the header has {len(header)}")
        goals.append(_table_goal(path, i, cells, cols))
    return i


def _table_goal(path: Path, lineno: int, cells: list[str], cols: Mapping[str, int]) -> Goal:
    def cell(name: str) -> str:
        return cells[cols[name]].strip() if name in cols else ""

    where = f"line {lineno}"
    gid = parse_id(path, unwrap_code(cell("id")), where)
    where = f"line {lineno}: goal {gid!r}"
    check = unwrap_code(cell("check"))
    if not check:
        raise file_error(path, f"{where}: missing check")
    gtype = cell("type").lower() or "health"
    if gtype not in GOAL_TYPES:
        raise file_error(path, f"{where}: invalid type {gtype!r}")
    return Goal(
        id=gid,
        description=cell("description") or gid,
        check=check,
        weight=parse_weight(path, where, cell("weight")),
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
