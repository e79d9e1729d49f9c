"""Lists of paths for git, never on its argv (docs/DESIGN.md §8.1, "Path lists").

A change may name more paths than an argv holds: the kernel's ``ARG_MAX`` (2 MB on Linux, less
elsewhere) is passed by 20,000 generated files of long names, and the ``exec`` fails with ``E2BIG``
before git runs. So a list of paths of unbounded length goes on git's stdin, NUL-separated. And not as
pathspecs where git has a form that takes exact paths: git matches every path it walks against every
pathspec, so ``git add --pathspec-from-file`` of 40,000 paths takes a minute (10,000: a second), and a
large change would run into ``[git] timeout_s`` instead. Hence:

- staging exactly some paths (``git add -A -- <paths>``): :func:`stage`, ``update-index --stdin -z``;
- index entries of some paths as a commit has them (``git reset <commit> -- <paths>``): :func:`reset_index`,
  ``ls-tree`` of the commit fed to ``update-index --index-info``;
- files from the index: ``checkout-index --stdin -z``; attributes: ``check-attr --stdin -z``;
- hashing files: ``hash-object --stdin-paths``, which has no ``-z``: each line C-quoted (:func:`quoted`);
- ``--pathspec-from-file=- --pathspec-file-nul`` (:data:`FROM_STDIN`) where a pathspec is what is meant
  (``commit --only`` past the operator's own staged files);
- ``ls-files`` (no stdin form): the whole index, matched here (:func:`ls_files`).

Paths are the bytes git and the file system have: encoded UTF-8 with ``surrogateescape``, the inverse
of how :func:`evolve.git.run.run_git` decodes git's output, so a name that is not UTF-8 (or holds a
newline) reaches git as it is. ``update-index``, ``checkout-index`` and ``hash-object`` take paths, never
patterns; entries read by ``--pathspec-from-file`` are pathspecs, literal under the
``GIT_LITERAL_PATHSPECS=1`` evolve's git always has (a file named ``*`` is that file).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from evolve.git.run import SAFE, GitPolicy, git

FROM_STDIN: tuple[str, ...] = ("--pathspec-from-file=-", "--pathspec-file-nul")
# Bytes of paths :func:`ls_files` still names on an argv (a few paths in a large index): far under
# ARG_MAX (2 MB on Linux, 256 KB on some BSDs), which the environment and evolve's ``-c`` pins share.
ARGV_BUDGET = 64 * 1024


def encode(path: str) -> bytes:
    """``path`` as git printed it (run_git decodes with ``surrogateescape``): the bytes it names."""
    return path.encode("utf-8", "surrogateescape")


def nul(paths: Iterable[str]) -> bytes:
    """``paths`` NUL-terminated, for ``--pathspec-file-nul`` and the ``--stdin -z`` forms."""
    return b"".join(encode(p) + b"\0" for p in paths)


def _c_quote(path: str) -> str:
    out = ['"']
    for b in encode(path):
        if b in (0x22, 0x5C):  # " and \
            out.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:  # a control byte (a newline, a CR git's line reader would drop), or not ASCII: octal
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def quoted(paths: Iterable[str]) -> bytes:
    """One path a line, each C-quoted: git's line readers without ``-z`` (``hash-object --stdin-paths``)
    unquote a line that starts with ``"``, so any name, a newline or a trailing CR in it too, survives."""
    return "".join(_c_quote(p) + "\n" for p in paths).encode("ascii")


def named(path: str, want: set[str]) -> bool:
    """Whether the literal pathspecs ``want`` match ``path``: it, or a directory above it, is one of them
    (``dir`` or ``dir/``, as ``status`` names a repository inside the tree) (pure)."""
    parts = path.split("/")
    for i in range(len(parts), 0, -1):
        up = "/".join(parts[:i])
        if up in want or up + "/" in want:
            return True
    return False


def _fits(paths: list[str]) -> bool:
    return sum(len(encode(p)) + 1 + 8 for p in paths) <= ARGV_BUDGET  # each string, its NUL, its argv pointer


def ls_files(repo: Path, paths: Iterable[str], *, extra_env: Mapping[str, str] | None = None) -> set[str]:
    """What ``git ls-files -z -- <paths>`` lists: the index entries the literal pathspecs ``paths`` match.
    A few paths go on the argv; more, and the whole index is listed and matched here (:func:`named`)."""
    paths = list(paths)
    if not paths:
        return set()
    if _fits(paths):
        return {p for p in git(repo, "ls-files", "-z", "--", *paths, extra_env=extra_env).split("\0") if p}
    want = set(paths)
    return {p for p in git(repo, "ls-files", "-z", extra_env=extra_env).split("\0") if p and named(p, want)}


# -- staging and resetting exact paths ------------------------------------------------------------------


def _real_dirs_above(repo: Path, path: str) -> bool:
    """Whether every directory above ``path`` in ``repo`` is a directory, not a link or a file."""
    parts = path.split("/")[:-1]
    at = repo
    for part in parts:
        at = at / part
        try:
            if not stat.S_ISDIR(os.lstat(at).st_mode):
                return False
        except OSError:
            return False
    return True


