"""Lists of paths for git, never on its argv (docs/DESIGN.md §8.1, "Path lists").

A change may name more paths than an argv holds: the kernel's ``ARG_MAX`` (2 MB on Linux, less
elsewhere) is passed by 20,000 generated files of long names, and the ``exec`` fails with ``E2BIG``
before git runs. So a list of paths of unbounded length goes on git's stdin, in git's own NUL-separated
forms (:data:`FROM_STDIN` for ``add``, ``commit``, ``reset``, ``checkout``, ``rm``; ``checkout-index
--stdin -z``; ``check-attr --stdin -z``), or C-quoted one a line where git has no ``-z`` (``hash-object
--stdin-paths``: :func:`quoted`). Where git has no stdin form at all (``ls-files``) the argv is cut
into chunks well under the limit (:func:`chunks`, :func:`ls_files`).

Paths are the bytes git and the file system have: encoded UTF-8 with ``surrogateescape``, the inverse
of how :func:`evolve.git.run.run_git` decodes git's output, so a name that is not UTF-8 (or holds a
newline) reaches git as it is. Entries read by ``--pathspec-from-file`` are pathspecs, literal under
the ``GIT_LITERAL_PATHSPECS=1`` evolve's git always has (a file named ``*`` is that file).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from evolve.git.run import git

FROM_STDIN: tuple[str, ...] = ("--pathspec-from-file=-", "--pathspec-file-nul")
# Bytes of paths per argv where git has no stdin form: far under ARG_MAX (2 MB on Linux, 256 KB on
# some BSDs), which the environment and evolve's own ``-c`` pins share.
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


def chunks(paths: Iterable[str], budget: int = ARGV_BUDGET) -> Iterator[list[str]]:
    """``paths`` in runs whose argv bytes stay under ``budget`` (one path longer than it is a run alone)."""
    run: list[str] = []
    size = 0
    for p in paths:
        n = len(encode(p)) + 1 + 8  # the string, its NUL and its pointer in argv
        if run and size + n > budget:
            yield run
            run, size = [], 0
        run.append(p)
        size += n
    if run:
        yield run


def ls_files(repo: Path, paths: Iterable[str], *, extra_env: Mapping[str, str] | None = None) -> set[str]:
    """What ``git ls-files -z -- <paths>`` lists (index entries matching the literal pathspecs), in as
    many argvs as it takes: ``ls-files`` has no stdin form."""
    found: set[str] = set()
    for run in chunks(paths):
        found.update(p for p in git(repo, "ls-files", "-z", "--", *run, extra_env=extra_env).split("\0") if p)
    return found
