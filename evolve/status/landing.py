"""What waits to land, what did not get pushed, and whether the operator is mid-operation (docs/DESIGN.md §8.3).

Read from evolve's own files (``pending.json``, ``push.json``) and the checkout's git directory, never
by starting git: ``evolve status`` stays fast. The fire writes these files; this module only reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from evolve.git import gitdir
from evolve.paths import Paths


def _read(path: Any) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _short(ref: object) -> str:
    return str(ref).removeprefix("refs/heads/")


def waiting(paths: Paths) -> list[dict[str, Any]]:
    """Per branch: the green work waiting to land, which cycles it carries and why it waits."""
    raw = _read(paths.pending)
    chains = raw.get("chains") if isinstance(raw, Mapping) else None
    out = []
    for chain in (chains or {}).values() if isinstance(chains, Mapping) else ():
        if not isinstance(chain, Mapping) or chain.get("fate"):
            continue
        held = [h for h in chain.get("held") or [] if isinstance(h, Mapping)]
        out.append({
            "branch": _short(chain.get("branch")),
            "ref": "refs/evolve/pending/" + _short(chain.get("branch")),
            "sha": str(chain.get("new") or ""),
            "cycles": [h.get("cycle") for h in held],
            "items": [str(h.get("work_ref") or "")[:200] for h in held],
            "reason": " ".join(str(chain.get("reason") or "").split())[:300],
            "since": chain.get("since"),
        })
    return out


def pushes_failing(paths: Paths) -> list[dict[str, Any]]:
    raw = _read(paths.push_state)
    branches = raw.get("branches") if isinstance(raw, Mapping) else None
    out = []
    for rec in (branches or {}).values() if isinstance(branches, Mapping) else ():
        if isinstance(rec, Mapping) and rec.get("ok") is not True and rec.get("sha"):
            out.append({"branch": _short(rec.get("branch")), "sha": str(rec["sha"]), "remote": str(rec.get("remote")),
                        "error": " ".join(str(rec.get("error") or "").split())[:300],
                        "attempts": rec.get("attempts"), "at": rec.get("at")})
    return out


def lines(paths: Paths) -> tuple[list[str], list[str], dict[str, Any]]:
    """(degraded reasons, warnings, the ``landing`` object of ``status --json``)."""
    degraded: list[str] = []
    warnings: list[str] = []
    busy = gitdir.busy(paths.repo)
    if busy:
        warnings.append(f"your checkout is busy ({busy}): no cycle runs and nothing lands until it ends")
    wait = waiting(paths)
    for w in wait:
        n = len(w["cycles"])
        why = w["reason"] or "the next fire tries again"
        warnings.append(f"{n} cycle(s) of green work wait at {w['ref']} to land on {w['branch']}: {why}; "
                        "the next fire lands them once that is resolved (their items stay claimed)")
    pushes = pushes_failing(paths)
    for p in pushes:
        degraded.append(f"push of {p['sha'][:12]} to {p['remote']} {p['branch']} failed ({p['attempts']}x): "
                        f"{p['error']}; every fire retries it")
    return degraded, warnings, {"operator_busy": busy or None, "waiting": wait, "push_failing": pushes}
