"""Shared fixtures: real git repositories in temp dirs, the scripted agent, and fire runners.

Every fire runs either in-process (``fire_inproc``) or as a real ``python -m evolve`` subprocess
(``fire_cli``); the agent is always a real program started by the command runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from evolve import config as configmod
from evolve.cycle.fire import Fire, FireOptions, FireOutcome
from evolve.paths import Paths

GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@localhost",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@localhost",
}


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                         env={**os.environ, **GIT_ENV})
    return out.stdout


def jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            out.append(orjson.loads(line))
    # Without the queue's tombstones: what a line that outgrew its place on an in-place edit leaves
    # behind, its content moved to the end (evolve/store/inplace.py).
    return [e for e in out if not (isinstance(e, dict) and e.get("superseded") is True)]


def live(path: Path) -> list[dict[str, Any]]:
    """The queue's entries as readers see them: without blank lines and the tombstones a line that
    outgrew its place leaves behind (evolve/store/inplace.py; its content moved to the end), and
    without unparsable lines."""
    out = []
    for line in path.read_bytes().splitlines():
        try:
            e = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # blank, or a line the operator's tools left unparsable
        if isinstance(e, dict) and e.get("superseded") is not True:
            out.append(e)
    return out


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str | int | float | list):
        return orjson.dumps(v).decode()
    raise TypeError(v)


@dataclass
class Env:
    """A throwaway repository wired to the scripted agent."""

    root: Path
    repo: Path
    xdg: Path
    script: Path
    config: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def paths(self) -> Paths:
        return Paths.for_repo(self.repo, env=self.env())

    @property
    def tree(self) -> Path:
        """Where the agent works: evolve's own worktree (``[git] isolation = "worktree"``, the default)."""
        if self.config.get("git", {}).get("isolation") == "none":
            return self.repo
        return self.paths.evolve_dir / "worktree"

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")}
        base.update(XDG_CONFIG_HOME=str(self.xdg), XDG_STATE_HOME=str(self.xdg.parent / "xdg-state"), **GIT_ENV)
        base.update(extra)
        return base

    def steps(self, steps: list[dict[str, Any]], *, loop: bool = False) -> None:
        """Set the scripted agent's steps (and restart its position); ``loop``: start again after the last."""
        self.script.write_bytes(orjson.dumps({"steps": steps, "loop": loop}))
        self.script.with_name(self.script.name + ".pos").unlink(missing_ok=True)

    def calls(self) -> list[dict[str, Any]]:
        p = self.script.with_name(self.script.name + ".calls.jsonl")
        return jsonl(p) if p.exists() else []

    def write_config(self, **sections: dict[str, Any]) -> None:
        for name, table in sections.items():
            self.config.setdefault(name, {}).update(table)
        lines = []
        for name, table in self.config.items():
            lines.append(f"[{name}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items())
            lines.append("")
        self.paths.config.parent.mkdir(parents=True, exist_ok=True)
        self.paths.config.write_text("\n".join(lines), encoding="utf-8")

    def queue(self, *entries: dict[str, Any]) -> None:
        p = self.paths.nextwork
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "ab") as fh:
            for e in entries:
                fh.write(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE))

    def ledger(self) -> list[dict[str, Any]]:
        p = self.paths.ledger
        return jsonl(p) if p.exists() else []

    def state(self) -> dict[str, Any]:
        return orjson.loads(self.paths.state.read_bytes())

    def cfg(self, env: dict[str, str] | None = None) -> configmod.Config:
        return configmod.load(self.paths.config, env if env is not None else self.env())


def entry(*titles: str, epic: str = "e1", **item_fields: Any) -> dict[str, Any]:
    """A v1.4 queue entry with one item per title."""
    return {
        "source_epic": epic,
        "timestamp": "2026-11-01T00:00:00Z",
        "consumed": False,
        "claim_status": "available",
        "items": [
            {"title": t, "description": f"do {t}", "type": "task", "severity": "medium", "source": "council-finding",
             **item_fields}
            for t in titles
        ],
    }


def improved_step(path: str = "src/out.txt", content: str = "cycle {cycle}\n", **report: Any) -> dict[str, Any]:
    return {"write": [{"path": path, "content": content, "append": True}],
            "report": {"result": "improved", "summary": "did it", **report}}


def heavy_step(kind: str = "scout") -> dict[str, Any]:
    disp = "context-too-heavy" if kind == "scout" else "context-budget-defer"
    return {"report": {"result": kind, "disposition": disp, "summary": "too heavy"}}


@pytest.fixture
def env(tmp_path: Path) -> Env:
    root = tmp_path
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("# test repo\n", encoding="utf-8")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "initial")
    (repo / ".agents").mkdir()
    (repo / ".agents" / ".gitignore").write_text("*\n", encoding="utf-8")
    script = root / "agent.json"
    e = Env(root=root, repo=repo, xdg=root / "xdg", script=script)
    e.steps([improved_step()])
    e.write_config(
        agent={"runner": "command", "argv": [sys.executable, "-m", "evolve.agent.scripted", "--script", str(script)],
               # The agent's env is allow-listed: PYTHONPATH makes it import this tree's evolve.
               "timeout_s": 60, "idle_timeout_s": 30, "pass_env": ["PYTHONPATH"]},
        fire={"max_cycles": 5},
    )
    return e


@pytest.fixture
def fire_inproc(env: Env) -> Callable[..., FireOutcome]:
    """Run one fire in this process (structlog output goes to a file under the temp dir)."""
    from evolve import log

    log_path = env.root / "inproc-log.jsonl"

    def run(cycles: int | None = None, dry_run: bool = False, extra_env: dict[str, str] | None = None,
            **kw: Any) -> FireOutcome:
        e = env.env(**(extra_env or {}))
        with open(log_path, "ab") as fh:
            log.configure(json=True, stream=fh)
            return Fire(env.paths, env.cfg(e), FireOptions(cycles=cycles, dry_run=dry_run, **kw), env=e).run()

    return run


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def events(self) -> list[dict[str, Any]]:
        out = []
        # Logs go to stderr (stdout carries only a command's answer); both are read, answer lines skip.
        for line in (self.stderr + "\n" + self.stdout).splitlines():
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "event" in obj:
                out.append(obj)
        return out

    def error_lines(self) -> list[str]:
        """What stderr says besides the JSON log lines (evolve's own one-line error, a traceback)."""
        return [ln for ln in self.stderr.strip().splitlines() if not ln.startswith("{")]

    def names(self) -> list[str]:
        return [e["event"] for e in self.events()]


@pytest.fixture
def cli(env: Env) -> Callable[..., CliResult]:
    """Run ``python -m evolve --repo <repo> ARGS`` as a real subprocess."""

    def run(*args: str, extra_env: dict[str, str] | None = None, timeout: float = 120,
            repo: Path | None = None) -> CliResult:
        proc = subprocess.run(
            [sys.executable, "-m", "evolve", "--repo", str(repo or env.repo), *args],
            capture_output=True, text=True, env=env.env(**(extra_env or {})), timeout=timeout,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


def results(entries: Iterable[dict[str, Any]]) -> list[str]:
    return [e["result"] for e in entries]
