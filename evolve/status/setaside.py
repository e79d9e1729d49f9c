"""Work evolve set aside under ``refs/evolve/`` (docs/DESIGN.md §8.3): what each ref is, whether it needs the
operator, and what ``evolve setaside`` may do with it.

Listed from the repository's files (loose refs and ``packed-refs``), not by running git: ``status`` must
start fast. Whether a ref still matters is read from the ledger (no git either): the entry that names it
gives its item, and a later cycle that finalized that item *supersedes* it. Only counting the commits that
wait to land runs git in ``status``, and only when some do. The functions at the end read commits through
git, for ``evolve setaside`` and the report.

The kinds, and who deals with them:

- ``stranded/<cycle>[-n]``: a dead cycle's work, set aside by the next fire; its item was released and is
  retried: a warning, never DEGRADED;
- ``interrupted/<cycle>[-n]``: an interrupted cycle's edits (KILL, SIGTERM): as stranded;
- ``uncommitted/<cycle>[-n]``: a green change whose commit failed; its item was released: as stranded;
- ``unlanded/<cycle>[-n]``: green commits that could not be replayed onto a moved branch. The gate judged
  them green and nobody else will bring them back: DEGRADED until applied, dropped, or superseded;
- ``pending/<branch>``: green commits waiting to land; the fire lands them (never applied or dropped here);
- ``applied/<kind>/<name>``: a ref ``evolve setaside apply`` took into the checkout, kept as a backup until
  ``[git] setaside_keep_days`` (listed, no warning).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.results import SUCCESS

PREFIX = "refs/evolve/"
KINDS = ("stranded", "interrupted", "unlanded", "uncommitted", "pending", "applied")
RETRIED = ("stranded", "interrupted", "uncommitted")  # their item was released: a later cycle does it again
# What retention may drop (cycle/retention.py spells the same list: the cycle layer cannot import this one).
PRUNABLE = ("stranded", "interrupted", "unlanded", "uncommitted", "applied")
SCAN_CAP = 20_000  # ledger entries read back to find the cycles the refs name (never the whole ledger)
WHAT = {
    "stranded": "a dead cycle's work",
    "interrupted": "an interrupted cycle's edits",
    "uncommitted": "a change git would not commit",
    "unlanded": "green commits that did not land",
    "pending": "green commits waiting to land",
    "applied": "taken into your checkout by `evolve setaside apply`",
}
_NAME = re.compile(r"(\d{1,18})(?:-\d{1,9})?")
_BAD = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|/\.|\.lock(?:/|$)|^/|/$|^\.|^-")


def common_dir(repo: Path) -> Path | None:
    """The repository's git directory shared by its worktrees; None when ``repo`` has none."""
    dot = repo / ".git"
    if dot.is_dir():
        return dot
    try:
        text = dot.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(os.path.join(repo, text[len("gitdir:"):].strip()))
    try:
        rel = (gitdir / "commondir").read_text(encoding="utf-8").strip()
    except OSError:
        return gitdir
    return Path(os.path.normpath(gitdir / rel))


