"""The repository's agent settings are contained (issue 23 item 5; docs/DESIGN.md §8.5 *Trust*).

The real Claude Code CLI against a scripted Anthropic server on 127.0.0.1: a committed ``.claude/settings.json``
with a SessionStart hook (that writes a marker holding an ``env`` value the same file sets) does not reach the
agent's run until ``evolve trust``; what the operator wrote (untracked) still does. The decision itself is a table.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cli_support import assert_git_sane, cli_binary
from fake_anthropic import FakeAnthropic, report_text
from fake_gemini import FakeGemini
from fake_responses import FakeResponses
from support import Env, entry, git, live

from evolve.agent.settings import LOCAL, MCP, PROJECT, Found, decide

ROOT = Path(__file__).resolve().parents[1]
SHA = "a" * 64


# -- the decision (a table) --------------------------------------------------------------------

def f(rel: str, *, operators: bool = False, tracked: bool = True, sha: str = SHA) -> Found:
    return Found(rel, sha, operators=operators, tracked=tracked)


TRUSTED = {PROJECT: {"sha256": SHA, "kind": "agent-settings"}, ".codex/config.toml": {"sha256": SHA,
                                                                                       "kind": "agent-settings"}}


@pytest.mark.parametrize("runner, found, record, sources, untrusted, refused", [
    ("claude", {}, {}, (), [], False),  # nothing in the tree: nothing left out, no flag added
    ("claude", {PROJECT: f(PROJECT)}, {}, ("user", "local"), [PROJECT], False),
    ("claude", {PROJECT: f(PROJECT)}, TRUSTED, (), [], False),
    ("claude", {PROJECT: f(PROJECT, sha="b" * 64)}, TRUSTED, ("user", "local"), [PROJECT], False),  # changed
    ("claude", {PROJECT: f(PROJECT, operators=True, tracked=False)}, {}, (), [], False),  # `evolve setup`'s
    ("claude", {LOCAL: f(LOCAL, operators=True, tracked=False)}, {}, (), [], False),  # evolve's link
    ("claude", {LOCAL: f(LOCAL)}, {}, ("user", "project"), [LOCAL], False),  # committed settings.local.json
    ("claude", {LOCAL: f(LOCAL, tracked=False)}, {}, ("user", "project"), [LOCAL], False),  # made in the worktree
    ("claude", {PROJECT: f(PROJECT), LOCAL: f(LOCAL)}, {}, ("user",), [PROJECT, LOCAL], False),
    ("claude", {MCP: f(MCP)}, {}, ("user", "local"), [MCP], False),  # -p starts a .mcp.json's servers unasked
    ("claude", {MCP: f(MCP, operators=True, tracked=False)}, {}, (), [], False),
    ("codex", {".codex/config.toml": f(".codex/config.toml")}, {}, (), [".codex/config.toml"], True),
    ("codex", {".codex/config.toml": f(".codex/config.toml")}, TRUSTED, (), [], False),
    ("gemini", {".env": f(".env")}, {}, (), [".env"], True),  # Gemini reads the project's .env, no flag stops it
    ("gemini", {".gemini/.env": f(".gemini/.env")}, {}, (), [".gemini/.env"], True),
    ("gemini", {".env": f(".env", tracked=False)}, {}, (), [], False),  # an .env the agent made: not the repo's
    ("command", {PROJECT: f(PROJECT)}, {}, (), [], False),  # the command runner reads no project settings
])
def test_decide(runner: str, found: dict, record: dict, sources: tuple, untrusted: list, refused: bool) -> None:
    s = decide(runner, found, record)
    assert s.skipped == ()
    assert s.sources == sources
    assert [u.rel for u in s.untrusted] == untrusted
    assert bool(s.refusal) is refused
    if sources:
        assert s.claude_args() == ["--setting-sources", ",".join(sources)]
        assert "not trusted: left out" in s.describe()
    if refused:
        assert "evolve trust" in s.refusal and untrusted[0] in s.refusal


def test_a_codex_config_the_cli_itself_leaves_out_refuses_nothing() -> None:
    """Codex reads a project's .codex/config.toml only where its own user config trusts the directory."""
    rel = ".codex/config.toml"
    s = decide("codex", {rel: f(rel)}, {}, cli_skips=frozenset({rel}))
    assert s.refusal == "" and s.skipped == (".codex/config.toml",) and "leaves it out" in s.describe()


def test_the_operators_own_project_settings_reach_a_worktree_run_with_settings() -> None:
    s = decide("claude", {}, {}, operator_project="/repo/.claude/settings.json")
    assert s.claude_args() == ["--settings", "/repo/.claude/settings.json"]


# -- the real Claude Code CLI ------------------------------------------------------------------

def claude_binary() -> str | None:
    for cand in (os.environ.get("EVOLVE_TEST_CLAUDE"), str(ROOT / ".tools/node_modules/.bin/claude"),
                 shutil.which("claude")):
        if cand and Path(cand).exists():
            return cand
    return None


CLAUDE = claude_binary()
needs_claude = pytest.mark.skipif(CLAUDE is None, reason="Claude Code CLI not installed (see README)")


