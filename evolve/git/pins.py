"""Which program-valued git keys evolve's own git pins, and to what (docs/DESIGN.md §8.1).

Pure: :mod:`evolve.git.run` asks git for the keys (``git config --show-scope -z --get-regexp``) and
hands the answer to :func:`pins_from_config`. The agent can write ``.git/config``: a ``filter.x.clean``
there (with a ``.gitattributes`` line) would run on ``git add``. Each such key the repository's own
config sets is pinned to the operator's value from the system or global config, or to git's default
program, or to empty, which git reads as "no program". (Git LFS set up globally still works.)
"""

from __future__ import annotations

import re

_PROGRAM_KEYS = re.compile(
    r"^(filter\..+\.(clean|smudge|process)|merge\..+\.driver|diff\..+\.(textconv|command)"
    r"|gpg(\..+)?\.program|gpg\.ssh\.defaultkeycommand|core\.sshcommand|core\.editor|sequence\.editor"
    r"|core\.pager|core\.askpass|core\.hookspath|core\.fsmonitor)$"
)
# What a pinned key falls back to when the operator's config has no value: git's own default
# program (signing and ssh must still work); any other key pinned empty means "no program".
_PROGRAM_DEFAULTS = {"gpg.program": "gpg", "gpg.openpgp.program": "gpg", "gpg.x509.program": "gpgsm",
                     "gpg.ssh.program": "ssh-keygen", "core.sshcommand": "ssh", "core.pager": "cat",
                     "core.editor": "true", "sequence.editor": "true"}
# Subcommands that may read or write work-tree content (filters, merge drivers), sign, or reach a remote.
# A file written into a work tree runs the smudge filter (``worktree add``, ``merge``, ``rebase``,
# ``read-tree -u``); comparing one with the index may run the clean filter (``diff``, ``rm``).
_CONTENT = frozenset({"add", "apply", "checkout", "checkout-index", "cherry-pick", "clean", "commit",
                      "commit-tree", "diff", "diff-files", "diff-index", "ls-files", "merge", "push", "read-tree",
                      "rebase", "reset", "restore", "revert", "rm", "stash", "status", "update-index", "worktree"})


PATTERN = _PROGRAM_KEYS.pattern


def needed(verb: str) -> bool:
    """Whether a subcommand may run a program a key names (filters, drivers, signers, remotes)."""
    return verb in _CONTENT


def pins_from_config(listing: str) -> list[str]:
    """``-c`` arguments for the keys the repository's own config sets, from git's ``-z`` listing.

    ``listing`` is ``scope NUL key LF value NUL ...`` as ``git config --show-scope -z --get-regexp``
    prints it.
    """
    operator: dict[str, str] = {}
    local: set[str] = set()
    fields = listing.split("\0")
    for scope, rec in zip(fields[0::2], fields[1::2], strict=False):
        key, _, value = rec.partition("\n")
        if not key:
            continue
        if scope in ("system", "global"):
            operator[key] = value
        else:  # local, worktree, and anything git adds later: not the operator's to trust
            local.add(key)
    kept = [f"{key}={operator.get(key, _PROGRAM_DEFAULTS.get(key.lower(), ''))}" for key in sorted(local)
            if key.lower() not in ("core.hookspath", "core.fsmonitor")]  # pinned already by run's fixed args
    return [arg for kv in kept for arg in ("-c", kv)]
