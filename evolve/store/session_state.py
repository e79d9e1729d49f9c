"""``session-state.json``: the loop's resume-only state, merge-saved so unknown keys survive.

A corrupt file is moved aside (``session-state.json.corrupt-<UTC>``) and rebuilt from defaults plus
the ledger tail; a field of the wrong type is reset to its default after the original bytes are
saved aside. Either way the fire goes on.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evolve import redact
from evolve.store.atomic import move_aside, save_aside, write_json
from evolve.store.ledger import Ledger, entry_cycle
from evolve.store.records import RECORDS, AgentSession, ClaimedWork, FireRecord, PostCompact, Record
from evolve.timeutil import utc_iso

IDLE_RESULTS = frozenset({"unchanged", "idle"})


@dataclass
class SessionState:
    context_streak: int = 0
    parked_work: list[Any] = field(default_factory=list)
    idle_streak: int = 0
    generator_empty_streak: int = 0
    mode_repeat_streak: int = 0
    last_result: str | None = None
    last_mode: str | None = None
    last_selected_source: str | None = None
    claimed_work: ClaimedWork | None = None
    agent_session: AgentSession | None = None
    consecutive_failures: int = 0
    breaker_open_until: str | None = None
    last_logged_cycle: int = 0
    fire: FireRecord | None = None
    ack_regression_cycle: int = 0
    landed_directives: list[str] = field(default_factory=list)  # "<goals era>|<directive ref>"
    percepts: list[str] = field(default_factory=list)  # facts agents reported, newest last
    attempts: dict[str, int] = field(default_factory=dict)  # failed/regressed cycles per work ref
    parked_items: list[str] = field(default_factory=list)  # refs the attempt budget parked, until `evolve requeue`
    post_compact: PostCompact | None = None  # the state block for the next resumed run after a compaction
    updated_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A record given as its JSON object (tests, callers holding decoded JSON) becomes the record.
        for name, cls in RECORDS.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, Record):
                setattr(self, name, cls.from_json(value))

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.extra)
        for f in OWNED:
            value = getattr(self, f.name)
            out[f.name] = copy.deepcopy(value.to_json() if isinstance(value, Record) else value)
        if "cycle" in out:
            # Upstream's writer keeps its ``cycle`` key at the last logged cycle; a file that has the
            # key is shared with it, so the key stays current (SPEC §2: kept equal when present).
            out["cycle"] = self.last_logged_cycle
        return out


OWNED = [f for f in dataclasses.fields(SessionState) if f.name != "extra"]
_TYPES: dict[str, tuple[type, ...]] = {
    "context_streak": (int,),
    "parked_work": (list,),
    "idle_streak": (int,),
    "generator_empty_streak": (int,),
    "mode_repeat_streak": (int,),
    "last_result": (str, type(None)),
    "last_mode": (str, type(None)),
    "last_selected_source": (str, type(None)),
    "claimed_work": (dict, type(None)),
    "agent_session": (dict, type(None)),
    "consecutive_failures": (int,),
    "breaker_open_until": (str, type(None)),
    "last_logged_cycle": (int,),
    "fire": (dict, type(None)),
    "ack_regression_cycle": (int,),
    "landed_directives": (list,),
    "percepts": (list,),
    "attempts": (dict,),
    "parked_items": (list,),
    "post_compact": (dict, type(None)),
    "updated_at": (str, type(None)),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_ok(name: str, value: Any) -> bool:
    """Whether ``value`` is valid for the field: its JSON form on disk, or its typed record in memory."""
    if name in RECORDS and isinstance(value, RECORDS[name]):
        return True
    types = _TYPES[name]
    if isinstance(value, bool) and bool not in types:
        return False
    if not isinstance(value, types):
        return False
    # Containers the fire does arithmetic or string work on must hold the right items too.
    if name == "attempts":
        return all(_is_int(v) for v in value.values())
    if name in ("percepts", "landed_directives", "parked_work", "parked_items"):
        return all(isinstance(v, str) for v in value)
    return True


@dataclass
class LoadResult:
    state: SessionState
    warnings: list[str] = field(default_factory=list)
    moved_to: Path | None = None


def from_ledger(ledger: Ledger) -> SessionState:
    """Defaults plus what the ledger tail can tell (used when the file is missing or corrupt)."""
    st = SessionState()
    tail = ledger.tail(50).entries
    if not tail:
        return st
    st.last_logged_cycle = ledger.last_cycle()
    last = tail[-1]
    st.last_result = last.get("result") if isinstance(last.get("result"), str) else None
    st.last_mode = last.get("mode") if isinstance(last.get("mode"), str) else None
    src = last.get("selected_source")
    st.last_selected_source = src if isinstance(src, str) else None
    for e in reversed(tail):
        r = e.get("result")
        if r is None:
            continue
        if r not in IDLE_RESULTS or e.get("target") not in (None, "idle"):
            break
        st.idle_streak += 1
    for e in reversed(tail):
        if e.get("result") in ("improved", "context-handoff"):
            break
        if e.get("context_heavy") is True:
            st.context_streak += 1
    return st


def load(path: Path, ledger: Ledger, *, readonly: bool = False) -> LoadResult:
    """Load the state; ``readonly`` (for --dry-run) never moves or writes anything."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return LoadResult(from_ledger(ledger))
    try:
        obj = orjson.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("top level is not an object")
    except (orjson.JSONDecodeError, ValueError) as exc:
        if readonly:
            return LoadResult(from_ledger(ledger), [f"session-state.json is corrupt ({exc})"])
        moved = move_aside(path, "corrupt")
        st = from_ledger(ledger)
        return LoadResult(st, [f"session-state.json is corrupt ({exc}); moved to {moved.name}"], moved)
    st = SessionState()
    warnings: list[str] = []
    bad = False
    for f in OWNED:
        if f.name in obj:
            value = obj[f.name]
            if not _type_ok(f.name, value):
                bad = True
                warnings.append(f"session-state field {f.name!r} has the wrong type; reset to default")
            elif f.name in RECORDS:
                record, wrong = RECORDS[f.name].read(value) if value else (None, [])
                setattr(st, f.name, record)
                # Inside a record a wrong value is reset quietly on disk (the next save), but said here.
                warnings.extend(f"session-state field '{f.name}.{k}' has the wrong type; reset" for k in wrong)
            else:
                setattr(st, f.name, value)
    st.extra = {k: v for k, v in obj.items() if k not in _TYPES}
    if bad and not readonly:
        aside = save_aside(path, "invalid", raw)
        warnings.append(f"original session-state kept at {aside.name}")
    if st.last_logged_cycle == 0 and (lc := ledger.last_cycle()):
        st.last_logged_cycle = lc
    return LoadResult(st, warnings)


def save(path: Path, state: SessionState) -> None:
    """Merge-save: keys another tool added to the file since we loaded it are kept."""
    state.updated_at = utc_iso()
    try:
        on_disk = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        on_disk = None
    if isinstance(on_disk, dict):
        # Unknown keys belong to other tools: the file's current values win over our copy.
        state.extra = {k: v for k, v in on_disk.items() if k not in _TYPES}
    write_json(path, redact.current().json(state.to_dict()))  # the sink: summaries, titles, percepts


def load_readonly(path: Path, ledger: Ledger) -> SessionState:
    return load(path, ledger, readonly=True).state


__all__ = ["LoadResult", "SessionState", "entry_cycle", "from_ledger", "load", "save"]
