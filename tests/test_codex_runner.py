"""The real Codex CLI driven against a scripted Responses API server on 127.0.0.1 (docs/DESIGN.md §5).

The CLI is the npm package @openai/codex that the README's test command installs into ``.tools/``
(``.tools-extra/`` is also looked in, for a local install beside a shared ``.tools``); every
assertion is on what the server received, what the CLI did to the tree, or what evolve recorded.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import orjson
import pytest
from cli_support import assert_git_sane, cli_binary
from fake_anthropic import report_text
from fake_responses import FakeResponses, input_texts
from support import Env, entry, git, live, results

from evolve.procgroup import group_alive

KEY = "sk-codex-dummy-test-key"

CODEX = cli_binary("codex", "EVOLVE_TEST_CODEX")
if CODEX is None and os.environ.get("CI"):
    raise RuntimeError("the Codex CLI is not installed: run the README's test command (npm install ...)")
pytestmark = pytest.mark.skipif(
    CODEX is None, reason="Codex CLI not installed: no .tools/node_modules/.bin/codex (npm install @openai/codex)"
)


@pytest.fixture
def fake(env: Env) -> Iterator[FakeResponses]:
    """The CLI against the scripted server, in the repo itself (the worktree: see
    test_the_default_worktree_runs_under_the_cli_s_own_sandbox)."""
    with FakeResponses() as server:
        env.write_config(git={"isolation": "none"})
        env.write_config(agent={"runner": "codex", "argv": [CODEX], "base_url": server.url, "model": "gpt-test",
                                "api_key_env": "EVOLVE_TEST_CODEX_KEY", "timeout_s": 120, "idle_timeout_s": 60,
                                "retry_backoff_s": 0.5})
        yield server


def codex_env(env: Env, **extra: str) -> dict[str, str]:
    home = env.root / "home"
    home.mkdir(exist_ok=True)
    codex_home = env.root / "codex-home"
    codex_home.mkdir(exist_ok=True)
    # The CLI will not make its sandbox helper (codex-linux-sandbox, run by a system bwrap) in a CODEX_HOME
    # under the temporary directory, and pytest's tmp_path is under /tmp: give it a temporary directory of
    # its own, so CODEX_HOME is not under it, as ~/.codex is not for an operator.
    tmp = env.root / "codex-tmp" / "t"
    tmp.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "CODEX_HOME": str(codex_home), "EVOLVE_TEST_CODEX_KEY": KEY, "TMPDIR": str(tmp),
            **extra}


def rollout_window(env: Env, thread_id: str) -> int:
    """The model_context_window the CLI itself wrote into the session's rollout file."""
    (path,) = (env.root / "codex-home" / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl")
    records = map(orjson.loads, path.read_bytes().splitlines())
    windows = [rec["payload"]["info"]["model_context_window"] for rec in records
               if rec.get("type") == "event_msg" and rec["payload"].get("type") == "token_count"
               and rec["payload"].get("info")]
    return windows[-1]


def test_first_cycle_edits_through_the_cli_and_the_gate_commits_it(env: Env, cli, fake: FakeResponses) -> None:
    env.queue(entry("add the greeting"))
    fake.add({"shell": "printf 'hello\\n' > greeting.txt"},
             {"text": report_text("improved", summary="added greeting")})
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    assert r.code == 0, r.stderr + r.stdout[-2000:]
    first = fake.agent_requests[0]
    sent = "\n".join(input_texts(first))
    assert "[Identity]" in sent and "running unattended under evolve" in sent
    assert "[Work item]" in sent and "add the greeting" in sent and "[Prior session summary]" not in sent
    assert not any(i.get("role") == "assistant" for i in first["input"])  # fresh: no prior turns
    # The write ran inside the CLI's own sandbox: workspace-write, not the read-only default.
    assert "`sandbox_mode` is `workspace-write`" in sent
    e = env.ledger()[-1]
    assert (e["result"], e["agent_mode"]) == ("improved", "first")
    assert (env.repo / "greeting.txt").read_text() == "hello\n"
    assert git(env.repo, "log", "-1", "--format=%H").strip() == e["sha"]
    # The session id is the CLI's own thread id, recorded as the loop's session.
    assert e["session_id"] == env.state()["agent_session"]["id"] and e["session_id"] in r.stdout + r.stderr + "".join(
        p.name for p in (env.root / "codex-home" / "sessions").rglob("*.jsonl"))
    assert e["usage"]["input_tokens"] == 1200 and e["cost_usd"] == 0 and e["num_turns"] >= 1
    assert e["context_pct"] == pytest.approx(round(100 * 1200 / rollout_window(env, e["session_id"]), 2))
    assert_git_sane(env)


def test_continuation_resumes_the_thread_and_the_server_receives_the_prior_turns(
    env: Env, cli, fake: FakeResponses
) -> None:
    env.queue(entry("flaky item"))
    fake.add({"text": "FIRST-ANSWER-MARK " + report_text("failed", error_class="transient", summary="not yet")},
             {"text": report_text("unchanged", summary="nothing to do")})
    cli("fire", "--cycles", "1", extra_env=codex_env(env))
    sid = env.ledger()[-1]["session_id"]
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    assert r.code == 0, r.stderr
    texts = input_texts(fake.agent_requests[-1])
    assert any("FIRST-ANSWER-MARK" in t for t in texts)  # the prior assistant turn came back
    e = env.ledger()[-1]
    assert (e["agent_mode"], e["session_id"]) == ("continuation", sid)
    assert any(t.startswith("[Cycle brief]") for t in texts)  # the resumed prompt leads with the dynamic block


def test_a_new_item_starts_a_fresh_thread(env: Env, cli, fake: FakeResponses) -> None:
    env.queue(entry("first item", "second item"))
    fake.add({"text": "ALPHA-ANSWER " + report_text("unchanged", summary="SUMMARY-OF-FIRST")},
             {"text": report_text("unchanged")})
    cli("fire", "--cycles", "2", extra_env=codex_env(env))
    second = fake.agent_requests[-1]
    texts = input_texts(second)
    assert not any("ALPHA-ANSWER" in t for t in texts)
    sent = "\n".join(texts)
    assert "[Prior session summary]\nSUMMARY-OF-FIRST" in sent and "second item" in sent
    ledger = env.ledger()
    assert ledger[1]["agent_mode"] == "first" and ledger[0]["session_id"] != ledger[1]["session_id"]


def test_occupancy_is_the_last_request_and_two_heavy_cycles_hand_off(env: Env, cli, fake: FakeResponses) -> None:
    env.queue(entry("a", "b", "c"))
    heavy = {"input_tokens": 150_000, "output_tokens": 50}
    fake.add({"text": "HEAVY-ONE " + report_text("unchanged"), "usage": heavy},
             {"text": report_text("unchanged"), "usage": heavy})
    r = cli("fire", extra_env=codex_env(env))
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert results(ledger) == ["unchanged", "unchanged", "context-handoff"]
    window = rollout_window(env, ledger[1]["session_id"])
    pct = round(100 * 150_000 / window, 2)
    assert pct >= 40  # the scripted input is heavy on whatever window the CLI reports
    # Each cycle's occupancy is its own last request, never the CLI's running total across resumes.
    assert [e["usage"]["input_tokens"] for e in ledger[:2]] == [150_000, 150_000]
    assert all(e["context_heavy"] and e["context_signal"] == f"occupancy:{pct:g}%" for e in ledger[:2])
    assert env.paths.handoff.exists()
    heavy_sid = ledger[1]["session_id"]
    fake.add({"text": report_text("unchanged")})
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    assert "handoff.cleared" in r.names()
    e = env.ledger()[-1]
    assert e["agent_mode"] == "first" and e["session_id"] != heavy_sid
    assert not any("HEAVY-ONE" in t for t in input_texts(fake.agent_requests[-1]))


def test_a_lost_session_is_rebuilt_as_first_once(env: Env, cli, fake: FakeResponses) -> None:
    env.queue(entry("a"))
    fake.add({"text": "LOST-MARK " + report_text("failed", error_class="transient", summary="not yet")},
             {"text": report_text("unchanged")})
    cli("fire", "--cycles", "1", extra_env=codex_env(env))
    old = env.ledger()[-1]["session_id"]
    shutil.rmtree(env.root / "codex-home" / "sessions")  # the CLI's session store lost the thread
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "unchanged" and e["session_id"] not in (old, None)
    assert "rebuilt after invalid session" in e["disposition"]
    assert len(fake.agent_requests) == 2 and not any("LOST-MARK" in t for t in input_texts(fake.agent_requests[-1]))
    assert "[Identity]" in "\n".join(input_texts(fake.agent_requests[-1]))
    assert_git_sane(env)


def test_no_provider_config_is_a_configuration_error_before_any_claim(env: Env, cli, fake: FakeResponses) -> None:
    env.write_config(agent={"base_url": ""})  # and CODEX_HOME holds neither config.toml nor a login
    env.queue(entry("a"))
    head, queued = git(env.repo, "rev-parse", "HEAD").strip(), env.paths.nextwork.read_bytes()
    r = cli("fire", extra_env=codex_env(env))
    assert r.code == 78, r.stderr
    assert "preflight.failed" in r.names() and "no provider config" in r.stderr
    assert env.ledger() == [] and fake.requests == []
    assert env.paths.nextwork.read_bytes() == queued  # nothing was claimed
    assert git(env.repo, "rev-parse", "HEAD").strip() == head and git(env.repo, "status", "--porcelain").strip() == ""
    # status says so too, from the same check (no process started), and doctor names the fix.
    s = cli("status", extra_env=codex_env(env))
    assert s.code == 1 and "DEGRADED" in s.stdout and "no provider config" in s.stdout
    d = cli("doctor", extra_env=codex_env(env))
    assert "no provider config" in d.stdout and "set [agent] base_url" in d.stdout
    assert_git_sane(env)


def test_auth_rejected_is_fatal_and_the_key_never_lands_in_the_ledger(env: Env, cli, fake: FakeResponses) -> None:
    env.queue(entry("a"))
    fake.add({"status": 401, "error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
    r = cli("fire", extra_env=codex_env(env))
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "fatal") and "401" in e["error"]
    assert KEY not in env.paths.ledger.read_text() and KEY not in r.stdout + r.stderr
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"
    assert git(env.repo, "status", "--porcelain").strip() == ""
    assert_git_sane(env)


def test_a_server_error_is_transient_retried_once_by_the_fire_in_the_same_thread(
    env: Env, cli, fake: FakeResponses
) -> None:
    env.queue(entry("a"))
    fake.add({"status": 500}, {"shell": "printf 'x\\n' > after-retry.txt"}, {"text": report_text("improved")})
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    assert r.code == 0, r.stderr
    retries = [ev for ev in r.events() if ev["event"] == "agent.retry"]
    assert len(retries) == 1 and "transient" in retries[0]["reason"]
    # The provider's own retries are off: one request failed, then the fire's retry resumed the thread.
    assert len(fake.agent_requests) == 3
    e = env.ledger()[-1]
    assert e["result"] == "improved" and (env.repo / "after-retry.txt").exists()
    assert_git_sane(env)


def test_rate_limit_beyond_the_budget_exits_75_and_keeps_the_item(env: Env, cli, fake: FakeResponses) -> None:
    env.write_config(fire={"max_minutes": 0.05})
    env.queue(entry("a"))
    fake.add({"status": 429, "error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}})
    r = cli("fire", extra_env=codex_env(env))
    assert r.code == 75, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "limit")
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"
    assert env.state()["consecutive_failures"] == 0
    assert_git_sane(env)


def test_a_hang_is_killed_by_the_idle_timeout_with_its_process_group(env: Env, cli, fake: FakeResponses) -> None:
    env.write_config(agent={"idle_timeout_s": 3, "transient_retries": 0})
    env.queue(entry("a"))
    fake.add({"hang": 60, "text": "late"})
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "timeout") and "idle" in e["error"]
    pgids = [ev["pgid"] for ev in r.events() if ev["event"] == "agent.started"]
    assert pgids and not group_alive(pgids[0])
    assert git(env.repo, "status", "--porcelain").strip() == ""
    assert_git_sane(env)


def test_dry_run_prints_the_exact_codex_call(env: Env, cli, fake: FakeResponses) -> None:
    env.queue(entry("a"))
    r = cli("fire", "--dry-run", extra_env=codex_env(env))
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    argv = plan["agent"]["argv"]
    assert argv[:4] == [CODEX, "exec", "--json", "--skip-git-repo-check"] and argv[-1] == "-"
    assert "resume" not in argv
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert 'sandbox_mode="workspace-write"' in pairs and 'approval_policy="never"' in pairs
    assert f'model_providers.evolve.base_url="{fake.url}"' in pairs
    assert "model_providers.evolve.request_max_retries=0" in pairs
    assert "[Identity]" in plan["agent"]["prompt"]
    assert (plan["agent"]["runner"], plan["agent"]["preflight"]) == ("codex", "ok")
    assert KEY not in r.stdout + r.stderr and fake.requests == []


def test_the_default_worktree_runs_under_the_cli_s_own_sandbox(env: Env, cli, fake: FakeResponses) -> None:
    """Issue 23: Codex's workspace-write sandbox (bubblewrap) refuses any command in a tree whose .agents is
    a symlink; evolve's worktree now has a real .agents/ (the agent's copy), so the defaults work: the CLI's
    own sandbox, evolve's own worktree, no exit 78, and the edit lands through the gate."""
    env.write_config(git={"isolation": "worktree"})
    env.queue(entry("in the worktree"))
    fake.add({"shell": "printf 'wt\\n' > from-worktree.txt"}, {"text": report_text("improved")})
    r = cli("fire", "--cycles", "1", extra_env=codex_env(env))
    assert r.code == 0, r.stderr + r.stdout[-2000:]
    e = env.ledger()[-1]
    assert e["result"] == "improved" and (env.tree / "from-worktree.txt").read_text() == "wt\n"
    assert git(env.repo, "show", f"{e['sha']}:from-worktree.txt").strip() == "wt"
    assert "`sandbox_mode` is `workspace-write`" in "\n".join(input_texts(fake.agent_requests[0]))
    assert not (env.tree / ".agents").is_symlink()
    assert_git_sane(env)
