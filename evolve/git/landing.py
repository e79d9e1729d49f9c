"""The shell of the landing (docs/DESIGN.md §8.3): read the snapshot :func:`evolve.git.land.plan` needs, and
apply its steps with git.

Every step is git's own, through :func:`evolve.git.run.run_git`: the branch moves only by
compare-and-swap (``update-ref <branch> <new> <old>``) or by ``merge --ff-only`` in the checkout that
has it; a replay is ``rebase --onto <tip> <base>`` in evolve's own worktree. What a fast-forward cut
short by a death leaves in the operator's checkout is finished here too (:func:`finish`), path by path.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from evolve.git import land
from evolve.git.change import changed, dirty_paths
from evolve.git.checks import Checks, untrusted
from evolve.git.checks import reason as check_reason
from evolve.git.gitdir import busy, index_lock, operating_on
from evolve.git.leaks import MESSAGE, PERSON, Found, Secrets, scan
from evolve.git.pathargs import checkout_index, quoted, reset_index
from evolve.git.refs import head, is_ancestor, rev
from evolve.git.run import SAFE, GitError, GitPolicy, git, identity, run_git, stream_git
from evolve.git.worktree import Checkout, checkouts

LS_TREE_ARGS_MAX = 200  # beyond this many paths, list the whole tree once instead of naming each


def git_running_in(path: Path, proc: Path = Path("/proc")) -> list[float]:
    """Start times (epoch s) of running ``git`` processes whose cwd is inside ``path`` (Linux; [] elsewhere)."""
    try:
        btime = next(float(ln.split()[1]) for ln in (proc / "stat").read_text().splitlines() if ln.startswith("btime"))
        hz = os.sysconf("SC_CLK_TCK")
        entries = list(proc.iterdir())
    except (OSError, StopIteration, ValueError):
        return []
    top, out = path.resolve(), []
    for d in entries:
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != "git":
                continue
            cwd = Path(os.readlink(d / "cwd"))
            if cwd != top and top not in cwd.parents:
                continue
            ticks = float((d / "stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
        out.append(btime + ticks / hz)
    return out


def holder_of(repo: Path, branch: str) -> Checkout | None:
    """The checkout (worktree) that has ``branch`` checked out, if any; a checkout rebasing or bisecting
    it has it too (its HEAD is detached meanwhile: :func:`evolve.git.gitdir.operating_on`), so the
    landing waits for the operator there instead of moving the branch under their rebase."""
    found = checkouts(repo)
    return next((c for c in found if c.branch == branch), None) or next(
        (c for c in found if c.branch is None and operating_on(c.path) == branch), None)


def landing_paths(repo: Path, tip: str, new: str) -> dict[str, bool]:
    """Every path a move from ``tip`` to ``new`` writes or removes -> whether ``tip`` has it."""
    paths = changed(repo, tip, new)
    if not paths:
        return {}
    have = _tree_paths(repo, tip, paths)
    return {p: p in have for p in paths}


def _tree_paths(repo: Path, commit: str, paths: Iterable[str]) -> set[str]:
    return set(_sizes(repo, commit, list(paths)))


def _sizes(repo: Path, commit: str, paths: list[str]) -> dict[str, int]:
    """Path -> blob size in ``commit`` for those of ``paths`` it has (``ls-tree -r -l``)."""
    named = paths if len(paths) <= LS_TREE_ARGS_MAX else []
    out = git(repo, "ls-tree", "-r", "-l", "-z", "--full-tree", commit, "--", *named)
    want = set(paths)
    sizes: dict[str, int] = {}
    for rec in out.split("\0"):
        meta, sep, path = rec.partition("\t")
        if not sep or path not in want:
            continue
        parts = meta.split()
        sizes[path] = int(parts[3]) if len(parts) >= 4 and parts[3].isdigit() else 0  # "-" for a submodule
    return sizes


def too_large(repo: Path, base: str, new: str, limit_mb: float) -> tuple[tuple[str, int], ...]:
    """Files any commit of ``base..new`` adds or grows past ``limit_mb`` (0: no limit).

    Every commit, not only the last tree: a dump committed and then removed again would still land in
    the branch's history (and be pushed with it).
    """
    if not limit_mb:
        return ()
    out = git(repo, "log", "--raw", "--no-abbrev", "--no-renames", "--format=", "-z", f"{base}..{new}")
    pairs: set[tuple[str, str, str]] = set()  # (path, old blob, new blob) of every add or change
    fields = out.split("\0")
    i = 0
    while i + 1 < len(fields):
        meta = fields[i].strip()
        if not meta.startswith(":"):  # between commits
            i += 1
            continue
        path, parts = fields[i + 1], meta[1:].split()
        i += 2
        if len(parts) >= 5 and parts[4][:1] in "AMT" and set(parts[3]) != {"0"}:
            pairs.add((path, parts[2], parts[3]))
    shas = sorted({o for _, o, _ in pairs} | {n for _, _, n in pairs})
    sizes = _object_sizes(repo, shas)
    limit = limit_mb * 1e6
    found: dict[str, int] = {}
    for path, o, n in pairs:
        size = sizes.get(n, 0)
        if size > limit and size > sizes.get(o, -1):
            found[path] = max(found.get(path, 0), size)
    return tuple(sorted(found.items()))


def leaks(repo: Path, base: str, new: str, secrets: Secrets, *, content: bool = True) -> Found:
    """What every commit of ``base..new`` holds of ``secrets`` (hits) and of secrets' shapes (warnings):
    authors, committers and messages, the names of the files each adds or changes, every line each adds
    (docs/DESIGN.md §8.3, *Secrets*). Streamed through :func:`evolve.git.leaks.scan`: nothing but the
    findings is held, whatever the change's size. ``content``: False when a file is over ``max_file_mb``
    (the chain is refused for that already): its lines are not read, the names and messages still are.
    A merge the agent made is read against its first parent, so what it brings in is read too."""
    span = f"{base}..{new}"
    return scan(secrets, _messages(repo, span), _names(repo, span), _added_lines(repo, span) if content else ())


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape").rstrip("\n")


def _messages(repo: Path, span: str) -> Iterator[tuple[str, str, str]]:
    """(commit, PERSON or MESSAGE, one line) of each commit's author, committer and message."""
    sha, header = "", 0
    for line in stream_git(repo, "log", "--no-color", "--format=%x00%H%n%an <%ae>%n%cn <%ce>%n%B", span, "--"):
        if line.startswith(b"\0") and len(line) >= 41:
            sha, header = line[1:41].decode("ascii", "replace"), 2
            continue
        if header:
            header -= 1
            yield sha, PERSON, _text(line)
        else:
            yield sha, MESSAGE, _text(line)