def evolve_refs(repo: Path) -> dict[str, list[str]]:
    """``{kind: [ref, ...]}`` for every kind of :data:`KINDS` that has refs, sorted."""
    git = common_dir(repo)
    if git is None:
        return {}
    names: set[str] = set()
    base = git / "refs" / "evolve"
    if base.is_dir():
        for root, _dirs, files in os.walk(base):
            for f in files:
                if not f.endswith(".lock"):
                    names.add(PREFIX + Path(root, f).relative_to(base).as_posix())
    try:
        with open(git / "packed-refs", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 2 and parts[1].startswith(PREFIX):
                    names.add(parts[1])
    except OSError:
        pass
    out: dict[str, list[str]] = {}
    for name in sorted(names, key=_order):
        kind = name[len(PREFIX):].split("/", 1)[0]
        if kind in KINDS:
            out.setdefault(kind, []).append(name)
    return out


def _order(ref: str) -> tuple[str, int, str]:
    """Refs of one kind by cycle number (``stranded/9`` before ``stranded/10``), then by name."""
    p = parse(ref)
    return (p.kind if p else ref, p.cycle if p and p.cycle is not None else -1, ref)


# -- names ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Name:
    kind: str
    name: str  # after ``<kind>/``: ``12``, ``12-2``, a branch, or ``unlanded/12`` for an applied ref
    cycle: int | None  # the cycle the name gives (None for pending refs)

    @property
    def ref(self) -> str:
        return f"{PREFIX}{self.kind}/{self.name}"

    @property
    def short(self) -> str:
        return f"{self.kind}/{self.name}"


def parse(ref: str) -> Name | None:
    """What a full ref under ``refs/evolve/`` names; None when it is not one of :data:`KINDS`."""
    if not ref.startswith(PREFIX):
        return None
    kind, _, name = ref[len(PREFIX):].partition("/")
    if kind not in KINDS or not name:
        return None
    last = name.rsplit("/", 1)[-1]
    m = _NAME.fullmatch(last)
    cycle = int(m.group(1)) if m and kind != "pending" else None
    return Name(kind, name, cycle)


def full_ref(arg: str) -> str:
    """The full ref an operator means: ``refs/evolve/stranded/12``, ``evolve/stranded/12`` or ``stranded/12``.

    ValueError (one line) for anything else: an unknown kind, an empty name, characters git refuses in a ref.
    """
    text = arg.strip()
    if not text or len(text) > 400 or _BAD.search(text):
        raise ValueError(f"not a set-aside ref: {arg[:80]!r} (e.g. stranded/12 or refs/evolve/unlanded/7)")
    text = text.removeprefix("refs/").removeprefix("evolve/")
    ref = PREFIX + text
    if parse(ref) is None:
        raise ValueError(f"not a set-aside ref: {arg[:80]!r}: the kind is one of {', '.join(KINDS)}"
                         " (e.g. stranded/12)")
    return ref


# -- what each ref is, from the ledger (pure) -------------------------------------------------------


@dataclass(frozen=True)
class Aside:
    """One set-aside ref, with what the ledger says about it."""

    ref: str
    kind: str
    cycle: int | None  # from its name
    origin_cycle: int | None = None  # the ledger entry it came from (names it, or has its cycle)
    work_ref: str | None = None  # that entry's item
    start_sha: str | None = None  # that cycle's start (``cycle_start_sha``): the base of its change
    superseded_by: int | None = None  # a later cycle that finalized the same item
    why: str | None = None  # an unlanded ref's: why it did not land (that entry's ``error``: a secret, a conflict)

    @property
    def short(self) -> str:
        return self.ref.removeprefix(PREFIX)

    @property
    def needs_operator(self) -> bool:
        """Green work nobody else brings back: an unlanded ref whose item no later cycle finalized."""
        return self.kind == "unlanded" and self.superseded_by is None

    def as_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "kind": self.kind, "cycle": self.cycle, "origin_cycle": self.origin_cycle,
                "work_ref": self.work_ref, "superseded_by": self.superseded_by,
                "needs_operator": self.needs_operator, "why": self.why}


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _names_ref(e: Mapping[str, Any], ref: str) -> bool:
    """The entry records ``ref`` in one of its ``*_ref`` fields (``unlanded_ref``, ``uncommitted_ref``, ...)."""
    return any(k.endswith("_ref") and k != "work_ref" and v == ref for k, v in e.items())


def _item_of(e: Mapping[str, Any]) -> str | None:
    ref = e.get("work_ref")
    if isinstance(ref, str) and ref:
        return ref
    target = e.get("target")  # upstream's entries: the target is the work ref ("idle" when none)
    return target if isinstance(target, str) and target and target != "idle" else None


def _finalizes(e: Mapping[str, Any]) -> bool:
    """The item was finalized by this entry (``transition.claim_action``): success, and not heavy."""
    return e.get("result") in SUCCESS and not e.get("context_heavy")


