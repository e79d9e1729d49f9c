"""The real Gemini CLI driven against a scripted Gemini API server on 127.0.0.1 (docs/DESIGN.md §5).

The CLI is the npm package @google/gemini-cli that the README's test command installs into
``.tools/`` (``.tools-extra/`` is also looked in); it runs in evolve's own worktree, whose stable
path is what its per-directory sessions need. Every assertion is on what the server received,
what the CLI did to the tree, or what evolve recorded.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from cli_support import assert_git_sane, cli_binary
from fake_anthropic import report_text
from fake_gemini import FakeGemini, texts
from support import Env, entry, git, live, results

from evolve.agent.gemini import DEFAULT_WINDOW

KEY = "gm-dummy-test-key"
GEMINI = cli_binary("gemini", "EVOLVE_TEST_GEMINI")
if GEMINI is None and os.environ.get("CI"):
    raise RuntimeError("the Gemini CLI is not installed: run the README's test command (npm install ...)")
pytestmark = pytest.mark.skipif(
    GEMINI is None,
    reason="Gemini CLI not installed: no .tools/node_modules/.bin/gemini (npm install @google/gemini-cli)",
)


@pytest.fixture
def fake(env: Env) -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        env.write_config(agent={"runner": "gemini", "argv": [GEMINI], "base_url": server.url,
                                "model": "gemini-2.5-pro", "timeout_s": 120, "idle_timeout_s": 60,
                                "retry_backoff_s": 0.5})
        yield server


def settings(env: Env, **extra: Any) -> None:
    """The operator's user settings: the API-key auth type; the CLI's own retries off (the fire retries)."""
    home = env.root / "home" / ".gemini"
    home.mkdir(parents=True, exist_ok=True)
    obj = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"maxAttempts": 1},
           "privacy": {"usageStatisticsEnabled": False}, **extra}
    (home / "settings.json").write_bytes(orjson.dumps(obj))


def gemini_env(env: Env, *, configured: bool = True) -> dict[str, str]:
    if configured:
        settings(env)
    (env.root / "home").mkdir(exist_ok=True)
    return {"HOME": str(env.root / "home"), "GEMINI_API_KEY": KEY}


def write(env: Env, name: str, content: str) -> dict[str, Any]:
    return {"call": {"name": "write_file", "args": {"file_path": str(env.tree / name), "content": content}}}


def test_first_cycle_writes_through_the_cli_tool_in_the_worktree_and_is_committed(
    env: Env, cli, fake: FakeGemini
) -> None:
    env.queue(entry("add the greeting"))
    fake.add(write(env, "greeting.txt", "hello\n"), {"text": report_text("improved", summary="added greeting")})
    r = cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    assert r.code == 0, r.stderr + r.stdout[-2000:]
    first = fake.agent_requests[0]
    sent = "\n".join(texts(first))
    assert "[Identity]" in sent and "running unattended under evolve" in sent
    assert "[Work item]" in sent and "add the greeting" in sent and "[Prior session summary]" not in sent
    assert not any(c.get("role") == "model" for c in first["contents"])  # fresh: no prior turns
    e = env.ledger()[-1]
    assert (e["result"], e["agent_mode"]) == ("improved", "first")
    assert git(env.repo, "show", f"{e['sha']}:greeting.txt") == "hello\n"
    assert e["session_id"] == env.state()["agent_session"]["id"]
    assert e["usage"]["input_tokens"] == 1200 and e["cost_usd"] == 0 and e["num_turns"] >= 1
    assert e["context_pct"] == pytest.approx(round(100 * 1200 / DEFAULT_WINDOW, 2))
    assert_git_sane(env)


def test_continuation_resumes_from_the_same_tree_with_the_prior_turns(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("flaky item"))
    fake.add({"text": "FIRST-ANSWER-MARK " + report_text("failed", error_class="transient", summary="not yet")},
             {"text": report_text("unchanged", summary="nothing to do")})
    cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    sid = env.ledger()[-1]["session_id"]
    r = cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    assert r.code == 0, r.stderr
    got = texts(fake.agent_requests[-1])
    assert any("FIRST-ANSWER-MARK" in t for t in got)  # the prior model turn came back
    e = env.ledger()[-1]
    assert (e["agent_mode"], e["session_id"]) == ("continuation", sid)
    assert any(t.startswith("[Cycle brief]") for t in got)


def test_a_new_item_starts_a_fresh_session(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("first item", "second item"))
    fake.add({"text": "ALPHA-ANSWER " + report_text("unchanged", summary="SUMMARY-OF-FIRST")},
             {"text": report_text("unchanged")})
    cli("fire", "--cycles", "2", extra_env=gemini_env(env))
    got = texts(fake.agent_requests[-1])
    assert not any("ALPHA-ANSWER" in t for t in got)
    sent = "\n".join(got)
    assert "[Prior session summary]\nSUMMARY-OF-FIRST" in sent and "second item" in sent
    ledger = env.ledger()
    assert ledger[1]["agent_mode"] == "first" and ledger[0]["session_id"] != ledger[1]["session_id"]


def test_occupancy_is_the_last_request_and_two_heavy_cycles_hand_off(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("a", "b", "c"))
    heavy = {"promptTokenCount": 450_000, "candidatesTokenCount": 50}  # 42.9% of the 1,048,576 window
    fake.add(write(env, "a.txt", "a\n") | {"usage": {"promptTokenCount": 300_000}},
             {"text": "HEAVY-ONE " + report_text("unchanged"), "usage": heavy},
             {"text": report_text("unchanged"), "usage": heavy})
    r = cli("fire", extra_env=gemini_env(env))
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert results(ledger) == ["unchanged", "unchanged", "context-handoff"], [
        (e["result"], e.get("usage"), e.get("context_pct"), e.get("error")) for e in ledger]
    pct = round(100 * 450_000 / DEFAULT_WINDOW, 2)
    # The last request's input, not the run's sum (result.stats said 750,000 for the first cycle).
    assert [e["usage"]["input_tokens"] for e in ledger[:2]] == [450_000, 450_000]
    assert all(e["context_heavy"] and e["context_signal"] == f"occupancy:{pct:g}%" for e in ledger[:2])
    heavy_sid = ledger[1]["session_id"]
    fake.add({"text": report_text("unchanged")})
    r = cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    assert "handoff.cleared" in r.names()
    e = env.ledger()[-1]
    assert e["agent_mode"] == "first" and e["session_id"] != heavy_sid
    assert not any("HEAVY-ONE" in t for t in texts(fake.agent_requests[-1]))


def test_a_lost_session_is_rebuilt_as_first_once(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("a"))
    fake.add({"text": "LOST-MARK " + report_text("failed", error_class="transient", summary="not yet")},
             {"text": report_text("unchanged")})
    cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    old = env.ledger()[-1]["session_id"]
    shutil.rmtree(env.root / "home" / ".gemini" / "tmp")  # the CLI's session store lost the chat
    r = cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "unchanged" and e["session_id"] not in (old, None), e
    assert "rebuilt after invalid session" in e["disposition"]
    assert len(fake.agent_requests) == 2 and not any("LOST-MARK" in t for t in texts(fake.agent_requests[-1]))
    assert "[Identity]" in "\n".join(texts(fake.agent_requests[-1]))
    assert_git_sane(env)


def test_no_auth_type_is_a_configuration_error_before_any_claim(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("a"))
    head, queued = git(env.repo, "rev-parse", "HEAD").strip(), env.paths.nextwork.read_bytes()
    r = cli("fire", extra_env=gemini_env(env, configured=False))
    assert r.code == 78, r.stderr
    assert "preflight.failed" in r.names() and "security.auth.selectedType" in r.stderr
    assert env.ledger() == [] and fake.requests == []
    assert env.paths.nextwork.read_bytes() == queued
    assert git(env.repo, "rev-parse", "HEAD").strip() == head and git(env.repo, "status", "--porcelain") == ""
    assert_git_sane(env)


def test_a_rejected_key_is_fatal_and_never_lands_in_the_ledger(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("a"))
    fake.add({"status": 400, "error": {"message": "API key not valid. Please pass a valid API key.",
                                       "status": "INVALID_ARGUMENT"}})
    r = cli("fire", extra_env=gemini_env(env))
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "fatal") and "API key not valid" in e["error"]
    assert KEY not in env.paths.ledger.read_text() and KEY not in r.stdout + r.stderr
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"
    assert git(env.repo, "status", "--porcelain") == ""
    assert_git_sane(env)


def test_a_server_error_is_transient_and_the_fire_retries_it(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("a"))
    fake.add({"status": 500}, write(env, "after-retry.txt", "x\n"), {"text": report_text("improved")})
    r = cli("fire", "--cycles", "1", extra_env=gemini_env(env))
    assert r.code == 0, r.stderr
    retries = [ev for ev in r.events() if ev["event"] == "agent.retry"]
    assert len(retries) == 1 and "transient" in retries[0]["reason"]
    e = env.ledger()[-1]
    assert e["result"] == "improved", e
    assert git(env.repo, "show", f"{e['sha']}:after-retry.txt") == "x\n"
    assert_git_sane(env)


def test_rate_limit_beyond_the_budget_exits_75_and_keeps_the_item(env: Env, cli, fake: FakeGemini) -> None:
    env.write_config(fire={"max_minutes": 0.05})
    env.queue(entry("a"))
    fake.add({"status": 429, "error": {"message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}})
    r = cli("fire", extra_env=gemini_env(env))
    assert r.code == 75, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "limit")
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"
    assert env.state()["consecutive_failures"] == 0
    assert_git_sane(env)


def test_dry_run_prints_the_exact_gemini_call(env: Env, cli, fake: FakeGemini) -> None:
    env.queue(entry("a"))
    r = cli("fire", "--dry-run", extra_env=gemini_env(env))
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    argv = plan["agent"]["argv"]
    assert argv[:8] == [GEMINI, "-p", "", "--output-format", "stream-json", "--approval-mode", "auto_edit",
                        "--skip-trust"]
    assert "--session-id" in argv and "--resume" not in argv
    assert plan["agent"]["env"]["GOOGLE_GEMINI_BASE_URL"] == fake.url
    assert "[Identity]" in plan["agent"]["prompt"]
    assert (plan["agent"]["runner"], plan["agent"]["preflight"]) == ("gemini", "ok")
    assert KEY not in r.stdout + r.stderr and fake.requests == []