@pytest.fixture
def fake(env: Env) -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        env.write_config(agent={"runner": "claude", "argv": [CLAUDE], "timeout_s": 120, "idle_timeout_s": 60,
                                "retry_backoff_s": 0.5})
        yield server


def cli_env(env: Env, fake: FakeAnthropic) -> dict[str, str]:
    home = env.root / "home"
    home.mkdir(exist_ok=True)
    return {**fake.env(), "HOME": str(home)}


def settings_with_hook(marker: Path, value: str) -> str:
    """A settings file whose SessionStart hook writes ``$PLANTED`` (set by the same file's ``env``) to ``marker``."""
    hook = [sys.executable, "-c", f"import os; open({str(marker)!r}, 'a').write(os.environ.get('PLANTED', '-') + "
            "'\\n')"]
    command = shlex.join(hook)
    return orjson.dumps({"env": {"PLANTED": value},
                         "hooks": {"SessionStart": [{"matcher": "", "hooks": [{"type": "command",
                                                                                "command": command}]}]}},
                        option=orjson.OPT_INDENT_2).decode()


@needs_claude
@pytest.mark.parametrize("isolation", ["worktree", "none"])
def test_committed_claude_settings_reach_the_run_only_once_trusted(env: Env, cli, fake: FakeAnthropic,
                                                                   tmp_path: Path, isolation: str) -> None:
    if isolation == "none":
        env.write_config(git={"isolation": "none"})
    marker = tmp_path / "hook-ran"
    settings = env.repo / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(settings_with_hook(marker, "from-the-repository"))
    git(env.repo, "add", ".claude/settings.json")
    git(env.repo, "commit", "-q", "-m", "the repository's agent settings")
    env.queue(entry("one", "two"))
    fake.add({"text": report_text("unchanged")}, {"text": report_text("unchanged")})

    dry = cli("fire", "--dry-run", extra_env=cli_env(env, fake))
    plan = orjson.loads(dry.stdout)
    assert plan["agent"]["settings"].startswith("user, local (.claude/settings.json not trusted: left out")
    assert plan["agent"]["argv"][-2:] == ["--setting-sources", "user,local"]
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr[-3000:]
    assert env.ledger()[-1]["result"] == "unchanged" and len(fake.agent_requests) >= 1
    assert not marker.exists()  # neither the hook nor its env reached the run
    warn = [w for w in orjson.loads(cli("status", "--json").stdout)["warnings"] if w.startswith("agent settings")]
    assert warn and ".claude/settings.json not trusted" in warn[0]
    doc = [x for x in orjson.loads(cli("doctor", "--json").stdout) if x["check"] == "agent settings"]
    assert doc and doc[0]["level"] == "WARN"

    assert cli("trust").code == 0
    plan = orjson.loads(cli("fire", "--dry-run", extra_env=cli_env(env, fake)).stdout)
    assert "--setting-sources" not in plan["agent"]["argv"] and plan["agent"]["settings"] == "user, project, local"
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr[-3000:]
    assert marker.read_text().splitlines() == ["from-the-repository"]  # the hook ran, with the file's env
    assert not list(env.repo.joinpath(".git").rglob("index.lock"))


@needs_claude
def test_a_committed_mcp_json_starts_no_server_until_trusted(env: Env, cli, fake: FakeAnthropic, tmp_path: Path
                                                             ) -> None:
    """``claude -p`` starts the servers of a project's ``.mcp.json`` without asking, with the run's environment."""
    marker = tmp_path / "mcp-server-ran"
    server = {"command": sys.executable, "args": ["-c", f"open({str(marker)!r}, 'a').write('ran\\n')"]}
    (env.repo / ".mcp.json").write_bytes(orjson.dumps({"mcpServers": {"planted": server}}))
    git(env.repo, "add", ".mcp.json")
    git(env.repo, "commit", "-q", "-m", "the repository's MCP servers")
    env.queue(entry("one", "two"))
    fake.add({"text": report_text("unchanged")}, {"text": report_text("unchanged")})
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr[-3000:]
    assert not marker.exists()
    assert cli("trust").code == 0
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr[-3000:]
    assert marker.exists()  # what trust lets through does reach the run


@needs_claude
def test_the_operators_untracked_settings_reach_the_worktree_run(env: Env, cli, fake: FakeAnthropic,
                                                                  tmp_path: Path) -> None:
    """What ``evolve setup`` writes (untracked ``.claude/settings.json``) is the operator's: it reaches the agent in
    evolve's worktree (``--settings``), where no copy of it exists."""
    marker = tmp_path / "hook-ran"
    settings = env.repo / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(settings_with_hook(marker, "the-operators"))
    env.queue(entry("one"))
    fake.add({"text": report_text("unchanged")})
    plan = orjson.loads(cli("fire", "--dry-run", extra_env=cli_env(env, fake)).stdout)
    assert plan["agent"]["argv"][-2:] == ["--settings", str(settings)]
    r = cli("fire", "--cycles", "1", extra_env=cli_env(env, fake))
    assert r.code == 0, r.stderr[-3000:]
    assert marker.read_text().splitlines() == ["the-operators"]


