"""Filters and evolve's commits and worktree (docs/DESIGN.md §8.1, §8.3).

- **Plaintext never lands in a filtered file.** Before evolve commits (or lands the agent's own
  commits), every path the repository declares filtered — its committed ``.gitattributes``, or the
  operator's global/system attributes, name a ``filter`` — must go through that filter's clean
  program under evolve's git. When the filter is pinned (the repository's own config sets it and
  the operator has not approved it, :mod:`evolve.git.trust`), has no clean program at all, the
  agent-writable local attributes (``info/attributes``, a local ``core.attributesFile``) override the
  declaration, or the change's own ``.gitattributes`` edit takes it away, :func:`refusal` says why
  and the gate refuses the commit (kept under a ref, never on a branch). A filter only local
  attributes name is local: without its program git stores the bytes as they are, as it always did
  (a filter planted with its attribute in ``.git`` never runs).
- **The worktree a fire cannot make**: :func:`workspace_advice` turns git's error into the cause and
  the fix ``evolve status`` shows; :func:`note_workspace` records it (and the keys left unapproved)
  in ``workspace-health.json``, which ``status`` reads without starting git.
- **git-crypt in a linked worktree**: git-crypt looks for its keys in the worktree's own git
  directory, not the shared one (AGWA/git-crypt#105), so ``git worktree add`` fails in an unlocked
  repository. :func:`evolve.git.worktree.ensure` makes evolve's worktree without a checkout, links
  the keys in, then checks it out through the (approved) filters.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from evolve.git import approve, pins, trust
from evolve.git.pathargs import nul
from evolve.git.run import GitError, git, run_git

# The attribute values that name no filter (``check-attr`` prints these for unset/unspecified).
_NO_FILTER = frozenset({"unspecified", "unset", "set", ""})
_ATTR_FILE_MAX = 1 << 20  # a .gitattributes larger than this is not copied (git itself reads at most 100 MB)
_FILTER_KEYS = r"^(filter\..+\.(clean|smudge|process)|core\.attributesfile)$"
APPROVE = "evolve doctor --trust-git-config"


# -- pure ------------------------------------------------------------------------------------


def parse_check_attr(out: str) -> dict[str, str]:
    """``path -> filter name`` from ``git check-attr -z filter`` (``path NUL attr NUL value NUL``...)."""
    fields = out.split("\0")
    found: dict[str, str] = {}
    for i in range(0, len(fields) - 2, 3):
        path, _attr, value = fields[i], fields[i + 1], fields[i + 2]
        if path and value not in _NO_FILTER:
            found[path] = value
    return found


def runs_clean(name: str, effective: Mapping[str, str]) -> bool:
    """Whether filter ``name`` has a clean side under evolve's git (``process`` or ``clean`` non-empty)."""
    return bool(effective.get(f"filter.{name}.process") or effective.get(f"filter.{name}.clean"))


def blocked(declared: Mapping[str, str], actual: Mapping[str, str], effective: Mapping[str, str]) -> dict[str, str]:
    """Paths whose declared filter would not clean them (pure): ``path -> filter`` for each path the
    repository declares filtered where git would apply another filter (or none), or one with no clean
    program under evolve's git."""
    return {p: name for p, name in sorted(declared.items())
            if actual.get(p) != name or not runs_clean(name, effective)}


