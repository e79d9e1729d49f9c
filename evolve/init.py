"""``evolve init``: make a repository ready for the loop without touching anything it already has."""

from __future__ import annotations

from evolve.config_template import TEMPLATE
from evolve.paths import Paths

GITIGNORE = "*\n"


def init_repo(paths: Paths) -> list[str]:
    out = []
    paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    agents = paths.repo / ".agents"
    gi = agents / ".gitignore"
    if agents in paths.evolve_dir.parents and not gi.exists():
        gi.write_text(GITIGNORE, encoding="utf-8")
        out.append(f"wrote {gi} (.agents/ is local-only)")
    if paths.config.exists():
        out.append(f"kept  {paths.config} (already present)")
    else:
        paths.config.write_text(TEMPLATE, encoding="utf-8")
        out.append(f"wrote {paths.config}")
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
