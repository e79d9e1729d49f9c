"""Secrets planted in the environment never appear in anything evolve writes; planted symlinks are
never followed."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
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
    for args in (("history",), ("history", "--json"), ("metrics",), ("report", "-o", str(env.root / "report.html"))):
        r = cli(*args, extra_env=secret_env)
        outs += [r.stdout, r.stderr]
    outs.append((env.root / "report.html").read_text())
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


def _plant(tmp_path: Path, at: Path) -> Path:
    outside = tmp_path / f"outside-{at.name}"
    outside.write_text("do not touch\n")
    at.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, at)
    return outside


@pytest.mark.parametrize("name", ["cycle-1.log", "cycle-1.prompt.md"])
def test_symlinked_run_artifacts_are_replaced_never_written_through(env: Env, cli, tmp_path: Path,
                                                                    name: str) -> None:
    outside = _plant(tmp_path, env.paths.runs_dir / name)
    env.queue(entry("a"))
    env.steps([{"stdout": "agent output", "report": {"result": "improved", "summary": "ok"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert outside.read_text() == "do not touch\n"
    assert [e["result"] for e in env.ledger()] == ["unchanged"]  # the run itself went ahead
    log = env.paths.runs_dir / "cycle-1.log"
    assert not log.is_symlink() and "agent output" in log.read_text()


def test_a_symlinked_queue_is_read_but_never_written_through(env: Env, cli, tmp_path: Path) -> None:
    """Rewrites (the claim) replace a symlink at the queue's path with a file of their own; appends
    (follow-up work) refuse one (O_NOFOLLOW). The file it pointed to is never written."""
    real = tmp_path / "queue.jsonl"
    real.write_bytes(orjson.dumps(entry("a")) + b"\n")
    before = real.read_bytes()
    env.paths.nextwork.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(real, env.paths.nextwork)
    env.steps([{"report": {"result": "improved", "summary": "ok", "new_work": [{"title": "follow-up"}]}}])
    assert cli("fire", "--cycles", "1").code == 0
    assert real.read_bytes() == before
    assert not env.paths.nextwork.is_symlink()
    titles = [i["title"] for line in env.paths.nextwork.read_bytes().splitlines() for i in orjson.loads(line)["items"]]
    assert titles == ["a", "follow-up"]
    with pytest.raises(OSError):
        from evolve.store.jsonl import append_bytes

        os.unlink(env.paths.nextwork)
        os.symlink(real, env.paths.nextwork)
        append_bytes(env.paths.nextwork, b"{}\n")
    assert real.read_bytes() == before


def test_blocked_log_refuses_a_planted_symlink_and_the_fire_goes_on(env: Env, cli, tmp_path: Path) -> None:
    outside = _plant(tmp_path, env.paths.blocked)
    env.write_config(fire={"mode": "loop"})
    events = []
    for _ in range(4):  # empty passes until the loop would log itself blocked
        r = cli("fire", "--cycles", "1")
        assert r.code == 0, r.stderr
        events += r.names()
    assert "blocked.error" in events
    assert outside.read_text() == "do not touch\n"


def test_files_are_created_with_the_modes_they_need(env: Env, cli) -> None:
    """Shared state 0644 (jq one-liners, status readers, node_exporter); agent output 0600."""
    import stat as st

    env.queue(entry("a"))
    env.steps([{"stdout": "agent output", "report": {"result": "improved", "summary": "ok"}}])
    assert cli("fire", "--cycles", "1").code == 0
    modes = {p.name: st.S_IMODE(p.stat().st_mode) for p in (
        env.paths.ledger, env.paths.state, env.paths.runs_dir / "cycle-1.log")}
    assert modes == {"cycle-history.jsonl": 0o644, "session-state.json": 0o644, "cycle-1.log": 0o600}
