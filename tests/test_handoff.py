"""`evolve handoff continue` and `evolve handoff fork` (docs/DESIGN.md §7; reference notes §5.9).

Artifacts are real files written by the real CLI; the next cycles run real fires with the scripted
agent, and the fork case once more with the real Claude Code CLI against the scripted server.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry

from evolve.harness import handoff

SECRETS = {
    "anthropic": "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "github": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "google": "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer-value": "abc.def.ghi-very-secret-bearer",
    "basic-auth": "hunter2hunter2",
    "password": "correct-horse-battery",
    "env-value": "value-of-my-service-token-42",
    "private-key-body": "MIIEowIBAAKCAQEAuSECRETKEYMATERIAL",
}
NOTE = (
    f"curl -H 'Authorization: Bearer {SECRETS['bearer-value']}' https://user:{SECRETS['basic-auth']}@example.com; "
    f"keys {SECRETS['anthropic']} {SECRETS['github']} {SECRETS['aws']} {SECRETS['google']} jwt {SECRETS['jwt']} "
    f"password={SECRETS['password']} token {SECRETS['env-value']} "
    f"-----BEGIN RSA PRIVATE KEY----- {SECRETS['private-key-body']} -----END RSA PRIVATE KEY----- "
    "keep this: the parser needs a lookahead"
)


def handoffs_dir(env: Env) -> Path:
    return env.paths.handoffs_dir


def artifacts(env: Env, prefix: str) -> list[Path]:
    d = handoffs_dir(env)
    return sorted(p for p in d.glob(f"{prefix}-*.md")) if d.exists() else []


def pending(env: Env) -> dict[str, Any] | None:
    p = handoffs_dir(env) / "pending.json"
    return orjson.loads(p.read_bytes()) if p.exists() else None


def test_redaction_covers_keys_tokens_headers_and_private_keys() -> None:
    text = handoff.redact_text(NOTE, {"MY_SERVICE_TOKEN": SECRETS["env-value"]})
    for name, value in SECRETS.items():
        assert value not in text, name
    assert "keep this: the parser needs a lookahead" in text
    assert "[REDACTED PRIVATE KEY]" in text
    multi = "x\n-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\nBBBB\n-----END OPENSSH PRIVATE KEY-----\ny"
    assert handoff.redact_text(multi, {}) == "x\n[REDACTED PRIVATE KEY]\ny"
    headers = 'Authorization: token abcdef123456\n{"x-api-key": "k-1234567890"}\nstill here'
    out = handoff.redact_text(headers, {})
    assert "abcdef123456" not in out and "k-1234567890" not in out and out.endswith("still here")
    assert handoff.redact_text("input_tokens: 1200, max_tokens=4096", {}) == "input_tokens: 1200, max_tokens=4096"


def test_continue_writes_a_redacted_artifact_and_the_next_cycle_starts_fresh_with_it(env: Env, cli) -> None:
    # One item: the failed one is retried next (with another fresh item queued it would go first, §6.1).
    env.queue(entry("parser work"))
    env.steps([{"report": {"result": "failed", "error_class": "transient", "summary": "SUMMARY-ONE: half done"}},
               {"report": {"result": "unchanged", "summary": "fresh look"}}])
    assert cli("fire", "--cycles", "1").code == 0
    old = env.state()["agent_session"]["id"]
    r = cli("handoff", "continue", "--note", NOTE, extra_env={"MY_SERVICE_TOKEN": SECRETS["env-value"]})
    assert r.code == 0, r.stderr
    (art,) = artifacts(env, "continue")
    assert art.stat().st_mode & 0o777 == 0o600 and "parser-work" in art.name
    text = art.read_text()
    for name, value in SECRETS.items():
        assert value not in text, name
    assert "## Task\nparser work (ref source_epic=e1:item=parser work)" in text
    assert "## Decisions (newest first)\n- cycle 1: failed" in text
    assert "## Open questions" in text and "keep this: the parser needs a lookahead" in text
    assert "## Anchors" in text and "## Last result\ncycle 1: failed - SUMMARY-ONE: half done" in text
    assert pending(env)["mode"] == "continue" and pending(env)["parent_session_id"] == old

    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    # The same item would have been a continuation of the old session; the hand-off made it fresh.
    assert e["work_ref"] == "source_epic=e1:item=parser work"
    assert e["agent_mode"] == "first" and e["session_id"] != old
    assert (e["handoff_mode"], e["parent_session_id"], e["child_session_id"]) == ("continue", old, e["session_id"])
    assert e["handoff_artifact"] == art.name
    prompt = env.calls()[-1]["prompt"]
    assert "[Prior session summary]\n# evolve hand-off: continue" in prompt and "SUMMARY-ONE" in prompt
    assert pending(env) is None and art.exists()  # consumed, but kept for retention
    assert any(ev["event"] == "handoff.consumed" for ev in r.events())
    assert env.state()["agent_session"]["id"] == e["session_id"]


def _age(p: Path, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(p, (t, t))


def test_continue_artifacts_archive_after_30_days_and_go_after_90(env: Env, cli) -> None:
    d = handoffs_dir(env)
    (d / "archive").mkdir(parents=True)
    files = {
        "fresh": (d / "continue-20270101T000000Z-a.md", 29),
        "old": (d / "continue-20260101T000000Z-b.md", 31),
        "ancient": (d / "continue-20250101T000000Z-c.md", 91),
        "archived-young": (d / "archive" / "continue-20260201T000000Z-d.md", 60),
        "archived-old": (d / "archive" / "continue-20250201T000000Z-e.md", 95),
        "fork": (d / "fork-side-20240101T000000Z.md", 400),
        "other": (d / "notes.md", 400),
    }
    for p, days in files.values():
        p.write_text("x")
        _age(p, days)
    r = cli("handoff", "continue")
    assert r.code == 0, r.stderr
    assert "archived 1, deleted 2" in r.stdout
    assert files["fresh"][0].exists() and not files["old"][0].exists()
    assert (d / "archive" / files["old"][0].name).exists()
    assert not files["ancient"][0].exists() and not files["archived-old"][0].exists()
    assert files["archived-young"][0].exists()
    assert files["fork"][0].exists() and files["other"][0].exists()  # forks are never deleted on a timer


def test_the_pending_artifact_is_never_archived(env: Env, cli) -> None:
    assert cli("handoff", "continue").code == 0
    (art,) = artifacts(env, "continue")
    _age(art, 200)
    assert handoff.sweep(env.paths, time.time()) == (0, 0) and art.exists()


def test_fork_needs_a_purpose(env: Env, cli) -> None:
    assert cli("handoff", "fork").code == 2
    assert cli("handoff", "fork", "--purpose", "   ").code == 2
    assert not handoffs_dir(env).exists()


def test_a_fork_runs_seeded_records_parent_and_child_and_deletes_its_artifact(env: Env, cli) -> None:
    env.queue(entry("parser work"))
    env.steps([{"report": {"result": "failed", "error_class": "transient", "summary": "parent was here"}},
               {"report": {"result": "failed", "error_class": "transient", "summary": "HANDBACK: the test is flaky"}},
               {"report": {"result": "unchanged"}}])
    assert cli("fire", "--cycles", "1").code == 0
    parent = env.state()["agent_session"]["id"]
    r = cli("handoff", "fork", "--purpose", "find out why test_parse flakes", "--note", NOTE,
            extra_env={"MY_SERVICE_TOKEN": SECRETS["env-value"]})
    assert r.code == 0, r.stderr
    (art,) = artifacts(env, "fork")
    assert art.name.startswith("fork-find-out-why-test-parse-flakes-") and art.stat().st_mode & 0o777 == 0o600
    text = art.read_text()
    assert "## Purpose\nfind out why test_parse flakes" in text and "## Hand-back" in text
    assert f"- parent session: {parent}" in text
    assert all(v not in text for v in SECRETS.values())

    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    child = e["session_id"]
    assert child != parent and e["agent_mode"] == "first"  # the command runner cannot branch: seeded fresh
    assert (e["handoff_mode"], e["parent_session_id"], e["child_session_id"]) == ("fork", parent, child)
    assert e["handoff_purpose"] == "find out why test_parse flakes" and e["fork_session"] is False
    prompt = env.calls()[-1]["prompt"]
    assert "[Fork hand-off]" in prompt and "## Purpose\nfind out why test_parse flakes" in prompt
    assert not art.exists() and pending(env) is None  # gone once used
    session = env.state()["agent_session"]
    assert session["id"] == parent and session["events_since"] == 1  # the parent stays the loop's session
    assert session["fork_handback"]["child"] == child

    assert cli("fire", "--cycles", "1").code == 0
    e = env.ledger()[-1]
    assert e["agent_mode"] == "returning" and e["session_id"] == parent
    assert "handed back: HANDBACK: the test is flaky" in env.calls()[-1]["prompt"]
    assert "fork_handback" not in env.state()["agent_session"]  # delivered once


def test_a_rate_limited_fork_cycle_keeps_the_request(env: Env, cli) -> None:
    env.queue(entry("a"))
    env.steps([{"report": {"result": "unchanged"}}, {"report": {"result": "failed", "error_class": "limit"}}])
    assert cli("fire", "--cycles", "1").code == 0
    assert cli("handoff", "fork", "--purpose", "side quest").code == 0
    env.queue(entry("b", epic="e2"))
    env.write_config(fire={"max_minutes": 0.05})  # the reset is beyond the fire's budget: end with 75
    r = cli("fire", "--cycles", "1")
    assert r.code == 75
    (art,) = artifacts(env, "fork")
    assert pending(env)["artifact"] == art.name


def test_a_new_request_replaces_the_pending_one(env: Env, cli) -> None:
    assert cli("handoff", "fork", "--purpose", "first idea").code == 0
    (fork,) = artifacts(env, "fork")
    r = cli("handoff", "continue")
    assert "replaced the pending fork request" in r.stdout
    assert not fork.exists() and pending(env)["mode"] == "continue"


def _claude_dry_run(env: Env, cli, session: dict[str, Any]) -> dict[str, Any]:
    env.write_config(agent={"runner": "claude", "argv": ["claude"]})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.state.write_bytes(orjson.dumps({"agent_session": session}))
    env.queue(entry("a"))
    r = cli("fire", "--dry-run")
    return orjson.loads(r.stdout[r.stdout.index("{\n"):])


SESSION = {"id": "11111111-2222-3333-4444-555555555555", "runner": "claude", "started_cycle": 1, "last_cycle": 1,
           "need_ref": "source_epic=e1:item=a", "need_set_at": 1, "events_since": 0, "ended_heavy": False,
           "summary": "s"}


def test_dry_run_shows_the_fork_call_and_consumes_nothing(env: Env, cli) -> None:
    assert cli("handoff", "fork", "--purpose", "branch off").code == 0
    plan = _claude_dry_run(env, cli, SESSION)
    argv = plan["agent"]["argv"]
    i = argv.index("--resume")
    assert argv[i: i + 5] == ["--resume", SESSION["id"], "--fork-session", "--session-id", "<new-session-uuid>"]
    assert "--append-system-prompt-file" not in argv and plan["agent"]["mode"] == "fork"
    assert plan["agent"]["prompt"].index("[Fork hand-off]") < plan["agent"]["prompt"].index("[Cycle brief]")
    assert pending(env) is not None and len(artifacts(env, "fork")) == 1


def test_a_heavy_parent_is_not_resumed_by_a_fork(env: Env, cli) -> None:
    assert cli("handoff", "fork", "--purpose", "branch off").code == 0
    plan = _claude_dry_run(env, cli, {**SESSION, "ended_heavy": True})
    argv = plan["agent"]["argv"]
    assert "--resume" not in argv and "--fork-session" not in argv and "--append-system-prompt-file" in argv
    assert plan["agent"]["mode"] == "first" and "fresh session seeded" in plan["agent"]["reason"]


def test_continue_dry_run_is_fresh(env: Env, cli) -> None:
    assert cli("handoff", "continue").code == 0
    plan = _claude_dry_run(env, cli, SESSION)
    assert plan["agent"]["mode"] == "first" and "--resume" not in plan["agent"]["argv"]
    assert "handoff continue requested" in plan["agent"]["reason"]
    assert "[Prior session summary]\n# evolve hand-off: continue" in plan["agent"]["prompt"]


# -- the real Claude Code CLI ----------------------------------------------------------------


def _claude() -> str | None:
    from test_claude_runner import claude_binary

    return claude_binary()


CLAUDE = _claude()


@pytest.mark.skipif(CLAUDE is None, reason="Claude Code CLI not installed (see README)")
def test_real_cli_fork_branches_the_parent_conversation(env: Env, cli) -> None:
    from fake_anthropic import FakeAnthropic, report_text, user_texts

    env.queue(entry("parser work"))
    with FakeAnthropic() as fake:
        env.write_config(agent={"runner": "claude", "argv": [CLAUDE], "timeout_s": 120, "idle_timeout_s": 60,
                                "retry_backoff_s": 0.5})
        home = env.root / "home"
        home.mkdir()
        e = {**fake.env(), "HOME": str(home)}
        fake.add({"text": "PARENT-MARK " + report_text("failed", error_class="transient", summary="parent")})
        assert cli("fire", "--cycles", "1", extra_env=e).code == 0
        parent = env.ledger()[-1]["session_id"]
        assert cli("handoff", "fork", "--purpose", "try the regex approach").code == 0
        (art,) = artifacts(env, "fork")
        fake.add({"text": "FORK-MARK " + report_text("failed", error_class="transient", summary="regex works")})
        r = cli("fire", "--cycles", "1", extra_env=e)
        assert r.code == 0, r.stderr
        entry_ = env.ledger()[-1]
        child = entry_["session_id"]
        assert entry_["agent_mode"] == "fork" and entry_["fork_session"] is True
        assert child != parent and (entry_["parent_session_id"], entry_["child_session_id"]) == (parent, child)
        forked = fake.agent_requests[-1]
        texts = user_texts(forked)
        assert any("PARENT-MARK" in t for t in texts)  # the child carries the parent's conversation
        prompt = next(t for t in texts if "[Fork hand-off]" in t)
        assert prompt.startswith("[Fork hand-off]") and "try the regex approach" in prompt
        assert not art.exists() and pending(env) is None
        transcripts = {p.stem for p in (home / ".claude" / "projects").rglob("*.jsonl")}
        assert {parent, child} <= transcripts  # two conversations on disk: the branch did not overwrite
        assert env.state()["agent_session"]["id"] == parent

        fake.add({"text": report_text("unchanged")})
        assert cli("fire", "--cycles", "1", extra_env=e).code == 0
        last = fake.agent_requests[-1]
        texts = user_texts(last)
        assert env.ledger()[-1]["session_id"] == parent and env.ledger()[-1]["agent_mode"] == "returning"
        assert any("PARENT-MARK" in t for t in texts) and not any("FORK-MARK" in t for t in texts)
        assert any("handed back: regex works" in t for t in texts)
        assert json.loads(json.dumps(env.state()))["agent_session"].get("fork_handback") is None
