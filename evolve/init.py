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
