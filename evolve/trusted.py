"""Where the operator's trust records for a repository live: outside it and outside evolve's state directory.

The agent works inside the repository, and its worktree lives inside evolve's state directory
(``.agents/evolve/worktree``), so a record kept in either is one the agent could rewrite. The
operator's records are kept in a directory of their own per repository (docs/DESIGN.md §8.5)::

    $EVOLVE_TRUST_DIR                        (when set: the operator's choice, e.g. in a unit)
    $XDG_STATE_HOME/evolve/repos/<id>/       (else; ~/.local/state/evolve/repos/<id>/ by default)

``<id>`` is the main checkout's directory name (for the eye; made safe) and a hash of its git common
directory, so every work tree of one repository shares one record and two clones never do.

One file per owner, each read and written by one module:

- ``git-trust.json``: the approved program-valued keys of the repository's git config (:mod:`evolve.git.trust`);
- ``config-trust.json``: the hashes of a repository-tracked config and agent settings the operator trusted
  (``evolve trust``);
- ``checks-trust.json``: the gate scripts and GOALS checks a chain rewrote that the operator trusted
  (:mod:`evolve.git.checks`);
- ``pins.json``: the push remote's URL as first configured (:mod:`evolve.git.landing`);
- ``guard.json``: the loosening changes the guard refused (:mod:`evolve.cycle.guard`), which keep every
  fire from acting on them until the operator has looked.

Under a sandbox these directories are read-only to the agent and the gate. Without one the agent, as
the same user, can still write them, which is why the guard also hashes them around every agent and
gate run. Standard library only: ``evolve status`` and the session-start hook import :mod:`evolve.paths`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

GIT_TRUST = "git-trust.json"
CONFIG_TRUST = "config-trust.json"
CHECKS_TRUST = "checks-trust.json"
PINS = "pins.json"
GUARD = "guard.json"


def base(env: Mapping[str, str]) -> Path:
    """The root of every repository's records (``EVOLVE_TRUST_DIR`` wins, else XDG's state home)."""
    if env.get("EVOLVE_TRUST_DIR"):
        return Path(os.path.expanduser(env["EVOLVE_TRUST_DIR"])).resolve()  # the operator's links honoured, once
    home = Path(env.get("HOME") or Path.home())
    xdg = env.get("XDG_STATE_HOME") or str(home / ".local" / "state")
    return (Path(xdg) / "evolve" / "repos").resolve()


def repo_id(repo: Path) -> str:
    """``<name>-<hash of the git common dir>``: stable across the repository's work trees (pure but for realpath)."""
    real = os.path.realpath(_common_dir(repo))
    main = Path(real).parent if Path(real).name == ".git" else Path(real)  # the main checkout (or a bare repo)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", main.name)[:40].lstrip(".") or "repo"
    return f"{name}-{hashlib.sha256(real.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}"


def repo_dir(repo: Path, env: Mapping[str, str]) -> Path:
    """The operator's record directory for ``repo``: under ``EVOLVE_TRUST_DIR`` itself when that is set
    (a unit or a Kubernetes job names one directory per repository), else per repository under XDG's."""
    if env.get("EVOLVE_TRUST_DIR"):
        return base(env)
    return base(env) / repo_id(repo)


def _common_dir(repo: Path) -> Path:
    """The repository's git common dir found without git (a ``.git`` dir, or a worktree's ``.git`` file);
    the repository itself when there is none (not a git repository yet: ``evolve init`` comes first)."""
    here = Path(os.path.abspath(repo))
    dot = here / ".git"
    try:
        if dot.is_file():
            text = dot.read_text(encoding="utf-8", errors="replace").strip()
            if text.startswith("gitdir:"):
                gitdir = Path(os.path.normpath(here / text[len("gitdir:"):].strip()))
                link = gitdir / "commondir"
                if link.is_file():
                    gitdir = Path(os.path.normpath(gitdir / link.read_text(encoding="utf-8").strip()))
                return gitdir
        if dot.is_dir():
            return dot
    except OSError:
        pass
    return here
