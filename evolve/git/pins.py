"""Which program-valued git keys evolve's own git pins, and to what (docs/DESIGN.md §8.1).

Pure: :mod:`evolve.git.run` asks git for the keys (``git config --show-scope -z --get-regexp``) and
hands the answer to :func:`pins_from_config`. The agent can write ``.git/config``: a ``filter.x.clean``
there (with a ``.gitattributes`` line) would run on ``git add``. Each such key the repository's own
config sets is pinned to the operator's value from the system or global config, or to git's default
program, or to empty, which git reads as "no program". (Git LFS set up globally still works.)

The exception is a key the operator approved (:mod:`evolve.git.trust`: ``evolve init`` records what
it finds, ``evolve doctor --trust-git-config`` approves what is there now): when every value the
repository's own config gives it is the approved one, it is not pinned, so git-crypt or
``git lfs install --local`` work in evolve's worktree and commits. A key that appears or changes
afterwards is pinned again until approved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_PROGRAM_KEYS = re.compile(
    r"^(filter\..+\.(clean|smudge|process)|merge\..+\.driver|diff\..+\.(textconv|command)"
    r"|gpg(\..+)?\.program|gpg\.ssh\.defaultkeycommand|core\.sshcommand|core\.editor|sequence\.editor"
    r"|core\.pager|core\.askpass|core\.hookspath|core\.fsmonitor)$"
)
# The keys an operator may approve: the programs that shape work-tree content (filters, diff and
# merge drivers), sign, or reach a remote. Editors, the pager and askpass are never needed by an
# unattended loop, hooks and fsmonitor have their own switches (``[git] run_hooks``): always pinned.
_TRUSTABLE = re.compile(
    r"^(filter\..+\.(clean|smudge|process)|merge\..+\.driver|diff\..+\.(textconv|command)"
    r"|gpg(\..+)?\.program|gpg\.ssh\.defaultkeycommand|core\.sshcommand)$"
)
# What a pinned key falls back to when the operator's config has no value: git's own default
# program (signing and ssh must still work); any other key pinned empty means "no program".
_PROGRAM_DEFAULTS = {"gpg.program": "gpg", "gpg.openpgp.program": "gpg", "gpg.x509.program": "gpgsm",
                     "gpg.ssh.program": "ssh-keygen", "core.sshcommand": "ssh", "core.pager": "cat",
                     "core.editor": "true", "sequence.editor": "true"}
_FIXED = ("core.hookspath", "core.fsmonitor")  # pinned already by run's fixed args
_OPERATOR = ("system", "global")
# Subcommands that may read or write work-tree content (filters, merge drivers), sign, or reach a remote.
# A file written into a work tree runs the smudge filter (``worktree add``, ``merge``, ``rebase``,
# ``read-tree -u``); comparing one with the index may run the clean filter (``diff``, ``rm``).
# Writing an index (``write-tree`` too) re-checks a racily clean entry against its file, through clean.
_CONTENT = frozenset({"add", "apply", "checkout", "checkout-index", "cherry-pick", "clean", "commit",
                      "commit-tree", "diff", "diff-files", "diff-index", "hash-object", "ls-files", "merge", "push",
                      "read-tree",
                      "rebase", "reset", "restore", "revert", "rm", "stash", "status", "update-index", "worktree",
                      "write-tree"})


PATTERN = _PROGRAM_KEYS.pattern

Trusted = Mapping[str, Sequence[str]]  # key -> the values the operator approved, in config order


def needed(verb: str) -> bool:
    """Whether a subcommand may run a program a key names (filters, drivers, signers, remotes)."""
    return verb in _CONTENT


def trustable(key: str) -> bool:
    """Whether an operator may approve ``key`` from the repository's own config (``key`` as git prints it)."""
    return _TRUSTABLE.match(key) is not None


def parse(listing: str) -> list[tuple[str, str, str]]:
    """``(scope, key, value)`` from ``git config --show-scope -z --get-regexp``'s ``scope NUL key LF value NUL ...``,
    in git's order (system, global, then the repository's own: the last one wins)."""
    out: list[tuple[str, str, str]] = []
    fields = listing.split("\0")
    for scope, rec in zip(fields[0::2], fields[1::2], strict=False):
        key, _, value = rec.partition("\n")
        if key:
            out.append((scope, key, value))
    return out


def local_values(listing: str) -> dict[str, list[str]]:
    """Each key the repository's own config sets (``local``, ``worktree``, anything git adds later: not the
    operator's to trust), with every value it gives, in order."""
    out: dict[str, list[str]] = {}
    for scope, key, value in parse(listing):
        if scope not in _OPERATOR:
            out.setdefault(key, []).append(value)
    return out


_FILTER_PROGRAM = re.compile(r"^(?P<driver>filter\..+)\.(clean|smudge|process)$")


def _filter_of(key: str) -> str | None:
    """``filter.<name>`` for a filter's program key, else None."""
    m = _FILTER_PROGRAM.match(key)
    return m["driver"] if m else None


def approved_keys(local: Mapping[str, Sequence[str]], trusted: Trusted | None) -> set[str]:
    """The repository's own keys that run (pure): approvable, with exactly the approved values. A filter
    runs whole or not at all: with one of its programs pinned, its others are too, or files checked out
    through smudge would be compared with the index without clean (every one of them "modified")."""
    if not trusted:
        return set()
    ok = {key for key, values in local.items()
          if trustable(key) and list(trusted.get(key, ())) == list(values)}
    broken = {_filter_of(key) for key in local if key not in ok} - {None}
    return {key for key in ok if _filter_of(key) not in broken}


def pinned(listing: str, trusted: Trusted | None = None) -> dict[str, str]:
    """The value each pinned key is given: the operator's (system/global), git's default program, or empty."""
    entries = parse(listing)
    operator = {key: value for scope, key, value in entries if scope in _OPERATOR}
    local = local_values(listing)
    runs = approved_keys(local, trusted)
    return {key: operator.get(key, _PROGRAM_DEFAULTS.get(key.lower(), "")) for key in local if key not in runs}


def pins_from_config(listing: str, trusted: Trusted | None = None) -> list[str]:
    """``-c`` arguments for the keys the repository's own config sets, from git's ``-z`` listing.

    ``listing`` is ``scope NUL key LF value NUL ...`` as ``git config --show-scope -z --get-regexp``
    prints it; ``trusted`` the operator's approved keys (:func:`evolve.git.trust.trusted_for`).
    """
    kept = [f"{key}={value}" for key, value in sorted(pinned(listing, trusted).items())
            if key.lower() not in _FIXED]
    return [arg for kv in kept for arg in ("-c", kv)]


def effective(listing: str, trusted: Trusted | None = None) -> dict[str, str]:
    """The value git uses for each listed key under evolve's pins: the pin, else the last value listed."""
    out = {key: value for _, key, value in parse(listing)}
    out.update(pinned(listing, trusted))
    return out
