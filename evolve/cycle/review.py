"""What else waits for the operator's word, besides the repository's config (``evolve trust``; DESIGN.md §8.5).

- changes the guard refused that are still as they were left (``guard.json``);
- chains waiting pending because they rewrite a script a ``[gate]`` command names or a GOALS check
  (the blobs, for ``checks-trust.json``);
- a push remote that now points elsewhere than where evolve first pushed (``pins.json``).

:func:`waiting` reads; :func:`accept` records the operator's word for all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evolve.config import Config
from evolve.cycle import guard
from evolve.cycle import pending as pend
from evolve.cycle.checks import goal_checks
from evolve.cycle.publish import pin, pin_digest, push_urls, url_digest
from evolve.git import checks as gitchecks
from evolve.git.run import GitError
from evolve.paths import Paths


@dataclass
class Waiting:
    guarded: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)  # path -> blob, over every waiting chain
    remote: tuple[str, list[str]] | None = None  # (remote, where it pushes now) when that is not the pin

    @property
    def empty(self) -> bool:
        return not self.guarded and not self.checks and self.remote is None

    def lines(self) -> list[str]:
        out = [f"refused change: {e.get('label')} {e.get('how')} during cycle {e.get('cycle')}'s {e.get('phase')}"
               " (what is there now becomes yours)" for e in self.guarded]
        out += [f"rewritten check: {p} (blob {b[:12] or 'deleted'}) in a chain waiting to land" for p, b in
                sorted(self.checks.items())]
        if self.remote is not None:
            out.append(f"push remote: {self.remote[0]} now pushes to {', '.join(self.remote[1])} (pinned again)")
        return out


def waiting(paths: Paths, cfg: Config) -> Waiting:
    w = Waiting(guarded=guard.outstanding(paths))
    checks = gitchecks.Checks(gitchecks.named_paths(cfg.gate.commands), gitchecks.load_trusted(paths.checks_trust),
                              goal_checks=goal_checks)
    for chain in pend.load(paths.pending).values():
        if chain.fate:
            continue
        try:
            w.checks.update(gitchecks.untrusted(paths.repo, chain.base, chain.new, checks))
        except GitError:
            continue
    if cfg.git.push:
        urls = push_urls(paths.repo, cfg.land.remote)
        pinned = pin_digest(paths.pins, cfg.land.remote)
        if pinned is not None and pinned != url_digest(urls):
            w.remote = (cfg.land.remote, urls)
    return w


def accept(paths: Paths, w: Waiting, by: str) -> None:
    if w.guarded:
        guard.accept(paths)
    if w.checks:
        gitchecks.trust(paths.checks_trust, w.checks, by)
    if w.remote is not None:
        pin(paths.pins, w.remote[0], w.remote[1])