# -- the real Codex and Gemini CLIs ------------------------------------------------------------

CODEX = cli_binary("codex", "EVOLVE_TEST_CODEX")
GEMINI = cli_binary("gemini", "EVOLVE_TEST_GEMINI")


def committed(env: Env, rel: str, text: str) -> str:
    path = env.repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(env.repo, "add", "-f", rel)
    git(env.repo, "commit", "-q", "-m", f"the repository's {rel}")
    return git(env.repo, "rev-parse", "HEAD").strip()


def assert_nothing_ran(env: Env, head: str, server_requests: list) -> None:
    assert server_requests == [] and env.ledger() == []
    assert git(env.repo, "rev-parse", "HEAD").strip() == head
    assert live(env.paths.nextwork)[0].get("claim_status") == "available"
    assert_git_sane(env)


@pytest.mark.skipif(CODEX is None, reason="Codex CLI not installed (see README)")
@pytest.mark.parametrize("codex_trusts_it", [True, False])
def test_a_committed_codex_config_refuses_the_runner_where_codex_would_read_it(
        env: Env, cli, tmp_path: Path, codex_trusts_it: bool) -> None:
    with FakeResponses() as server:
        env.write_config(git={"isolation": "none"},  # Codex's sandbox refuses evolve's worktree (the lead's part)
                         agent={"runner": "codex", "argv": [CODEX], "base_url": server.url, "model": "gpt-test",
                                "api_key_env": "EVOLVE_TEST_CODEX_KEY", "timeout_s": 120, "idle_timeout_s": 60})
        codex_home = tmp_path / "codex-home"
        codex_home.mkdir()
        if codex_trusts_it:  # the operator uses Codex in this checkout and trusted it there
            (codex_home / "config.toml").write_text(f'[projects."{env.repo}"]\ntrust_level = "trusted"\n')
        (tmp_path / "home").mkdir()
        extra = {"HOME": str(tmp_path / "home"), "CODEX_HOME": str(codex_home), "EVOLVE_TEST_CODEX_KEY": "sk-x"}
        head = committed(env, ".codex/config.toml", 'developer_instructions = "PLANTED-INSTRUCTIONS"\n')
        env.queue(entry("one", "two"))
        server.add({"text": report_text("unchanged")}, {"text": report_text("unchanged")})
        if codex_trusts_it:
            r = cli("fire", "--cycles", "1", extra_env=extra)
            assert r.code == 78
            assert any("the repository's .codex/config.toml (tracked in git) is not trusted" in e.get("error", "")
                       for e in r.events() if e["event"] == "preflight.failed")
            assert_nothing_ran(env, head, server.agent_requests)
            doc = [x for x in orjson.loads(cli("doctor", "--json", extra_env=extra).stdout)
                   if x["check"] == "agent settings"]
            assert doc[0]["level"] == "FAIL"
            assert cli("trust").code == 0
        r = cli("fire", "--cycles", "1", extra_env=extra)
        assert r.code == 0, r.stderr[-3000:]
        sent = orjson.dumps(server.agent_requests[0]).decode()
        # Trusted (by evolve, then by Codex): the CLI applied it; not trusted by Codex: the CLI left it out.
        assert ("PLANTED-INSTRUCTIONS" in sent) is codex_trusts_it


@pytest.mark.skipif(GEMINI is None, reason="Gemini CLI not installed (see README)")
def test_a_committed_env_file_refuses_the_gemini_runner_until_trusted(env: Env, cli, tmp_path: Path) -> None:
    """Gemini under --skip-trust reads the project's .env into its environment (a base URL, a key, a model)."""
    with FakeGemini() as server:
        env.write_config(agent={"runner": "gemini", "argv": [GEMINI], "base_url": server.url, "model": "",
                                "timeout_s": 120, "idle_timeout_s": 60})
        home = tmp_path / "home"
        (home / ".gemini").mkdir(parents=True)
        (home / ".gemini" / "settings.json").write_bytes(orjson.dumps(
            {"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"maxAttempts": 1},
             "privacy": {"usageStatisticsEnabled": False}}))
        extra = {"HOME": str(home), "GEMINI_API_KEY": "gm-dummy-test-key"}
        head = committed(env, ".env", "GEMINI_MODEL=gemini-planted-by-the-repository\n")
        env.queue(entry("one"))
        server.add({"text": report_text("unchanged")})
        r = cli("fire", "--cycles", "1", extra_env=extra)
        assert r.code == 78
        assert any("the repository's .env (tracked in git) is not trusted" in e.get("error", "")
                   for e in r.events() if e["event"] == "preflight.failed")
        assert_nothing_ran(env, head, server.requests)
        shown = cli("trust", "--show")
        assert "! env GEMINI_MODEL" in shown.stdout and "gemini-planted" not in shown.stdout  # names, not values
        assert cli("trust").code == 0
        r = cli("fire", "--cycles", "1", extra_env=extra)
        assert r.code == 0, r.stderr[-3000:]
        assert any("gemini-planted-by-the-repository" in q["path"] for q in server.requests)  # it did reach the CLI