def stage_plan(repo: Path, paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(remove, add)``: which of ``paths`` leave the index (gone from the work tree, under what is now a
    link or a file, or a file that became a directory) and which are staged as they are (a file, a link,
    a repository inside the tree as its commit). Read from the work tree, nothing written."""
    remove: list[str] = []
    add: list[str] = []
    for p in sorted({p.rstrip("/") for p in paths if p.rstrip("/")}):
        full = repo / p
        try:
            mode = os.lstat(full).st_mode if _real_dirs_above(repo, p) else None
        except OSError:
            mode = None
        if mode is None:
            remove.append(p)
        elif stat.S_ISDIR(mode):
            (add if os.path.lexists(full / ".git") else remove).append(p)  # its files are paths of their own
        else:
            add.append(p)
    return remove, add


def stage(repo: Path, paths: Iterable[str], *, policy: GitPolicy = SAFE,
          extra_env: Mapping[str, str] | None = None) -> None:
    """Stage exactly ``paths`` as they are in the work tree now (``git add -A -- <paths>``; gone: removed),
    in time linear in their number. ``paths`` are what ``status`` names (files, links, ``sub/`` for a
    repository inside the tree), never a directory meaning all it holds. ``update-index`` runs the
    clean filters ``add`` would, pinned the same way (evolve/git/pins.py)."""
    remove, add = stage_plan(repo, paths)
    if remove:
        git(repo, "update-index", "--force-remove", "-z", "--stdin", policy=policy, extra_env=extra_env,
            input=nul(remove))
    if add:  # --replace: a file where a directory was (or the reverse) takes the old entries' place
        git(repo, "update-index", "--add", "--replace", "-z", "--stdin", policy=policy, extra_env=extra_env,
            input=nul(add))


def index_info(tree: Iterable[str], index: Iterable[str], want: set[str], zero: str) -> tuple[bytes, set[str]]:
    """``update-index -z --index-info`` records that give the paths ``want`` names their entries in a
    commit (``tree``: its ``ls-tree -r -z`` records, ``mode type name<TAB>path``) and drop those it lacks
    (``index``: ``ls-files -s -z`` records, ``mode name stage<TAB>path``), removals first; and the paths
    the commit has (pure). An entry already as the commit has it is left alone (its stat data too, so
    ``status`` need not read the file again). ``zero``: an object name as long as the repository's."""
    now: dict[str, tuple[str, str] | None] = {}
    for rec in index:
        meta, sep, path = rec.partition("\t")
        parts = meta.split()
        if sep and len(parts) == 3:
            # an unmerged path (stage 1-3) is never "as the commit has it"
            now[path] = (parts[0], parts[1]) if parts[2] == "0" and path not in now else None
    keep: list[str] = []
    have: set[str] = set()
    for rec in tree:
        meta, sep, path = rec.partition("\t")
        parts = meta.split()
        if not (sep and len(parts) == 3 and named(path, want)):
            continue
        have.add(path)
        if now.get(path) != (parts[0], parts[2]):
            keep.append(rec)
    gone = sorted(p for p in now if p not in have and named(p, want))
    return nul([*(f"0 {zero}\t{p}" for p in gone), *keep]), have


def reset_index(repo: Path, commit: str | None, paths: Iterable[str], *, policy: GitPolicy = SAFE,
                extra_env: Mapping[str, str] | None = None) -> set[str]:
    """The index entries of ``paths`` as ``commit`` has them, absent there: removed; the work tree is not
    touched (``git reset -q <commit> -- <paths>``; ``commit`` None, an unborn branch: ``git rm --cached``).
    Returns the paths ``commit`` has."""
    want = set(paths)
    if not want:
        return set()
    listing = git(repo, "ls-tree", "-r", "-z", "--full-tree", commit, extra_env=extra_env) if commit else ""
    tree = [r for r in listing.split("\0") if r]
    oid = (tree[0].split("\t", 1)[0].split()[2] if tree
           else git(repo, "hash-object", "--stdin", extra_env=extra_env, input=b"").strip())  # the empty blob's
    index = git(repo, "ls-files", "-s", "-z", policy=policy, extra_env=extra_env).split("\0")
    records, have = index_info(tree, index, want, "0" * len(oid))
    if records:
        git(repo, "update-index", "-z", "--index-info", policy=policy, extra_env=extra_env, input=records)
    return have


def checkout_index(repo: Path, paths: Iterable[str], *, policy: GitPolicy = SAFE,
                   extra_env: Mapping[str, str] | None = None) -> None:
    """Write ``paths`` from the index into the work tree, over what is there (``git checkout -- <paths>``)."""
    paths = list(paths)
    if paths:
        git(repo, "checkout-index", "-f", "-q", "-z", "--stdin", policy=policy, extra_env=extra_env,
            input=nul(paths))
