"""``evolve init``: make a repository ready for the loop without touching anything it already has."""

from __future__ import annotations

import os
from pathlib import Path

from evolve.config_template import TEMPLATE
from evolve.paths import Paths
from evolve.store.dirfd import ensure_dir, open_file

GITIGNORE = "*\n"


def _create(path: Path, text: str) -> bool:
    """Create ``path`` unless something (a symlink included) is there already; never through a link
    (docs/DESIGN.md §2.0). 0o666 less the umask. False when it existed."""
    try:
        fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return True


def init_repo(paths: Paths) -> list[str]:
    out = []
    ensure_dir(paths.evolve_dir)
    agents = paths.repo / ".agents"
    gi = agents / ".gitignore"
    if agents in paths.evolve_dir.parents and _create(gi, GITIGNORE):
        out.append(f"wrote {gi} (.agents/ is local-only)")
    if _create(paths.config, TEMPLATE):
        out.append(f"wrote {paths.config}")
    else:
        out.append(f"kept  {paths.config} (already present)")
        from evolve.configtrust import repo_config

        owned = repo_config(paths)
        if owned is not None and not owned.trusted:  # docs/DESIGN.md §8.5: the repository's, not yet the operator's
            out.append("      it is tracked in git: the repository's; fires refuse it until you review it and run "
                       "`evolve trust`")
    out += _record_git_trust(paths)
    return out


def _record_git_trust(paths: Paths) -> list[str]:
    """evolve's first look at the repository's own git config: its program-valued keys (git-crypt, a
    local ``git lfs install``) are recorded as the operator's (docs/DESIGN.md §8.1). Once only: a key
    that appears later waits for ``evolve doctor --trust-git-config``."""
    from evolve.git import approve, trust
    from evolve.git.run import GitError

    try:
        trust.adopt_legacy(paths.git_trust, paths.git_trust_legacy)
        seen = approve.record_first(paths.repo, paths.git_trust, trust.roots_of(paths.repo, paths.evolve_dir),
                                  by="evolve init")
    except (GitError, OSError) as exc:
        return [f"could not read the repository's git config ({exc}); `evolve doctor --trust-git-config` later"]
    if seen is None:
        return [f"kept  {paths.git_trust} (already present; `evolve doctor --trust-git-config` changes it)"]
    out = [f"wrote {paths.git_trust}: evolve's git runs "
           + (", ".join(f"{k} = {' | '.join(v)}" for k, v in seen.trusted.items()) if seen.trusted
              else "no program from the repository's own git config")]
    out += [f"      not {k}: {why}" for k, why in seen.refused.items()]
    return out


def next_steps(paths: Paths) -> list[str]:
    """What to do after ``evolve init``, with this repository's paths."""
    repo = str(paths.repo)
    return [
        "",
        "next steps:",
        f"  1. edit {paths.config} ([agent] runner/argv, [gate] commands, [notify], [metrics])",
        "  2. evolve doctor                 # agent binary, tracker, state dir, config, schedule: OK/WARN/FAIL",
        "  3. evolve fire --dry-run         # what the next cycle would pick and the exact agent command",
        "  4. evolve fire --cycles 1        # one real cycle by hand",
        f"  5. evolve --repo {repo} install systemd --user   # or: install cron, or run `evolve daemon`",
        "  6. evolve status                 # in the morning; evolve report -o report.html for the night's story",
    ]