def assess(refs: Mapping[str, Sequence[str]], entries: Sequence[Mapping[str, Any]]) -> list[Aside]:
    """Each ref of ``refs`` (:func:`evolve_refs`) with its origin and whether it is superseded (pure).

    ``entries``: ledger entries, oldest first. A ref's origin is the newest entry naming it in a ``*_ref``
    field, else the newest entry of the cycle its name gives (a stranded ref names the dead cycle, whose
    ``crashed`` entry reconcile wrote). It is superseded when a later entry finalized the same item.
    """
    by_cycle: dict[int, int] = {}
    named: dict[str, int] = {}
    finalized: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        c = _int(e.get("cycle"))
        if c is not None:
            by_cycle[c] = i
        for k, v in e.items():
            if k.endswith("_ref") and k != "work_ref" and isinstance(v, str):
                named[v] = i
        item = _item_of(e)
        if item is not None and _finalizes(e):
            finalized.setdefault(item, []).append(i)
    out: list[Aside] = []
    for kind in KINDS:
        for ref in refs.get(kind, ()):
            name = parse(ref)
            if name is None:
                continue
            origin = named.get(ref, by_cycle.get(name.cycle) if name.cycle is not None else None)
            if kind == "pending" or origin is None:
                out.append(Aside(ref, kind, name.cycle))
                continue
            e = entries[origin]
            start = e.get("cycle_start_sha")
            item = _item_of(e)
            later = next((j for j in finalized.get(item, ()) if j > origin), None) if item else None
            why = e.get("error") if kind == "unlanded" else None
            out.append(Aside(ref, kind, name.cycle, _int(e.get("cycle")), item,
                             start if isinstance(start, str) and start else None,
                             _int(entries[later].get("cycle")) if later is not None else None,
                             why if isinstance(why, str) and why else None))
    return out


def entries_for(ledger: Any, refs: Mapping[str, Sequence[str]], cap: int = SCAN_CAP) -> list[dict[str, Any]]:
    """The ledger's entries back to the oldest cycle a ref names, oldest first (bounded by ``cap``).

    Read only when there are refs to assess; a ref older than the window read has no origin (not superseded).
    """
    if not any(k != "pending" for k in refs):
        return []
    cycles = [n.cycle for rs in refs.values() for r in rs if (n := parse(r)) is not None and n.cycle is not None]
    oldest = min(cycles) if cycles else None
    out: list[dict[str, Any]] = []
    for n, e in enumerate(ledger.scan_back()):
        if n >= cap:
            break
        out.append(e)
        c = _int(e.get("cycle"))
        if oldest is not None and c is not None and c < oldest:
            break
    out.reverse()
    return out


def _shorts(items: Sequence[Aside], cap: int = 3) -> str:
    shown = ", ".join(a.ref for a in items[:cap])
    return shown + (f" (+{len(items) - cap} more)" if len(items) > cap else "")


def health(items: Sequence[Aside], pending_counts: Mapping[str, int | None], keep_days: float
           ) -> tuple[list[str], list[str]]:
    """(degraded reasons, warnings), pure: only green work nobody else brings back needs the operator.

    An unlanded ref degrades status until it is applied, dropped or superseded; stranded, interrupted and
    uncommitted refs are warnings (their items are retried), with the command that deals with them.
    """
    degraded: list[str] = []
    warnings: list[str] = []
    kept = (f"dropped after {keep_days:g} day(s) ([git] setaside_keep_days)" if keep_days > 0
            else "kept until dropped ([git] setaside_keep_days = 0)")
    for a in items:
        if a.needs_operator:
            item = f", item {a.work_ref}" if a.work_ref else ""
            why = f" ({' '.join(a.why.split())[:300]})" if a.why else ""
            degraded.append(f"green work from cycle {a.origin_cycle or a.cycle}{item} did not land{why} and is kept at "
                            f"{a.ref}: `evolve setaside apply {a.short}` takes it into your checkout to review, "
                            f"`evolve setaside drop {a.short}` discards it")
    superseded = [a for a in items if a.kind != "pending" and a.kind != "applied" and a.superseded_by is not None]
    if superseded:
        warnings.append(f"{len(superseded)} set-aside ref(s) superseded (their items were done by a later cycle): "
                        f"{_shorts(superseded)}; `evolve setaside drop --superseded` removes them, else {kept}")
    for kind in RETRIED:
        mine = [a for a in items if a.kind == kind and a.superseded_by is None]
        if mine:
            warnings.append(f"{len(mine)} {kind} ref(s), {WHAT[kind]} (the item is retried): {_shorts(mine)};"
                            f" `evolve setaside` lists them (show, apply, drop); {kept}")
    for a in items:
        if a.kind == "pending":
            n = pending_counts.get(a.ref)
            count = f"{n} commit(s)" if n is not None else "commits"
            warnings.append(f"{count} wait at {a.ref}: your checkout has changes in the paths they change; "
                            "commit or stash yours and the next fire lands them")
    return degraded, warnings


