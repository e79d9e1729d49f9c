"""Colour and the one-line fire summary, for a human at a terminal only.

Colour is added after a view has been made terminal-safe (``term_safe`` shows ESC as ``\\x1b``), and
only when the stream is a TTY, ``NO_COLOR`` is unset and ``TERM`` is not ``dumb``: a pipe, a file, a
log or a ``--json`` answer never carries an escape. Standard library only: ``evolve status`` imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

RED, YELLOW, CYAN, RESET = "\x1b[31;1m", "\x1b[33;1m", "\x1b[36m", "\x1b[0m"
# The words an operator must not miss, and their colour.
WORDS = {"HALTED": RED, "FAIL": RED, "DEGRADED": YELLOW, "WARN": YELLOW, "DORMANT": CYAN}
# Only at the start of a line (status's "health     X", doctor's "FAIL  check"): never inside agent text.
_LEAD = re.compile(r"^(health {5})?(HALTED|DEGRADED|DORMANT|FAIL|WARN)\b", re.M)


def colour_on(stream: Any, env: Mapping[str, str]) -> bool:
    """https://no-color.org: a TTY, no ``NO_COLOR``, a terminal that is not ``dumb``."""
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
    return tty and not env.get("NO_COLOR") and env.get("TERM", "") != "dumb"


def colourize(text: str, on: bool) -> str:
    """``text`` with the leading HALTED/DEGRADED/DORMANT/FAIL/WARN of each line coloured when ``on``."""
    if not on:
        return text
    return _LEAD.sub(lambda m: (m.group(1) or "") + WORDS[m.group(2)] + m.group(2) + RESET, text)


def _money(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def fire_summary(entries: Sequence[Mapping[str, Any]], *, reason: str, exit_code: int, cost_usd: float,
                 elapsed_s: float) -> str:
    """One line for a human at the end of ``evolve fire``: cycles, results, the last commit, cost, time."""
    from collections import Counter

    from evolve.timeutil import human_s

    counts = Counter(str(e.get("result", "?")) for e in entries)
    results = ", ".join(f"{n} {r}" for r, n in counts.items()) or "no cycle"
    sha = next((str(e["sha"])[:10] for e in reversed(entries) if isinstance(e.get("sha"), str)), None)
    cycles = [e["cycle"] for e in entries if isinstance(e.get("cycle"), int)]
    span = f"cycle {cycles[0]}" if len(cycles) == 1 else f"cycles {cycles[0]}-{cycles[-1]}" if cycles else "0 cycles"
    cost = cost_usd or sum(_money(e.get("cost_usd")) for e in entries)
    head = "FAIL " if exit_code not in (0, 75) else ""
    return (f"{head}evolve: {span}: {results}; commit {sha or 'none'}; ${cost:.2f}; {human_s(round(elapsed_s))}; "
            f"ended: {reason or 'done'} (exit {exit_code})")
