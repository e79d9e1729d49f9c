"""The real Claude Code CLI driven against a scripted Anthropic server on 127.0.0.1 (docs/DESIGN.md §5).

The CLI is the npm package @anthropic-ai/claude-code that the README's test command installs into
``.tools/``; every assertion is on what the server received or what evolve recorded.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fake_anthropic import FakeAnthropic, report_text, system_text, user_texts
from support import Env, entry, live, results

from evolve.procgroup import group_alive

ROOT = Path(__file__).resolve().parents[1]


def claude_binary() -> str | None:
    for cand in (os.environ.get("EVOLVE_TEST_CLAUDE"), str(ROOT / ".tools/node_modules/.bin/claude"),
                 shutil.which("claude")):
        if cand and Path(cand).exists():
            return cand
    return None


CLAUDE = claude_binary()
if CLAUDE is None and os.environ.get("CI"):
    raise RuntimeError("the Claude Code CLI is not installed: run the README's test command (npm install ...)")
pytestmark = pytest.mark.skipif(CLAUDE is None, reason="Claude Code CLI not installed (see README)")

HEAVY = {"input_tokens": 450_000, "output_tokens": 50}  # 45% of the CLI's 1M context window


@pytest.fixture
def fake(env: Env) -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        env.write_config(agent={"runner": "claude", "argv": [CLAUDE], "timeout_s": 120, "idle_timeout_s": 60,
                                "retry_backoff_s": 0.5})
        yield server


def cli_env(env: Env, fake: FakeAnthropic, **extra: str) -> dict[str, str]:
    home = env.root / "home"
    home.mkdir(exist_ok=True)
    return {**fake.env(), "HOME": str(home), **extra}


def write(env: Env, name: str, content: str = "x\n") -> dict:
    return {"tool": {"name": "Write", "input": {"file_path": str(env.tree / name), "content": content}}}


def test_first_cycle_is_fresh_with_orientation_in_the_system_prompt(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("add the greeting"))
    fake.add(write(env, "greeting.txt", "hello\n"), {"text": report_text("improved", summary="added greeting")})
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr + r.stdout[-2000:]
    first = fake.agent_requests[0]
    system = system_text(first)
    assert "[Identity]" in system and "running unattended under evolve" in system
    assert "[Work item]" in system and "add the greeting" in system
    assert "[Prior session summary]" not in system
    texts = user_texts(first)
    assert any("Do the work item" in t for t in texts)
    e = env.ledger()[-1]
    assert (e["result"], e["agent_mode"]) == ("improved", "first")
    assert (env.repo / "greeting.txt").read_text() == "hello\n"
    assert e["session_id"] == env.state()["agent_session"]["id"]
    assert e["usage"]["input_tokens"] == 1200 and e["cost_usd"] > 0 and e["num_turns"] >= 1
    assert e["context_pct"] == pytest.approx(0.12)  # 1200 of the 1,000,000-token window the CLI reports


def test_continuation_resumes_and_the_server_receives_the_prior_turns(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("flaky item"))
    fake.add({"text": "FIRST-ANSWER-MARK " + report_text("failed", error_class="transient", summary="not yet")},
             {"text": report_text("unchanged", summary="nothing to do")})
    cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    sid = env.ledger()[-1]["session_id"]
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr
    second = fake.agent_requests[-1]
    texts = user_texts(second)
    assert any("FIRST-ANSWER-MARK" in t for t in texts)  # the prior assistant turn came back
    e = env.ledger()[-1]
    assert (e["agent_mode"], e["session_id"]) == ("continuation", sid)
    # A resumed call keeps its recorded system prompt; the dynamic block leads the prompt instead.
    assert any(t.startswith("[Cycle brief]") for t in texts)


def test_switching_the_work_item_starts_fresh_with_the_prior_summary(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("first item", "second item"))
    fake.add({"text": "ALPHA-ANSWER " + report_text("unchanged", summary="SUMMARY-OF-FIRST")},
             {"text": report_text("unchanged")})
    cli("fire", "--cycles", "2", extra_env=cli_env(env, fake))
    second = fake.agent_requests[-1]
    assert not any("ALPHA-ANSWER" in t for t in user_texts(second))
    system = system_text(second)
    assert "[Prior session summary]\nSUMMARY-OF-FIRST" in system and "second item" in system
    ledger = env.ledger()
    assert ledger[1]["agent_mode"] == "first" and ledger[0]["session_id"] != ledger[1]["session_id"]


def test_heavy_cycles_hand_off_and_the_next_fire_never_resumes(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("a", "b", "c"))
    fake.add({"text": "HEAVY-ONE " + report_text("unchanged"), "usage": HEAVY},
             {"text": report_text("unchanged"), "usage": HEAVY})
    r = cli("fire", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert results(ledger) == ["unchanged", "unchanged", "context-handoff"]
    assert all(e["context_heavy"] and e["context_signal"] == "occupancy:45%" for e in ledger[:2])
    assert env.paths.handoff.exists()
    heavy_sid = ledger[1]["session_id"]
    fake.add({"text": report_text("unchanged")})
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert "handoff.cleared" in r.names()
    e = env.ledger()[-1]
    assert e["agent_mode"] == "first" and e["session_id"] != heavy_sid
    assert not any("HEAVY-ONE" in t for t in user_texts(fake.agent_requests[-1]))


def test_compaction_in_the_stream_is_a_heavy_signal(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("big"))
    fake.add(write(env, "a.txt") | {"usage": HEAVY}, write(env, "b.txt") | {"usage": HEAVY},
             {"text": "<summary>compacted</summary>"}, {"text": report_text("improved")})
    cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    e = env.ledger()[-1]
    assert "compaction" in e["context_signal"] and e["context_heavy"] is True


def test_rate_limit_waits_for_the_reset_then_succeeds(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("a"))
    limited = {"status": 429, "headers": {"retry-after": "1"},
               "error": {"type": "rate_limit_error", "message": "rate limited"}}
    fake.add(limited, limited, write(env, "done.txt"), {"text": report_text("improved")})
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr
    waits = [e for e in r.events() if e["event"] == "agent.limit_wait"]
    assert len(waits) == 1 and waits[0]["wait_s"] == pytest.approx(1, abs=1)
    assert env.ledger()[-1]["result"] == "improved"


def test_rate_limit_beyond_the_budget_exits_75_and_keeps_the_item(env: Env, cli, fake: FakeAnthropic) -> None:
    env.write_config(fire={"max_minutes": 0.05})
    env.queue(entry("a"))
    limited = {"status": 429, "headers": {"retry-after": "600"},
               "error": {"type": "rate_limit_error", "message": "rate limited"}}
    fake.add(limited, limited)
    r = cli("fire", extra_env=cli_env(env, fake, CLAUDE_CODE_MAX_RETRIES="0"))
    assert r.code == 75, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "limit")
    item = live(env.paths.nextwork)[0]["items"][0]
    assert item["claim_status"] == "available"
    assert env.state()["consecutive_failures"] == 0  # limits never count toward the breaker


def test_overloaded_is_transient_and_retried_with_backoff(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("a"))
    over = {"status": 529, "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.add(over, over, {"text": report_text("unchanged")})
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    retries = [e for e in r.events() if e["event"] == "agent.retry"]
    assert len(retries) == 1 and "transient" in retries[0]["reason"]
    assert env.ledger()[-1]["result"] == "unchanged"


def test_auth_failure_is_fatal(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("a"))
    bad = {"status": 401, "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
    fake.add(bad, bad)
    r = cli("fire", extra_env=cli_env(env, fake))
    assert r.code == 1
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "fatal")
    assert "sk-ant-dummy-test-key" not in env.paths.ledger.read_text()


def test_a_hang_is_killed_by_the_idle_timeout_with_its_process_group(env: Env, cli, fake: FakeAnthropic) -> None:
    env.write_config(agent={"idle_timeout_s": 3})
    env.queue(entry("a"))
    fake.add({"hang": 60, "text": "late"})
    started = time.monotonic()
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert time.monotonic() - started < 40
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "timeout") and "idle" in e["error"]
    pgids = [ev["pgid"] for ev in r.events() if ev["event"] == "agent.started"]
    assert pgids and not group_alive(pgids[0])


def test_dry_run_prints_the_exact_claude_call(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("a"))
    r = cli("fire", "--dry-run", extra_env=cli_env(env, fake))
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    argv = plan["agent"]["argv"]
    assert argv[0] == CLAUDE and argv[1:5] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert "--session-id" in argv and "--append-system-prompt-file" in argv and "--resume" not in argv
    assert plan["agent"]["env"]["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "40"
    assert plan["agent"]["env"]["CLAUDECODE"] == "<removed>"
    assert "[Identity]" in plan["agent"]["prompt"]
    assert fake.requests == []


def test_invalid_session_is_rebuilt_as_first_once(env: Env, cli, fake: FakeAnthropic) -> None:
    env.queue(entry("a"))
    ref = "source_epic=e1:item=a"
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    bogus = "99999999-2222-3333-4444-555555555555"
    env.paths.state.write_bytes(orjson.dumps({"agent_session": {
        "id": bogus, "runner": "claude", "started_cycle": 0, "last_cycle": 0, "need_ref": ref, "need_set_at": 0,
        "events_since": 0, "ended_heavy": False, "summary": "old"}}))
    fake.add({"text": report_text("unchanged")})
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "unchanged" and e["session_id"] != bogus
    assert "rebuilt after invalid session" in e["disposition"]
    assert len(fake.agent_requests) == 1 and "[Identity]" in system_text(fake.agent_requests[0])