def _names(repo: Path, span: str) -> Iterator[tuple[str, str]]:
    """(commit, path) of each file a commit adds or changes (as ``too_large`` walks them: ``--raw -z``)."""
    out = git(repo, "log", "--raw", "-z", "--no-abbrev", "--no-renames", "--diff-merges=first-parent",
              "--format=%H", span, "--")
    fields = out.split("\0")
    sha, i = "", 0
    while i < len(fields):
        f = fields[i].strip("\n")
        if f.startswith(":") and i + 1 < len(fields):
            parts = f[1:].split()
            if len(parts) >= 5 and parts[4][:1] in "AMT":
                yield sha, fields[i + 1]
            i += 2
            continue
        if f:
            sha = f
        i += 1


_HUNK = re.compile(rb"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _added_lines(repo: Path, span: str) -> Iterator[tuple[str, str, str]]:
    """(commit, path, line) of each line a commit adds: ``log -p -U0``, every file as text (an attribute that
    calls a file binary, a textconv or an external diff hides nothing), hunks read by their counts (an added
    line that looks like a header is still content)."""
    sha, path, add, rm = "", "", 0, 0
    for line in stream_git(repo, "log", "-p", "-U0", "--text", "--no-color", "--no-ext-diff", "--no-textconv",
                           "--no-renames", "--diff-merges=first-parent", "--submodule=short",
                           "--src-prefix=a/", "--dst-prefix=b/", "--format=%x00%H", span, "--"):
        if add or rm:
            if line.startswith(b"+") and add:
                add -= 1
                yield sha, path, _text(line[1:])
            elif line.startswith(b"-") and rm:
                rm -= 1
            continue  # "\\ No newline at end of file", between the lines it is about
        if line.startswith(b"\0") and len(line) >= 41:
            sha = line[1:41].decode("ascii", "replace")
        elif line.startswith(b"+++ "):
            name = _text(line[4:])
            path = name[3:-1] if name.startswith('"b/') else name.removeprefix("b/")
        elif m := _HUNK.match(line):
            rm = int(m.group(1)) if m.group(1) is not None else 1
            add = int(m.group(2)) if m.group(2) is not None else 1


def _object_sizes(repo: Path, shas: list[str]) -> dict[str, int]:
    """Object sizes by sha, asked of git on its stdin (``cat-file --batch-check``); missing ones left out."""
    real = [s for s in shas if s and set(s) != {"0"}]
    if not real:
        return {}
    proc = run_git(repo, "cat-file", "--batch-check=%(objectname) %(objectsize)",
                   input="".join(f"{s}\n" for s in real).encode())
    sizes: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        sha, _, size = line.partition(" ")
        if size.isdigit():
            sizes[sha] = int(size)
    return sizes


def in_the_way(checkout: Path, paths: dict[str, bool]) -> tuple[str, ...]:
    """The landing paths a fast-forward would overwrite in ``checkout`` (see :func:`evolve.git.land.in_the_way`)."""
    if not paths:
        return ()
    dirty = dirty_paths(checkout)
    present: set[str] = set()
    blocked: set[str] = set()
    for p in paths:
        if os.path.lexists(checkout / p):
            present.add(p)
        parts = p.split("/")
        for i in range(1, len(parts)):
            prefix = checkout.joinpath(*parts[:i])
            if os.path.islink(prefix) or (os.path.lexists(prefix) and not os.path.isdir(prefix)):
                blocked.add(p)
                break
    return land.in_the_way(paths, dirty, present, blocked)


@dataclass(frozen=True)
class Want:
    """What to ask the plan about: a chain of evolve's commits ``base..new`` for ``branch``."""

    branch: str
    base: str
    new: str


def snapshot(repo: Path, want: Want, *, limit_mb: float = 0.0, stopping: bool = False,
             secrets: Secrets | None = None, checks: Checks | None = None) -> land.Snapshot:
    """Everything :func:`evolve.git.land.plan` reads, taken now (cheap parts first: a stop needs none).

    ``secrets``: the values no commit may hold (:func:`evolve.git.leaks.held`); the chain is read for
    them, and for secrets' shapes, on every snapshot (a replay makes new commits)."""
    base = land.Snapshot(branch=want.branch, tip=None, base=want.base, new=want.new, limit_mb=limit_mb,
                         stopping=stopping)
    if stopping or want.new == want.base:
        return base
    tip = rev(repo, want.branch)
    big = too_large(repo, want.base, want.new, limit_mb)
    found = leaks(repo, want.base, want.new, secrets or Secrets(), content=not big)
    base = replace(base, secrets=found.reasons(), secrets_more=found.more_hits, secret_shapes=found.warnings())
    if tip is None or big or found.hits:
        return replace(base, tip=tip, too_large=big)
    rewritten = untrusted(repo, want.base, want.new, checks) if checks is not None else {}
    if rewritten:
        return replace(base, tip=tip, untrusted_checks=check_reason(rewritten))
    if tip != want.base:
        return replace(base, tip=tip, base_on_branch=is_ancestor(repo, want.base, tip))
    holder = holder_of(repo, want.branch)
    if holder is None:
        return replace(base, tip=tip)
    why = busy(holder.path)
    lock = index_lock(holder.path)
    locked = bool(lock and os.path.lexists(lock))
    way = () if why or locked else in_the_way(holder.path, landing_paths(repo, tip, want.new))
    return replace(base, tip=tip, holder=str(holder.path), holder_busy=why, holder_locked=locked, in_the_way=way)


def replay(tree: Path, onto: str, base: str, new: str, policy: GitPolicy = SAFE) -> str | None:
    """``base..new`` replayed onto ``onto`` in evolve's worktree (detached); the new tip, or None on conflict.

    Only the chain's own commits move: what ``base`` already had (the operator's history, as it was
    when the chain started) is never carried along, so a commit the operator dropped stays dropped.
    """
    ident = identity(tree)
    # -f: what is still dirty in evolve's worktree is not the chain's (the agent's edits of a tracked
    # .agents/, carried by the door and left out of its commits); the rebase would refuse to start on it.
    git(tree, "checkout", "-q", "-f", "--detach", new, policy=policy)
    proc = run_git(tree, "rebase", "-q", "--onto", onto, base, policy=policy, extra_env=ident)
    if proc.returncode != 0:
        run_git(tree, "rebase", "--abort", policy=policy, extra_env=ident)
        return None
    return head(tree)


def fast_forward(checkout: Path, new: str, policy: GitPolicy = SAFE) -> tuple[bool, str]:
    """Git's own fast-forward in the operator's checkout; (False, git's complaint) when it refuses."""
    ident = identity(checkout)
    proc = run_git(checkout, "merge", "-q", "--ff-only", "--no-edit", new, policy=policy, extra_env=ident)
    return proc.returncode == 0, " ".join(proc.stderr.split())[:300]


def commits_of(repo: Path, base: str, new: str) -> list[tuple[str, str]]:
    """(sha, subject) of ``base..new``, oldest first."""
    out = git(repo, "log", "--reverse", "--format=%H %s", f"{base}..{new}")
    return [(line[:40], line[41:]) for line in out.splitlines() if len(line) >= 40]


# -- a fast-forward cut short -------------------------------------------------------------------------


class Version:
    OLD = "old"
    NEW = "new"
    OTHER = "other"


def versions(checkout: Path, old: str, new: str, paths: list[str]) -> dict[str, str]:
    """For each path: does the checkout's file hold ``old``'s version, ``new``'s, or something else?"""
    if not paths:
        return {}
    in_old = _blobs(checkout, old, paths)
    in_new = _blobs(checkout, new, paths)
    present = [p for p in paths if os.path.lexists(checkout / p) and not os.path.isdir(checkout / p)]
    now: dict[str, str] = {}
    if present:
        out = git(checkout, "hash-object", "--stdin-paths", input=quoted(present)).split()
        now = dict(zip(present, out, strict=False))
    found: dict[str, str] = {}
    for p in paths:
        cur = now.get(p)
        if cur == in_new.get(p):
            found[p] = Version.NEW
        elif cur == in_old.get(p):
            found[p] = Version.OLD
        else:
            found[p] = Version.OTHER
    return found


def _blobs(repo: Path, commit: str, paths: list[str]) -> dict[str, str]:
    named = paths if len(paths) <= LS_TREE_ARGS_MAX else []
    out = git(repo, "ls-tree", "-r", "-z", "--full-tree", commit, "--", *named)
    want = set(paths)
    blobs: dict[str, str] = {}
    for rec in out.split("\0"):
        meta, sep, path = rec.partition("\t")
        if sep and path in want:
            blobs[path] = meta.split()[2]
    return blobs


def rollback(checkout: Path, old: str, new: str, had_lock: bool, policy: GitPolicy = SAFE) -> list[str]:
    """Undo what a fast-forward that just failed in the operator's checkout did to it (a stop, a kill of
    git's group): every path the landing writes was clean (at ``old``) when git started, so each that is
    not at ``old`` now is put back (new files removed), its index entry too, and the ``index.lock`` our
    git left (``had_lock``: one existed before it ran, then it is not ours) removed. The paths put back."""
    if not had_lock and not git_running_in(checkout):
        lock = index_lock(checkout)
        if lock is not None and os.path.lexists(lock):
            lock.unlink()
    paths = sorted(changed(checkout, old, new))
    found = versions(checkout, old, new, paths)
    touched = [p for p in paths if found.get(p) != Version.OLD]
    if not touched:
        return []
    in_old = _tree_paths(checkout, old, touched)
    with tempfile.TemporaryDirectory(prefix="evolve-rollback-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(checkout, "read-tree", old, extra_env=env)
        back = [p for p in touched if p in in_old]
        if back:
            git(checkout, "checkout-index", "-f", "-q", "--", *back, extra_env=env, policy=policy)
    for p in touched:
        if p not in in_old and os.path.lexists(checkout / p) and not os.path.isdir(checkout / p):
            (checkout / p).unlink()
    run_git(checkout, "reset", "-q", old, "--", *touched, policy=policy)
    return touched


def finish(checkout: Path, branch: str, old: str, new: str, policy: GitPolicy = SAFE) -> str:
    """Finish a fast-forward from ``old`` to ``new`` that a death cut short; "" when done, else why not.

    git's ``merge --ff-only`` writes the files, then the index, then moves the branch. Killed in
    between, the operator's checkout holds some of our files (and maybe git's ``index.lock``) while
    the branch is still at ``old``: our change would look like their own edits. Every path the landing
    writes was clean when it started (the plan checked), so a path holding neither ``old``'s nor
    ``new``'s version was edited by the operator since: then nothing is touched. Otherwise each path
    is brought to ``new`` (file and index entry), the lock our git left is removed, and the branch is
    moved by compare-and-swap. Run only under the fire lock, with no git running in the checkout.
    """
    tip = rev(checkout, branch)
    paths = sorted(changed(checkout, old, new))
    if tip not in (old, new):
        return f"{land.short_branch(branch)} moved since the landing was cut off; nothing touched"
    on = run_git(checkout, "symbolic-ref", "-q", "HEAD").stdout.strip()
    if on != branch:
        # The operator switched branch since: whatever git did there, their checkout's files and index
        # are now another branch's (git's own checkout put them so), and are theirs to keep.
        if tip == old and run_git(checkout, "update-ref", "-m", "evolve: land (finished)", branch, new,
                                  old).returncode != 0:
            raise GitError(f"cannot move {branch} to {new[:12]}")
        return ""
    found = versions(checkout, old, new, paths)
    edited = sorted(p for p, v in found.items() if v == Version.OTHER)
    if edited:
        return f"you changed paths the landing was writing: {land.paths_text(edited)}; nothing touched"
    if git_running_in(checkout):
        return "a git command is running in your checkout; the landing is finished at a later fire"
    lock = index_lock(checkout)
    if lock is not None and os.path.lexists(lock):
        lock.unlink()  # our killed git's: the landing's own pre-check refused to start over a lock
    in_new = _tree_paths(checkout, new, paths)
    with tempfile.TemporaryDirectory(prefix="evolve-finish-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(checkout, "read-tree", new, extra_env=env)
        stale = [p for p in paths if p in in_new and found[p] != Version.NEW]
        if stale:
            checkout_index(checkout, stale, extra_env=env, policy=policy)
    for p in paths:
        if p not in in_new and os.path.lexists(checkout / p) and not os.path.isdir(checkout / p):
            (checkout / p).unlink()
    if paths:
        reset_index(checkout, new, paths, policy=policy)  # the index entries, nothing else
    if tip == old and run_git(checkout, "update-ref", "-m", "evolve: land (finished)", branch, new,
                              old).returncode != 0:
        raise GitError(f"cannot move {branch} to {new[:12]}")
    return ""
