"""What evolve trusts, checked around every agent and gate run (docs/DESIGN.md §8.5 *The guard*).

The agent runs as the operator's user. Without a sandbox it can write anything that user can, and even
with one a gate command is repository code. So evolve does not take the files it obeys on trust: a
:class:`Seal` (a hash per file) of the config, the markers, the repository's git config and hooks, the
operator's trust records and (per cycle) the ledger is taken when the fire starts and when each cycle
starts, and :func:`judge` compares it with what is there after the agent ran, after the gate ran
(before anything lands) and before the next cycle:

- a KILL or STOP that appeared is obeyed (the fire's halt check does that; the guard never refuses it);
- any other change (the config edited, a marker deleted or planted, a hook or a remote planted in the
  shared ``.git``, a trust record or the ledger rewritten) was made while only the agent or the gate
  ran: the cycle is refused (nothing lands; its work is kept under ``refs/evolve/unlanded/``), the fire
  ends, status is DEGRADED, a ``guard.refused`` notification goes out (with the operator's notify
  command, loaded before the change), and the change is recorded in ``guard.json`` among the operator's
  records. Every later fire refuses to start while the changed file is still as the agent left it:
  until the operator has looked, put it back (which clears the record) or accepted it (``evolve trust``).

Standard library only (``evolve status`` reads the record through :func:`outstanding`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from evolve import trusted
from evolve.paths import Paths

HALTS = ("KILL", "STOP")  # their appearing is obeyed, never refused
MAX_HASHED = 16 * 1024 * 1024  # a config or a hook, not a build artefact: bigger counts by size and mtime


class How(StrEnum):
    APPEARED = "appeared"
    CHANGED = "changed"
    DELETED = "deleted"


@dataclass(frozen=True)
class Change:
    label: str  # what changed, as the operator knows it (".agents/evolve/config.toml", ".git/hooks/")
    how: How
    after: str | None  # its digest now (None: gone): a later fire is refused while it is still this
    path: str = ""

    def shown(self) -> str:
        return f"{self.label} {self.how}"


@dataclass(frozen=True)
class Verdict:
    refused: tuple[Change, ...] = ()
    halts: tuple[str, ...] = ()  # KILL/STOP that appeared: the fire's halt check obeys them

    @property
    def ok(self) -> bool:
        return not self.refused

    def reason(self, phase: str) -> str:
        changed = ", ".join(c.shown() for c in self.refused[:6])
        return (f"{changed} during the {phase}, not by evolve: refused and not acted on; "
                "put it back, or review it and run `evolve trust`")


@dataclass(frozen=True)
class Seal:
    """label -> (path, digest or None when absent)."""

    files: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def without(self, *labels: str) -> Seal:
        return Seal({k: v for k, v in self.files.items() if k not in labels})


def judge(before: Seal, after: Seal) -> Verdict:
    """Compare two seals (pure): KILL/STOP appearing is obeyed, every other difference is refused."""
    refused: list[Change] = []
    halts: list[str] = []
    for label in sorted(set(before.files) | set(after.files)):
        where, was = before.files.get(label, ("", None))
        where, now = after.files.get(label, (where, None))
        if was == now:
            continue
        how = How.APPEARED if was is None else How.DELETED if now is None else How.CHANGED
        if how is How.APPEARED and _halt_label(label):
            halts.append(label)
            continue
        refused.append(Change(label, how, now, where))
    return Verdict(tuple(refused), tuple(halts))


def _halt_label(label: str) -> bool:
    return Path(label).name in HALTS


# -- the shell: what is sealed -----------------------------------------------------------------


# The operator's per-checkout agent files the worktree links to (evolve/git/worktree.py SHARED): a hook or an
# apiKeyHelper written there would run in the operator's own sessions.
OPERATOR_AGENT_FILES = (".claude/settings.local.json", "CLAUDE.local.md")
# Also the operator's, when untracked: what `evolve setup` writes (passed to the agent with --settings), and MCP
# servers the Claude CLI starts unasked. Tracked, they are the repository's (agent/settings.py); sealing them
# is harmless then (evolve never writes them).
OPERATOR_SETTINGS = (".claude/settings.json", ".mcp.json")


def watched(paths: Paths, common_dir: Path | None, *, ledger: bool, extra: Iterable[Path] = ()) -> dict[str, Path]:
    """label -> path of everything the guard seals (the operator's config, markers, git, trust records)."""
    out: dict[str, Path] = {}

    def add(path: Path) -> None:
        out[_label(path, paths.repo)] = path

    add(paths.config)
    for p in extra:  # the operator's other config layers
        add(p)
    for name in (*OPERATOR_AGENT_FILES, *OPERATOR_SETTINGS):
        add(paths.repo / name)
    for marker in (paths.kill, paths.stop, paths.rescope, paths.ack_regression, *paths.global_kills):
        add(marker)
    if ledger:
        add(paths.ledger)
    if common_dir is not None:  # what the operator's own git runs: hooks, remotes, credential helpers
        for name in ("config", "hooks", "info/attributes"):
            add(common_dir / name)
    # The operator's records (not guard.json: evolve's own).
    for name in (trusted.GIT_TRUST, trusted.CONFIG_TRUST, trusted.CHECKS_TRUST, trusted.PINS):
        add(paths.trust_dir / name if paths.trust_dir is not None else paths.evolve_dir / name)
    return out


def seal(paths: Paths, common_dir: Path | None, *, ledger: bool = False, skip: Iterable[str] = (),
         extra: Iterable[Path] = ()) -> Seal:
    """Hash what :func:`watched` names, now (a directory: every file in it, by name)."""
    files = {label: (str(p), digest(p)) for label, p in watched(paths, common_dir, ledger=ledger,
                                                                  extra=extra).items()}
    return Seal({k: v for k, v in files.items() if k not in set(skip)})


def refreshed(old: Seal, paths: Paths, written: Iterable[Path]) -> Seal:
    """``old`` with the files evolve itself just wrote hashed afresh (their change is evolve's, not the agent's)."""
    files = dict(old.files)
    for p in written:
        label = _label(p, paths.repo)
        if label in files:
            files[label] = (str(p), digest(p))
    return Seal(files)


def _label(path: Path, repo: Path) -> str:
    try:
        return path.relative_to(repo).as_posix()
    except ValueError:
        home = os.path.expanduser("~")
        text = str(path)
        return "~" + text[len(home):] if home != "/" and text.startswith(home + os.sep) else text


def digest(path: Path) -> str | None:
    """A file's sha256; a directory's (every file below it, by relative name, links by target); None: absent.
    Never follows a link: a link is hashed as its target's name."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    h = hashlib.sha256()
    if os.path.islink(path):
        h.update(b"link:" + os.fsencode(os.readlink(path)))
        return h.hexdigest()
    if not os.path.isdir(path):
        _file_into(h, path, st)
        return h.hexdigest()
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            h.update(b"\0name:" + os.fsencode(rel) + b"\0")
            try:
                if os.path.islink(full):
                    h.update(b"link:" + os.fsencode(os.readlink(full)))
                else:
                    _file_into(h, Path(full), os.lstat(full))
            except OSError as exc:
                h.update(f"unreadable:{exc.errno}".encode())
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return h.hexdigest()


def _file_into(h: Any, path: Path, st: os.stat_result) -> None:
    h.update(f"mode:{st.st_mode & 0o7777:o}:".encode())  # a hook made executable is a change
    if st.st_size > MAX_HASHED:
        h.update(f"size:{st.st_size}:mtime:{st.st_mtime_ns}".encode())
        return
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 16):
            h.update(chunk)


# -- the record: what was refused, until the operator looks ------------------------------------


def record(paths: Paths, verdict: Verdict, *, cycle: int, phase: str, at: str) -> None:
    """Add the refused changes to ``guard.json`` (the operator's records), for later fires and status."""
    from evolve.store.atomic import read_json, write_json
    from evolve.store.dirfd import ensure_dir

    ensure_dir(paths.guard.parent)
    old = read_json(paths.guard) if paths.guard.exists() else {}
    entries = [e for e in (old.get("refused") if isinstance(old, dict) else None) or [] if isinstance(e, dict)]
    for c in verdict.refused:
        entries.append({"label": c.label, "how": str(c.how), "path": c.path, "after": c.after, "cycle": cycle,
                        "phase": phase, "at": at})
    write_json(paths.guard, {"version": 1, "refused": entries[-50:]})


def outstanding(paths: Paths) -> list[dict[str, Any]]:
    """The recorded refusals whose file is still as the agent left it (the others are settled: put back,
    or changed again by the operator). Read-only; status calls it."""
    import json

    try:
        obj = json.loads(paths.guard.read_bytes())
    except (OSError, ValueError):
        return []
    entries = obj.get("refused") if isinstance(obj, dict) else None
    if not isinstance(entries, list):
        return []
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("label"), str) or not isinstance(e.get("path"), str):
            continue
        if not e["path"]:
            continue
        path = Path(e["path"])
        if e["label"].endswith("cycle-history.jsonl"):
            continue  # the ledger grows with every cycle: a forged line was refused once, and is named in status
        if digest(path) == e.get("after"):
            out.append(e)
    return out


def accept(paths: Paths) -> list[dict[str, Any]]:
    """The operator has looked: forget every refusal (what is there now is theirs). Returns what was forgotten."""
    from evolve.store.dirfd import remove

    forgotten = outstanding(paths)
    remove(paths.guard)
    return forgotten


def describe(entries: Iterable[Mapping[str, Any]]) -> str:
    """One line for status/doctor/the fire's refusal."""
    parts = [f"{e.get('label')} {e.get('how')} during cycle {e.get('cycle')}'s {e.get('phase')}" for e in entries]
    return ("; ".join(parts[:4]) + (f" (+{len(parts) - 4} more)" if len(parts) > 4 else "") + ": not by evolve, "
            "refused; put it back, or review it and run `evolve trust`")
