"""Secrets planted in the environment never appear in anything evolve writes; planted symlinks are
never followed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
import pytest
from support import Env, entry, git

KEY = "sk-ant-PLANTEDsecretVALUE0123456789"
TOKEN = "tok-PLANTED-ghost-token-42"
PEM_BODY = "MIIEpAIBAAKCAQEAplantedPEMbodyLINE0123456789"
# Every shape issue 13 names, planted by name (env) and by value (agent output, queue titles).
SECRET_ENV = {
    "ANTHROPIC_API_KEY": KEY,
    "SERVICE_TOKEN": TOKEN,
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIplantedAWSsecretKEY0123456",
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDAWS012345",
    "DATABASE_URL": "postgres://app:Pl4ntedDbPassw0rd@db.internal:5432/app",
    "OPENAI_KEY": "sk-PLANTEDopenaiKey0123456789abcdef",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0PLANT/B0PLANT/PlantedSlackHook0123",
    "DISCORD_HOOK": "https://discord.com/api/webhooks/123456789012345678/PlantedDiscordHook_abc-XYZ",
    "GH_PAT": "github_pat_PLANTEDgithubPat0123456789",
    "SLACK_BOT": "xoxb-PLANTED-slack-bot-0123456789",
    "SESSION_JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.PlantedJwtSignature0123",
    "DB_PASSWD": "plantedPasswdValue77",
    "SENTRY_DSN": "plantedSentryDsnValue99",
    "MY_PRIVATE_THING": "plantedPrivateValue55",
    "NPM_AUTH": "plantedNpmAuthValue33",
}
GHP = "ghp_PLANTEDgithubTokenInATitle0123456789"
GHO = "gho_PLANTEDoauthTokenInAnOutput01234567"
BEARER = "PLANTEDbearerTokenValue0123"
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\nAAAAplantedSecondLine\n-----END RSA PRIVATE KEY-----"
# What must never appear: the values (for URLs: their passwords and webhook secrets) and the
# distinctive parts of the value-shaped secrets.
NEEDLES = [v for k, v in SECRET_ENV.items() if k != "DATABASE_URL"] + [
    "Pl4ntedDbPassw0rd", "PlantedSlackHook0123", "PlantedDiscordHook_abc-XYZ", GHP, GHO, BEARER, PEM_BODY,
    "AAAAplantedSecondLine", "PLANTEDgithubTokenInATitle", "PLANTEDgithubtokeninatitle",
]


def _leak(tag: str) -> str:
    return " ".join([tag, *SECRET_ENV.values(), GHP, GHO, f"Authorization: Bearer {BEARER}", f"Bearer {BEARER}"])


def _hits(where: str, data: bytes | str) -> list[tuple[str, str]]:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return [(where, n) for n in NEEDLES if n in text or n.lower() in text.lower()]


def _everything_evolve_wrote(env: Env, *outputs: str) -> list[tuple[str, str]]:
    found = []
    for p in env.repo.joinpath(".agents").rglob("*"):
        found += _hits(f"name {p}", p.name)
        # The queue is checked on its own (see the test); the agent's copy of it in its worktree is the
        # operator's lines as they were (cycle/door.py gives the agent the queue to read), checked there too.
        if p.is_file() and p not in (env.paths.nextwork, env.tree / ".agents" / "rpi" / "next-work.jsonl"):
            found += _hits(str(p), p.read_bytes())
    for i, out in enumerate(outputs):
        found += _hits(f"output {i}", out)
    return found


def test_planted_secrets_never_reach_any_output(env: Env, cli) -> None:
    """Issue 13: every shape, planted by name and by value, through every sink: nothing leaks."""
    notified = env.root / "notified.json"
    env.write_config(context={"streak_limit": 1}, notify={"command": [
        sys.executable, "-c", f"import sys; open({str(notified)!r}, 'ab').write(sys.stdin.buffer.read())"]})
    env.queue(entry(f"fix the {GHP} leak", f"rotate {SECRET_ENV['SLACK_WEBHOOK_URL']}", "c", "d"))
    operator_lines = env.paths.nextwork.read_bytes().count(b"\n")
    env.steps([
        {"stdout": _leak("agent says") + "\n" + PEM, "write": [{"path": "x.txt", "content": "x\n"}],
         "report": {"result": "improved", "summary": _leak("done"), "disposition": _leak("disp"),
                    "percepts": [_leak("percept")], "new_work": [{"title": _leak("follow-up"),
                                                                  "description": _leak("why")}]}},
        {"stdout": "failing with " + _leak("out") + "\n" + PEM, "exit": 3},
        {"report": {"result": "failed", "error_class": "transient", "error": _leak("err"), "summary": _leak("s")}},
        {"report": {"result": "scout", "disposition": "context-too-heavy", "summary": _leak("heavy")}},
    ])
    outs = []
    for _ in range(4):
        r = cli("fire", "--cycles", "1", extra_env=SECRET_ENV)
        outs += [r.stdout, r.stderr]
    commands = [("handoff", "continue", "--note", _leak("note")), ("fire", "--dry-run"), ("status",),
                ("status", "--json"), ("doctor",), ("doctor", "--json"), ("history",), ("history", "--json"),
                ("metrics",),
                ("metrics", "--textfile", str(env.repo / ".agents" / "prom")),
                ("report", "-o", str(env.repo / ".agents" / "report.html"))]
    for args in commands:
        r = cli(*args, extra_env=SECRET_ENV)
        outs += [r.stdout, r.stderr]
    # The agent itself did receive its environment (it needs its credentials).
    assert env.calls()[0]["env"].get("EVOLVE_CYCLE") == "1"
    assert len(env.ledger()) >= 4
    assert list(env.paths.handoffs_dir.glob("continue-*.md")), "the hand-off artifact was written"
    assert notified.exists() and b"handoff.written" in notified.read_bytes()
    git_log = git(env.repo, "log", "-p", "--all")
    assert "evolve: cycle 1" in git_log
    assert _everything_evolve_wrote(env, *outs, git_log, notified.read_text()) == []
    # The queue: the operator's own lines are theirs; what evolve appended (follow-ups) is clean.
    # (An operator's line that outgrew its place on a claim moved to the end: still the operator's.)
    own = entry("x")["source_epic"]
    appended = b"\n".join(x for x in env.paths.nextwork.read_bytes().splitlines()[operator_lines:]
                           if orjson.loads(x).get("source_epic") != own)
    assert b"follow-up" in appended and _hits("queue", appended) == []
    given = env.tree / ".agents" / "rpi" / "next-work.jsonl"
    given_evolves = [x for x in given.read_bytes().splitlines() if orjson.loads(x).get("source_epic") != own]
    assert given.is_file() and _hits("queue given to the agent", b"\n".join(given_evolves)) == []
    assert "***" in (env.paths.runs_dir / "cycle-1.log").read_text()
    # The prompts the agent got (and would send to its model provider) carried no secret either.
    prompts = [orjson.dumps(c).decode() for c in env.calls()]
    assert "fix the *** leak" in prompts[0] and _hits("prompts", "".join(prompts)) == []


def test_symlinked_ledger_is_refused_not_followed(env: Env, cli, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("do not touch\n")
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, env.paths.ledger)
    env.queue(entry("a"))
    r = cli("fire", "--cycles", "1")
    assert r.code != 0
    assert len(r.error_lines()) == 1
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
