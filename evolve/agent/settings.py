"""Which of the agent CLI's project settings reach its run (docs/DESIGN.md §8.5.1 *The repository's config
and agent settings*).

A ``.claude/settings.json`` the repository commits can add hooks (programs), ``env`` (``ANTHROPIC_BASE_URL``),
an ``apiKeyHelper`` or permissions to a run that holds the model credentials; so can ``.codex/config.toml`` and
the ``.env`` files Gemini reads. Such a file reaches the run only when the operator trusted its exact bytes
(``evolve trust``, the record of :mod:`evolve.configtrust`). A file that is the operator's own reaches it as
before: in their checkout and untracked (what ``evolve setup`` writes), or evolve's link to it in the worktree
(``.claude/settings.local.json``, :data:`evolve.git.worktree.SHARED`). What each pinned CLI loads was tried on it:

- Claude Code 2.1: ``--setting-sources`` names the sources kept (``user`` always; ``project``, ``local`` when
  their file is absent, the operator's or trusted); with ``project`` left out neither its hooks nor its ``env``
  apply, nor the MCP servers of a ``.mcp.json`` (which ``-p`` otherwise starts unasked, so it counts as the
  project source's file). The operator's own untracked ``.claude/settings.json`` reaches a run in the worktree
  with ``--settings`` (the worktree has no copy of it). Nothing is added when nothing is left out.
- Codex 0.171 reads ``.codex/config.toml`` only for a project its user config trusts
  (``[projects."<dir>"] trust_level = "trusted"`` in ``$CODEX_HOME/config.toml``, that directory exactly), and no
  flag overrides that; so a committed, untrusted one refuses the runner (exit 78 before any claim, one line)
  only where Codex would read it.
- Gemini 0.61 under ``--skip-trust`` (what the runner passes) leaves ``.gemini/settings.json`` out, but reads a
  ``.env`` and ``.gemini/.env`` in the project into its environment, and no flag stops that: a committed,
  untrusted one refuses the runner.

:func:`decide` is pure; :func:`for_tree` reads the files, git's index and the record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve import configtrust
from evolve.configtrust import AGENT, CLAUDE_FILES, CODEX_FILES, GEMINI_FILES, Owned
from evolve.paths import Paths

PROJECT, LOCAL, MCP = CLAUDE_FILES  # .claude/settings.json, .claude/settings.local.json, .mcp.json
FILES: dict[str, tuple[str, ...]] = {"claude": CLAUDE_FILES, "codex": CODEX_FILES, "gemini": GEMINI_FILES}


@dataclass(frozen=True)
class Found:
    """One settings file in the agent's tree, as the shell saw it."""

    rel: str
    sha256: str
    operators: bool  # the operator's own: untracked in their checkout, and that file itself (or evolve's link to it)
    tracked: bool  # git tracks it in the agent's tree (the repository's)


@dataclass(frozen=True)
class Settings:
    """What the agent's run gets of its CLI's project settings (pure data)."""

    runner: str
    sources: tuple[str, ...] = ()  # Claude: the setting sources passed, when any is left out
    extra: str = ""  # Claude: the operator's own project settings, passed with --settings
    untrusted: tuple[Owned, ...] = field(default_factory=tuple)
    refusal: str = ""  # Codex, Gemini: why the runner may not start
    skipped: tuple[str, ...] = ()  # committed files the CLI itself leaves out (Codex: the project is not trusted)

    def claude_args(self) -> list[str]:
        out = ["--setting-sources", ",".join(self.sources)] if self.sources else []
        return out + (["--settings", self.extra] if self.extra else [])

    def describe(self) -> str:
        """One line for ``fire --dry-run``, ``doctor`` and ``status``."""
        if self.runner not in FILES:
            return "none (the runner reads no project settings)"
        names = ", ".join(f.rel for f in self.untrusted)
        if self.runner == "claude":
            got = ", ".join(self.sources) if self.sources else "user, project, local"
            if self.extra:
                got += f", --settings {self.extra}"
            return got + (f" ({names} not trusted: left out; review, then `evolve trust`)" if names else "")
        if self.refusal:
            return self.refusal
        if self.runner == "gemini":
            return "user, the project's .env files (.gemini/settings.json is left out under --skip-trust)"
        if self.skipped:
            return f"user ({', '.join(self.skipped)}: the Codex CLI leaves it out, the project is not trusted there)"
        return "user, project"