def waiting_commits(repo: Path, pending_ref: str) -> int | None:
    """How many commits wait under ``pending_ref`` that its branch does not have (None: git cannot say)."""
    from evolve.git import run as gitrun

    branch = "refs/heads/" + pending_ref.removeprefix(PREFIX + "pending/")
    proc = gitrun.run_git(repo, "rev-list", "--count", f"{branch}..{pending_ref}")
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


# -- what the operator may do with one (pure) ----------------------------------------------------------

IN_PROGRESS = (  # files in a checkout's git dir while an operation waits for the operator
    ("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or `git am`"), ("MERGE_HEAD", "a merge"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"), ("REVERT_HEAD", "a revert"), ("BISECT_LOG", "a bisect"),
)


def _listed(paths: Iterable[str], cap: int = 8) -> str:
    ps = sorted(paths)
    return ", ".join(ps[:cap]) + (f" (+{len(ps) - cap} more)" if len(ps) > cap else "")


def apply_refusal(kind: str, *, in_progress: Sequence[str], touched: set[str], dirty: set[str],
                  present: set[str]) -> str | None:
    """Why ``apply`` must not touch the checkout (None: it may). Nothing of the operator's is ever in its way.

    ``touched``: the paths the change changes; ``dirty``: the checkout's modified, staged and untracked paths;
    ``present``: the paths it touches that exist in the checkout untracked there (ignored files included).
    """
    if kind == "pending":
        return "pending commits land by themselves (the next fire lands them once your paths allow); not applied"
    if in_progress:
        return f"{in_progress[0]} is in progress in your checkout; finish or abort it, then apply again"
    if not touched:
        return "the change is empty (already on your branch): nothing to apply; `evolve setaside drop` removes it"
    mine = (touched & dirty) | present
    if mine:
        return (f"the change touches paths you have modified, staged, untracked or ignored: {_listed(mine)}; "
                "commit or stash them, then apply again")
    return None


def drop_refusal(kind: str) -> str | None:
    if kind == "pending":
        return "pending commits are green work the next fire lands; not dropped (land or reset them with git)"
    return None


# -- commits, through git (the command and the report; never ``status``) --------------------------------


@dataclass(frozen=True)
class Commit:
    sha: str
    committed_at: float | None
    subject: str


def commits(repo: Path) -> dict[str, Commit]:
    """Every ref under ``refs/evolve/`` with its commit, committer date and subject: one git process."""
    from evolve.git.run import run_git

    proc = run_git(repo, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(committerdate:unix)%00%(subject)",
                   PREFIX)
    out: dict[str, Commit] = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        parts = line.split("\0")
        if len(parts) == 4:
            ts = float(parts[2]) if parts[2].isdigit() else None
            out[parts[0]] = Commit(parts[1], ts, parts[3])
    return out


def base_of(repo: Path, sha: str, start_sha: str | None, branch: str = "HEAD") -> str | None:
    """The commit the set-aside change is measured from (None: a root commit, measured from nothing).

    The cycle's start when the ledger has it, so commits the operator removed from the branch since never
    come back with the change; but the fork point with ``branch`` when that is newer (the change's own
    earlier commits are on the branch already, as in-place). Without a start: the fork point, else the parent.
    """
    from evolve.git import refs as gitrefs
    from evolve.git.run import run_git

    proc = run_git(repo, "merge-base", sha, branch)
    fork = proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None
    if start_sha and start_sha != sha and gitrefs.is_ancestor(repo, start_sha, sha):
        return fork if fork and gitrefs.is_ancestor(repo, start_sha, fork) else start_sha
    return fork or gitrefs.rev(repo, f"{sha}^")


def changed(repo: Path, base: str | None, sha: str) -> tuple[set[str], set[str]]:
    """(every path the change changes, those it adds), renames as both their paths."""
    from evolve.git.run import git

    args = ["diff", "--name-status", "-z", "--no-renames", "--no-ext-diff", "--no-textconv"]
    out = git(repo, *args, base, sha) if base else git(repo, "show", "--format=", *args[1:], sha)
    parts = [p for p in out.split("\0") if p]
    touched, added = set(), set()
    for status, path in zip(parts[::2], parts[1::2], strict=False):
        touched.add(path)
        if status.startswith("A"):
            added.add(path)
    return touched, added
