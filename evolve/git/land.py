"""The landing decision (docs/DESIGN.md §8.3): one pure function of a snapshot of the git state.

A *chain* is what evolve wants on a branch: commits ``base..new`` that are all evolve's (the cycle's
own, and any still waiting from earlier cycles), where ``base`` was the branch tip when the first of
them was made. :func:`plan` says what to do next with it; the shell (:mod:`evolve.git.landing`) reads
the snapshot, applies the step and asks again, until the chain is on the branch, waits, or cannot
land. Nothing here reads a file or starts git, so every rule is a row of a table test.

The rules keep four promises:

* only the chain lands: when the branch moved (the operator committed, or dropped or amended a
  commit), the chain ``base..new`` is replayed onto the branch as it is now and gated again there;
  the branch is never fast-forwarded over history the operator removed;
* the operator's files are never overwritten: a landing that writes a path their checkout has
  changed, staged, untracked or ignored (or a path below something that is not a directory there)
  waits, with the reason;
* nothing lands that holds the value of a secret evolve holds or passes (:mod:`evolve.git.leaks`), in any
  commit of the chain: its messages, its file names, its added lines;
* nothing lands once the operator asked the cycle to stop (KILL, SIGTERM), and nothing lands while
  their checkout is mid-rebase, -merge, -cherry-pick or -bisect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from evolve.git import leaks

SHOWN_PATHS = 5  # paths named in a reason; the rest are counted


class Step(StrEnum):
    NOTHING = "nothing"  # the chain is empty (no commit to land)
    STOP = "stop"  # a KILL or signal: land nothing, keep the commits
    REFUSE = "refuse"  # the chain may never land as it is (a secret's value, a file over max_file_mb): kept unlanded
    GONE = "gone"  # the branch no longer exists: kept unlanded
    REPLAY = "replay"  # the branch moved: replay base..new onto its tip, gate again, plan again
    CAS = "cas"  # nobody has the branch checked out: compare-and-swap the ref
    FAST_FORWARD = "fast_forward"  # the operator's checkout has it and allows it: git's own fast-forward
    HOLD = "hold"  # wait under refs/evolve/pending/<branch> and try again at a later fire


@dataclass(frozen=True)
class Snapshot:
    """What the decision needs to know about a branch and the chain evolve wants on it."""

    branch: str  # refs/heads/<name>
    tip: str | None  # the branch now (None: deleted)
    base: str  # where the chain starts: the branch tip when its first commit was made
    new: str  # the chain's last commit
    holder: str | None = None  # the checkout that has the branch checked out (None: no checkout has it)
    holder_busy: str = ""  # the operator is mid-operation there ("a rebase is in progress"): why
    holder_locked: bool = False  # an index.lock exists in the holder: git would refuse the fast-forward
    in_the_way: tuple[str, ...] = ()  # landing paths the holder has changed, untracked or ignored
    too_large: tuple[tuple[str, int], ...] = ()  # (path, bytes) over the limit
    limit_mb: float = 0.0
    secrets: tuple[str, ...] = ()  # where the chain holds a secret evolve holds (masked: the variable, no value)
    secrets_more: int = 0  # hits past the ones ``secrets`` keeps
    secret_shapes: tuple[str, ...] = ()  # what only looks like a secret (a fixture's token): a warning, never a refusal
    stopping: bool = False  # KILL or a signal arrived: nothing may land now
    base_on_branch: bool = True  # base is still an ancestor of tip (False: the operator rewrote history)
    untrusted_checks: str = ""  # why: the chain rewrites a gate script or a GOALS check not yet trusted (§8.5)


@dataclass(frozen=True)
class Plan:
    step: Step
    reason: str = ""


def plan(s: Snapshot) -> Plan:
    """The next step for the chain (first match wins; see the module docstring)."""
    if s.new == s.base:
        return Plan(Step.NOTHING)
    if s.stopping:
        return Plan(Step.STOP, "the cycle was asked to stop (KILL or a signal): nothing lands")
    if s.secrets:  # before a file's size: an operator who fixes only that must not apply a leak
        return Plan(Step.REFUSE, leaks.refusal(s.secrets, s.secrets_more))
    if s.too_large:
        return Plan(Step.REFUSE, too_large_reason(s.too_large, s.limit_mb))
    if s.untrusted_checks:  # it was judged by rules it rewrote: the operator decides
        return Plan(Step.HOLD, s.untrusted_checks)
    if s.tip is None:
        return Plan(Step.GONE, f"branch {short_branch(s.branch)} no longer exists")
    if s.tip != s.base:
        if not s.base_on_branch:
            why = f"{short_branch(s.branch)} was rewritten (the cycle's start {s.base[:12]} is no longer on it)"
        else:
            why = f"{short_branch(s.branch)} moved to {s.tip[:12]} during the cycle"
        return Plan(Step.REPLAY, why)
    if s.holder is None:
        return Plan(Step.CAS)
    if s.holder_busy:
        return Plan(Step.HOLD, f"your checkout {s.holder} is busy: {s.holder_busy}")
    if s.holder_locked:
        return Plan(Step.HOLD, f"git would refuse the fast-forward: {s.holder} has an index.lock "
                               "(a git command is running there, or one was killed; evolve doctor checks)")
    if s.in_the_way:
        return Plan(Step.HOLD, "your checkout has changes, untracked or ignored files in paths this landing "
                               f"writes: {paths_text(s.in_the_way)}")
    return Plan(Step.FAST_FORWARD)


def short_branch(ref: str) -> str:
    return ref.removeprefix("refs/heads/")


def shown(path: str) -> str:
    """A path as a reason may show it: bytes that are not UTF-8 (kept by git's surrogate escapes) escaped,
    so the reason can be written to JSON and a terminal."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def paths_text(paths: tuple[str, ...] | list[str]) -> str:
    shown_ = ", ".join(shown(p) for p in paths[:SHOWN_PATHS])
    more = len(paths) - SHOWN_PATHS
    return shown_ + (f" and {more} more" if more > 0 else "")


def too_large_reason(files: tuple[tuple[str, int], ...], limit_mb: float) -> str:
    listed = ", ".join(f"{shown(p)} ({n / 1e6:.1f} MB)" for p, n in files[:SHOWN_PATHS])
    more = len(files) - SHOWN_PATHS
    return (f"the change adds or grows files over [git] max_file_mb = {limit_mb:g}: {listed}"
            + (f" and {more} more" if more > 0 else ""))


def in_the_way(
    landing: dict[str, bool], dirty: set[str], present: set[str], blocked: set[str]
) -> tuple[str, ...]:
    """The landing paths a fast-forward would overwrite in the operator's checkout (pure).

    ``landing``: path -> whether the branch tip already has it (False: the landing adds it). A path
    the checkout has modified, staged or untracked (``dirty``, as git status says) is in the way; so
    is any path the landing adds while something already exists there (``present``: an ignored
    ``local.conf``), and a path below something that is not a plain directory (``blocked``: a file
    or a link where the landing needs a directory).
    """
    out = {p for p in landing if p in dirty or p in blocked}
    out |= {p for p, tracked in landing.items() if not tracked and p in present}
    return tuple(sorted(out))


def operator_busy(git_dir_entries: set[str], head: str | None) -> str:
    """Why the operator's checkout is mid-operation, or "" (pure).

    ``git_dir_entries``: the names present in the checkout's own git directory; ``head``: the content
    of its ``HEAD`` file (None when unreadable). A detached HEAD, an unborn branch, a rebase, merge,
    cherry-pick, revert or bisect in progress: the operator is in the middle of something, so the
    fire touches nothing and lands nothing until it ends (docs/DESIGN.md §8.3).
    """
    if "rebase-merge" in git_dir_entries or "rebase-apply" in git_dir_entries:
        return "a rebase is in progress"
    if "MERGE_HEAD" in git_dir_entries:
        return "a merge is in progress"
    if "CHERRY_PICK_HEAD" in git_dir_entries:
        return "a cherry-pick is in progress"
    if "REVERT_HEAD" in git_dir_entries:
        return "a revert is in progress"
    if "BISECT_LOG" in git_dir_entries or "BISECT_START" in git_dir_entries:
        return "a bisect is in progress"
    if head is None:
        return "its HEAD cannot be read"
    text = head.strip()
    if not text.startswith("ref:"):
        return "HEAD is detached (no branch to land on)"
    if not text[4:].strip().startswith("refs/heads/"):
        return f"HEAD names {text[4:].strip()!r}, not a branch"
    return ""