def decide(runner: str, found: Mapping[str, Found], record: Mapping[str, Mapping[str, object]],
           operator_project: str = "", cli_skips: frozenset[str] = frozenset()) -> Settings:
    """The settings the run gets (pure). ``found``: the runner's files present in the agent's tree;
    ``operator_project``: the operator's own untracked ``.claude/settings.json`` when the tree is evolve's worktree;
    ``cli_skips``: files the CLI itself will not read there (Codex: the project is not trusted in its config)."""
    files = FILES.get(runner)
    if files is None:
        return Settings(runner)
    untrusted: list[Owned] = []
    skipped: list[str] = []
    for rel in files:
        f = found.get(rel)
        if f is None or f.operators:
            continue
        if runner != "claude" and not f.tracked:
            continue  # made in the worktree (an agent's .env): not the repository's, and no flag to tell apart
        if rel in cli_skips:
            skipped.append(rel)
            continue
        v = configtrust.verdict(rel, AGENT, f.sha256, record)
        if not v.trusted:
            untrusted.append(v)
    if runner == "claude":
        left = {u.rel for u in untrusted}
        project = PROJECT not in left and MCP not in left  # the CLI loads .mcp.json with the project source
        sources = ("user", *(["project"] if project else []), *(["local"] if LOCAL not in left else []))
        return Settings(runner, sources=sources if left else (), extra=operator_project, untrusted=tuple(untrusted))
    refusal = ""
    if untrusted:
        names = ", ".join(u.rel for u in untrusted)
        refusal = (f"runner {runner}: the repository's {names} (tracked in git) is not trusted and the {runner} CLI "
                   "has no flag to leave it out: review it, then `evolve trust`")
    return Settings(runner, untrusted=tuple(untrusted), refusal=refusal, skipped=tuple(skipped))


def for_tree(paths: Paths, runner: str, tree: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """:func:`decide` for the agent's tree (default: the operator's checkout, as ``doctor`` and ``status`` see it);
    ``env``: the agent's (where its CLI's user config is)."""
    files = FILES.get(runner)
    if files is None:
        return Settings(runner)
    repo = paths.repo
    tree = repo if tree is None else tree
    in_tree = tree.resolve() == repo.resolve()
    want = list(files) + ([PROJECT] if runner == "claude" and not in_tree else [])
    present = [rel for rel in dict.fromkeys(want) if os.path.isfile(tree / rel) or os.path.isfile(repo / rel)]
    if not present:
        return Settings(runner)
    ours = configtrust.tracked(repo, present)  # tracked in the operator's checkout: the repository's
    made = in_tree or os.path.isdir(tree)  # else a dry run before the worktree exists: it will hold what git tracks
    here = [r for r in present if os.path.isfile(tree / r)]
    theirs = ours if in_tree or not made else configtrust.tracked(tree, here)
    found: dict[str, Found] = {}
    for rel in files:
        path = tree / rel if made else repo / rel
        if not made and rel not in ours:
            continue
        sha = configtrust.sha256_of(path) if os.path.isfile(path) else None
        if sha is None:
            continue
        own = rel not in ours and (in_tree or _links_to(path, repo / rel))
        found[rel] = Found(rel, sha, operators=own, tracked=rel in theirs or rel in ours)
    operator_project = ""
    if runner == "claude" and not in_tree and os.path.isfile(repo / PROJECT) and PROJECT not in ours:
        operator_project = str(repo / PROJECT)  # what `evolve setup` wrote: the worktree has no copy of it
    skips = frozenset()
    if runner == "codex" and CODEX_FILES[0] in found and not codex_trusts(tree, os.environ if env is None else env):
        skips = frozenset(CODEX_FILES)
    return decide(runner, found, configtrust.read_record(paths.config_trust), operator_project, skips)


def agent_tree(paths: Paths, cfg: Any) -> Path:
    """Where the agent runs (docs/DESIGN.md §8.3): evolve's worktree (``[git] worktree_dir`` or the state
    directory's ``worktree``), or the operator's checkout with ``isolation = "none"``."""
    if cfg.git.isolation != "worktree":
        return paths.repo
    tree = Path(cfg.git.worktree_dir).expanduser() if cfg.git.worktree_dir else paths.evolve_dir / "worktree"
    return tree if tree.is_absolute() else paths.repo / tree


def for_config(paths: Paths, cfg: Any, env: Mapping[str, str] | None = None) -> Settings:
    """:func:`for_tree` for where ``cfg`` runs the agent (``doctor``, ``status``, the fire's preflight)."""
    return for_tree(paths, cfg.agent.runner, agent_tree(paths, cfg), env)


def codex_trusts(tree: Path, env: Mapping[str, str]) -> bool:
    """The Codex CLI's user config trusts ``tree`` (so it reads the project's ``.codex/config.toml``). A config it
    cannot read: assumed to (an unknown is not a reason to run the repository's settings)."""
    import tomllib

    from evolve.agent.preflight import codex_home

    path = codex_home(env) / "config.toml"
    try:
        with open(path, "rb") as fh:
            projects = tomllib.load(fh).get("projects", {})
    except FileNotFoundError:
        return False
    except (OSError, tomllib.TOMLDecodeError):
        return True
    if not isinstance(projects, dict):
        return True
    dirs = {str(tree), os.path.abspath(tree), os.path.realpath(tree)}
    return any(isinstance(v, dict) and v.get("trust_level") == "trusted" for k, v in projects.items() if k in dirs)


def _links_to(path: Path, target: Path) -> bool:
    """``path`` is a link to ``target`` (evolve's link of the operator's file into the worktree)."""
    try:
        return os.path.islink(path) and os.path.realpath(path) == os.path.realpath(target)
    except OSError:
        return False