def refusal_text(stopped: Mapping[str, str], actual: Mapping[str, str], local: Iterable[str],
                 dropped: Iterable[str] = ()) -> str:
    """One line: which paths evolve refuses to commit and the way out (pure). ``local``: the keys the
    repository's own config sets; ``dropped``: paths whose filter the change's own .gitattributes edit
    takes away."""
    local, dropped = set(local), set(dropped)
    by_filter: dict[str, list[str]] = {}
    for path, name in stopped.items():
        by_filter.setdefault(name, []).append(path)
    name, paths = sorted(by_filter.items())[0]
    shown = ", ".join(paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
    head = f"refused to commit {shown}: .gitattributes filters it through `{name}`"
    if dropped & set(paths):
        return (f"{head}, and this change edits .gitattributes so that it would be stored unfiltered;"
                " make that change by hand if it is meant")
    if any(actual.get(p) != name for p in paths):
        return f"{head}, but local attributes (.git/info/attributes, core.attributesFile) override that; remove them"
    if any(k.startswith(f"filter.{name}.") for k in local):
        return (f"{head}, set in the repository's own git config and not approved, so evolve's git would commit"
                f" it unfiltered; approve it with `{APPROVE}`")
    return f"{head}, which has no clean program here (git-crypt unlock? git lfs install?); set it up or drop it"


_FILTER_FAILED = re.compile(r"(?P<path>[^\n]*): (?P<kind>smudge|clean) filter (?P<name>\S+) failed")


def failed_filter(error: str) -> str | None:
    """The filter git's error says failed (``<path>: smudge filter <name> failed``), or None (pure)."""
    m = _FILTER_FAILED.search(" ".join(error.split()))
    return m["name"] if m else None


def workspace_advice(error: str, unapproved: Iterable[str]) -> tuple[str, str]:
    """``(cause, fix)`` for a fire that could not make its workspace (pure). ``unapproved``: the
    repository's own keys evolve's git does not run until the operator approves them."""
    error = " ".join(error.split())
    m = _FILTER_FAILED.search(error)
    if m is None:
        return f"the workspace cannot be made: {error[:300]}", "run `evolve doctor`; the next fire tries again"
    name, kind = m["name"], m["kind"]
    path = m["path"].rsplit("fatal: ", 1)[-1].strip()
    cause = f"the worktree cannot be checked out: {kind} filter {name} failed" + (f" on {path}" if path else "")
    if any(k.startswith(f"filter.{name}.") for k in unapproved):
        return cause, (f"approve the repository's filter with `{APPROVE}` (check"
                       f" `git config --get-regexp '^filter\\.{name}\\.'` first)")
    return cause, ("the filter fails in a linked worktree: try `git worktree add --detach /tmp/x HEAD` by hand"
                   " and fix what it says; `evolve doctor` lists the filters evolve runs")


# -- the shell -------------------------------------------------------------------------------


def _check_attr(cwd: Path, paths: list[str], extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    if not paths:
        return {}
    # On stdin, NUL-separated: any number of paths, any name (pathargs.py).
    return parse_check_attr(git(cwd, "check-attr", "-z", "--stdin", "filter", extra_env=extra_env, input=nul(paths)))


def _local_attributes(tree: Path, listing: str) -> bool:
    """Whether attributes the agent can write without a commit are in play: ``info/attributes`` or a
    ``core.attributesFile`` in the repository's own config."""
    if "core.attributesfile" in pins.local_values(listing):
        return True
    common = trust.common_dir(tree)
    return common is None or (common / "info" / "attributes").exists()


def _is_attributes(path: str) -> bool:
    return path == ".gitattributes" or path.endswith("/.gitattributes")


def _safe(rel: str) -> bool:
    return bool(rel) and not any(part in ("", ".", "..", ".git") for part in rel.split("/"))


def _tree_attributes(tree: Path) -> dict[str, bytes]:
    """The ``.gitattributes`` files of ``tree`` as they will be committed (tracked or new, not ignored)."""
    # A glob on purpose: this one call opts out of the literal pathspecs evolve's git has (evolve/git/run.py).
    listed = git(tree, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                 ":(glob)**/.gitattributes", extra_env={"GIT_LITERAL_PATHSPECS": "0"})
    out: dict[str, bytes] = {}
    for rel in sorted({p for p in listed.split("\0") if _safe(p)}):
        try:
            st = os.lstat(tree / rel)
            if stat.S_ISREG(st.st_mode) and st.st_size <= _ATTR_FILE_MAX:  # git ignores a linked one too
                out[rel] = (tree / rel).read_bytes()
        except OSError:
            continue  # deleted in the tree: the base's copy speaks for it
    return out


def _base_attributes(tree: Path, base: str) -> dict[str, bytes]:
    """The ``.gitattributes`` files committed at ``base``."""
    listed = git(tree, "ls-tree", "-r", "-z", "--name-only", base)
    out: dict[str, bytes] = {}
    for rel in sorted({p for p in listed.split("\0") if _safe(p) and _is_attributes(p)}):
        proc = run_git(tree, "cat-file", "blob", f"{base}:{rel}")
        if proc.returncode == 0 and len(proc.stdout) <= _ATTR_FILE_MAX:
            out[rel] = proc.stdout.encode("utf-8", "surrogateescape")
    return out


def _declared(paths: list[str], files: Mapping[str, bytes]) -> dict[str, str]:
    """The filters ``files`` (``.gitattributes`` by path) and the operator's global/system attributes
    name for ``paths``, without the local ones: git's own matching, in a scratch repository holding
    only those files."""
    with tempfile.TemporaryDirectory(prefix="evolve-attrs-") as tmp:
        root = Path(tmp).resolve()
        scratch = {"GIT_DIR": str(root / "git"), "GIT_WORK_TREE": str(root / "tree"),
                   "GIT_COMMON_DIR": str(root / "git")}
        (root / "tree").mkdir()
        for rel, data in files.items():
            dest = root / "tree" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        git(root / "tree", "init", "-q", extra_env=scratch)
        return _check_attr(root / "tree", paths, extra_env=scratch)


def unfiltered(tree: Path, paths: Iterable[str], commit: str = "HEAD") -> list[str]:
    """Paths of ``commit`` that the tree's attributes filter but whose stored blob is not what the filter
    stores: committed before the attribute existed, then replayed under it (the blob moved as it was).

    The filtered content is what git itself would store now (``hash-object`` reads the checked-out file
    through the clean filter of the path's attributes); a deterministic filter (git-crypt, LFS) gives
    back the same blob for a blob that went through it.
    """
    present = sorted(p for p in set(paths) if os.path.isfile(tree / p) and not os.path.islink(tree / p))
    declared = sorted(_check_attr(tree, present)) if present else []
    if not declared:
        return []
    stored: dict[str, str] = {}
    for rec in git(tree, "ls-tree", "-z", "--full-tree", commit, "--", *declared).split("\0"):
        meta, sep, path = rec.partition("\t")
        if sep:
            stored[path] = meta.split()[2]
    now = dict(zip(declared, git(tree, "hash-object", "--", *declared).split(), strict=False))
    return [p for p in declared if p in stored and now.get(p) != stored[p]]


def refusal(tree: Path, paths: Iterable[str], base: str | None = None) -> str | None:
    """Why evolve must not commit (or land) ``paths`` from ``tree``, or None: the module's first rule.
    ``base``: the commit the change started from (a ``.gitattributes`` the change edits or removes
    still declares what it declared there).

    One ``check-attr`` and one ``config`` in the usual case; the declaration is read apart (scratch
    ``check-attr``) when local attributes are in play or the change touches a ``.gitattributes``.
    """
    paths = set(paths)
    present = sorted(p for p in paths if os.path.lexists(tree / p))
    if not present:
        return None
    try:
        return _refusal(tree, present, base if any(_is_attributes(p) for p in paths) else None)
    except GitError as exc:  # unknown is not safe
        return f"refused to commit: cannot tell which filters the paths need ({' '.join(str(exc).split())[:200]})"


def _refusal(tree: Path, present: list[str], base: str | None) -> str | None:
    actual = _check_attr(tree, present)
    listing = git(tree, "config", "--show-scope", "-z", "--get-regexp", _FILTER_KEYS, check=False)
    dropped: set[str] = set()
    if base is None and not _local_attributes(tree, listing):
        declared = actual
    else:
        declared = _declared(present, _tree_attributes(tree))
        if base is not None:
            before = _declared(present, _base_attributes(tree, base))
            dropped = {p for p, name in before.items() if declared.get(p) != name}
            declared = {**declared, **before}
    if not declared:
        return None
    stopped = blocked(declared, actual, pins.effective(listing, trust.trusted_for(tree)))
    return refusal_text(stopped, actual, pins.local_values(listing), dropped) if stopped else None


# -- what status reads -----------------------------------------------------------------------


def note_workspace(paths: Any, *, error: str | None, fire_id: str) -> dict[str, Any] | None:
    """Record what ``evolve status`` says about the workspace (``paths.workspace_health``, written
    atomically): why it could not be made, and the repository's keys evolve's git leaves pinned;
    removed when there is nothing to say. Returns the record. git's error is redacted (the sink);
    the keys' values are kept as .git/config holds them, so ``status`` can match them to approvals."""
    from evolve import redact
    from evolve.store.atomic import write_json
    from evolve.timeutil import utc_iso

    health = paths.workspace_health
    try:
        seen = approve.observe(paths.repo, paths.git_trust, trust.roots_of(paths.repo, paths.evolve_dir))
        unapproved = {k: list(v) for k, v in seen.unapproved.items()}
        refused = dict(seen.refused)
    except (GitError, OSError):
        unapproved, refused = {}, {}
    rec: dict[str, Any] = {"checked_at": utc_iso(), "fire_id": fire_id, "unapproved": unapproved, "refused": refused}
    if error is not None:
        error = redact.current().text(error)
        cause, fix = workspace_advice(error, unapproved)
        rec["error"] = {"cause": cause, "fix": fix, "filter": failed_filter(error),
                        "git_error": " ".join(error.split())[:500]}
    if error is None and not unapproved and not refused:
        health.unlink(missing_ok=True)
        return None
    write_json(health, rec)
    return rec
