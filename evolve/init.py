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
