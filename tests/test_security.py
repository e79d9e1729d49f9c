"""Secrets planted in the environment never appear in anything evolve writes; planted symlinks are
never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import Env, entry

KEY = "sk-ant-PLANTEDsecretVALUE0123456789"
TOKEN = "tok-PLANTED-ghost-token-42"


def _everything_evolve_wrote(env: Env, *outputs: str) -> list[tuple[str, str]]:
    found = []
    for p in env.repo.joinpath(".agents").rglob("*"):
        if p.is_file():
            text = p.read_bytes().decode(errors="replace")
            for secret in (KEY, TOKEN):
                if secret in text:
                    found.append((str(p), secret))
    for i, out in enumerate(outputs):
        for secret in (KEY, TOKEN):
            if secret in out:
                found.append((f"output {i}", secret))
    return found


def test_planted_secrets_never_reach_logs_ledger_state_or_run_logs(env: Env, cli) -> None:
    env.queue(entry("a", "b", "c"))
    leak = f"key={KEY} token={TOKEN}"
    env.steps([
        {"stdout": f"agent says {leak}", "write": [{"path": "x.txt", "content": "x\n"}],
         "report": {"result": "improved", "summary": f"done {leak}", "disposition": leak}},
        {"stdout": f"failing with {leak}", "exit": 3},
        {"report": {"result": "failed", "error_class": "transient", "error": leak, "summary": leak}},
    ])
    secret_env = {"ANTHROPIC_API_KEY": KEY, "SERVICE_TOKEN": TOKEN}
    outs = []
    for _ in range(3):
        r = cli("fire", "--cycles", "1", extra_env=secret_env)
        outs += [r.stdout, r.stderr]
    r = cli("fire", "--dry-run", extra_env=secret_env)
    outs += [r.stdout, r.stderr]
    r = cli("status", "--json", extra_env=secret_env)
    outs += [r.stdout, r.stderr]
    # The agent itself did receive its environment (it needs its credentials).
    assert env.calls()[0]["env"].get("EVOLVE_CYCLE") == "1"
    assert len(env.ledger()) == 3
    assert _everything_evolve_wrote(env, *outs) == []
    assert "***" in (env.paths.runs_dir / "cycle-1.log").read_text()


def test_symlinked_ledger_is_refused_not_followed(env: Env, cli, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("do not touch\n")
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, env.paths.ledger)
    env.queue(entry("a"))
    r = cli("fire", "--cycles", "1")
    assert r.code != 0
    assert len(r.stderr.strip().splitlines()) == 1
    assert outside.read_text() == "do not touch\n"


@pytest.mark.parametrize("name", ["session-state.json", "HANDOFF", "cycle-state.json"])
def test_symlinked_state_files_are_replaced_never_written_through(env: Env, cli, tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("do not touch\n")
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, env.paths.evolve_dir / name)
    env.write_config(context={"streak_limit": 1})
    env.queue(entry("a", "b"))
    env.steps([{"report": {"result": "scout", "disposition": "context-too-heavy"}}])
    cli("fire", "--cycles", "1")
    assert outside.read_text() == "do not touch\n"
    target = env.paths.evolve_dir / name
    assert not target.is_symlink()
