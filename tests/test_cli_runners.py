"""The Codex and Gemini runners' pure parts as tables, and their setup and doctor checks (issue 18).

The parsers take the lines the real CLIs printed (tests/test_codex_runner.py and
tests/test_gemini_runner.py drive the CLIs themselves); the session-store readers take files in
the layout the CLIs write; setup and doctor run as real ``evolve`` processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from cli_support import cli_binary
from support import Env

from evolve.agent import codex, gemini
from evolve.agent.report import Usage


@pytest.mark.parametrize(("text", "want"), [
    ("unexpected status 401 Unauthorized: Incorrect API key provided, url: http://x/v1/responses", ("fatal", False)),
    ("exceeded retry limit, last status: 429 Too Many Requests", ("limit", False)),
    ("We're currently experiencing high demand, which may cause temporary errors.", ("transient", False)),
    ("Your input exceeds the context window of this model", ("transient", True)),
    ("stream disconnected before completion", ("transient", False)),
])
def test_codex_error_classes(text: str, want: tuple[str, bool]) -> None:
    assert codex.classify(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ('[API Error: {"error":{"code":400,"message":"API key not valid. Please pass a valid API key."}}]',
     ("fatal", False)),
    ('[API Error: {"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}]',
     ("limit", False)),
    ('[API Error: {"error":{"code":500,"message":"scripted error","status":"INTERNAL"}}]', ("transient", False)),
    ("The input token count (1200000) exceeds the maximum number of tokens allowed", ("transient", True)),
])
def test_gemini_error_classes(text: str, want: tuple[str, bool]) -> None:
    assert gemini.classify(text) == want


CODEX_STREAM = [
    {"type": "thread.started", "thread_id": "01a23005-f5dd-75f2-ab19-5252f9e15d88"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata not found"}},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "aggregated_output": "ok"}},
    {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "first"}},
    {"type": "item.completed", "item": {"id": "i3", "type": "agent_message", "text": "final answer"}},
    {"type": "turn.completed", "usage": {"input_tokens": 3600, "output_tokens": 120}},
]


def test_codex_stream_takes_the_thread_id_the_last_message_and_treats_error_items_as_warnings() -> None:
    state = codex.CodexState()
    data = b"".join(orjson.dumps(m) + b"\n" for m in CODEX_STREAM)
    for i in range(0, len(data), 7):  # chunks cut anywhere, as a pipe delivers them
        state.feed(data[i:i + 7])
    state.feed(b'{"type": "turn.comp')  # a torn last line (the process killed mid-write)
    state.finish()
    assert state.session_id == "01a23005-f5dd-75f2-ab19-5252f9e15d88"
    assert state.messages[-1] == "final answer" and state.completed and state.errors == []
    assert state.warnings == ["Model metadata not found"] and state.malformed == 1 and state.turns == 3


def test_codex_sandbox_refusal_is_seen_in_a_command_output() -> None:
    state = codex.CodexState()
    out = "error building bubblewrap command: Fatal error: cannot enforce sandbox read-only path /w/.agents"
    state.line(orjson.dumps({"type": "item.completed", "item": {"type": "command_execution",
                                                                "aggregated_output": out}}))
    assert state.sandbox_errors and "bubblewrap" in state.sandbox_errors[0]


def _token_count(last_in: int, total_in: int, window: int) -> dict:
    return {"type": "event_msg", "payload": {"type": "token_count", "info": {
        "total_token_usage": {"input_tokens": total_in, "output_tokens": 1},
        "last_token_usage": {"input_tokens": last_in, "output_tokens": 1}, "model_context_window": window}}}


def test_codex_rollout_gives_the_last_request_of_this_run_never_the_running_total(tmp_path: Path) -> None:
    home = tmp_path / "codex"
    tid = "01a23005-9fff-7041-8415-2bc78dc5855d"
    path = home / "sessions" / "2026" / "12" / "01" / f"rollout-2026-12-01T05-13-10-{tid}.jsonl"
    path.parent.mkdir(parents=True)
    first_run = orjson.dumps(_token_count(1000, 1000, 258400)) + b"\n"
    path.write_bytes(first_run + b"\n".join(orjson.dumps(r) for r in (
        {"type": "compacted", "payload": {"message": "summary"}}, _token_count(700, 1700, 258400))) + b"\n")
    assert codex.rollout_file(home, tid) == path
    assert codex.rollout_file(home, "../etc") is None and codex.rollout_file(home, "other") is None
    whole = codex.read_rollout(path)
    assert (whole.usage.input_tokens, whole.window, whole.compactions) == (700, 258400, 1)
    # A resumed run reads only what it appended: the compaction before it is not this run's.
    assert codex.read_rollout(path, len(first_run)).compactions == 1
    assert codex.read_rollout(path, path.stat().st_size) == codex.RolloutReading(Usage(), 0, 0)


GEMINI_STREAM = [
    {"type": "init", "session_id": "545dc211-e5fd-4cb6-b0dc-f5be5e13b224", "model": "gemini-2.5-pro"},
    {"type": "message", "role": "user", "content": "do it"},
    {"type": "message", "role": "assistant", "content": "Let me write it.", "delta": True},
    {"type": "tool_use", "tool_name": "write_file", "tool_id": "t1", "parameters": {}},
    {"type": "tool_result", "tool_id": "t1", "status": "success"},
    {"type": "message", "role": "assistant", "content": "All ", "delta": True},
    {"type": "message", "role": "assistant", "content": "done.", "delta": True},
    {"type": "result", "status": "success", "stats": {"input_tokens": 3600}},
]


def test_gemini_stream_final_answer_is_what_follows_the_last_tool_call() -> None:
    state = gemini.GeminiState()
    state.feed(b"".join(orjson.dumps(m) + b"\n" for m in GEMINI_STREAM) + b"not json\n")
    state.finish()
    assert state.session_id == "545dc211-e5fd-4cb6-b0dc-f5be5e13b224" and state.model == "gemini-2.5-pro"
    assert state.final_text == "All done." and state.turns == 1 and state.result["status"] == "success"
    assert state.malformed == 1


def test_gemini_chat_file_is_found_by_id_and_read_from_this_runs_offset(tmp_path: Path) -> None:
    home = tmp_path / ".gemini"
    sid = "545dc211-e5fd-4cb6-b0dc-f5be5e13b224"
    chats = home / "tmp" / "worktree" / "chats"
    chats.mkdir(parents=True)
    decoy = chats / "session-2026-12-01T05-13-545dc211.jsonl"  # same 8-char prefix, another session
    decoy.write_bytes(orjson.dumps({"sessionId": "545dc211-0000-0000-0000-000000000000"}) + b"\n")
    path = chats / "session-2026-12-01T05-14-545dc211.jsonl"
    head = orjson.dumps({"sessionId": sid}) + b"\n" + orjson.dumps(
        {"type": "gemini", "tokens": {"input": 300000, "output": 5}}) + b"\n"
    path.write_bytes(head + orjson.dumps({"type": "gemini", "tokens": {"input": 450000, "output": 50}}) + b"\n")
    assert gemini.chat_file(home, sid) == path and gemini.chat_file(home, "short") is None
    assert gemini.last_request(path).input_tokens == 450000
    assert gemini.last_request(path, path.stat().st_size) == Usage()


# -- setup and doctor (real processes) ----------------------------------------------------------


def _runner(env: Env, runner: str, **agent: object) -> dict[str, str]:
    env.write_config(agent={"runner": runner, "argv": [runner], **agent})
    (env.root / "home").mkdir(exist_ok=True)
    return {"HOME": str(env.root / "home")}


def test_setup_writes_gemini_compression_threshold_into_the_user_settings_keeping_other_keys(env: Env, cli) -> None:
    extra = _runner(env, "gemini")
    path = env.root / "home" / ".gemini" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    r = cli("setup", "--autocompact-pct", "35", extra_env=extra)
    assert r.code == 0, r.stderr
    assert json.loads(path.read_text()) == {"security": {"auth": {"selectedType": "gemini-api-key"}},
                                            "model": {"compressionThreshold": 0.35}}
    assert "set model.compressionThreshold = 0.35" in r.stdout
    assert not (env.repo / ".claude" / "settings.json").exists()  # Claude's file is not this runner's
    r = cli("setup", "--yes", extra_env=extra)  # a valid value is kept without a flag
    assert "(kept)" in r.stdout and json.loads(path.read_text())["model"]["compressionThreshold"] == 0.35


def test_setup_refuses_malformed_gemini_settings_and_leaves_them_byte_identical(env: Env, cli) -> None:
    extra = _runner(env, "gemini")
    path = env.root / "home" / ".gemini" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"model": [1, 2]}')
    r = cli("setup", "--autocompact-pct", "40", extra_env=extra)
    assert r.code == 2 and "must be JSON objects" in r.stderr
    assert path.read_bytes() == b'{"model": [1, 2]}'


def test_setup_reports_the_codex_limit_it_passes_from_the_context_window(env: Env, cli) -> None:
    extra = _runner(env, "codex")
    env.write_config(context={"context_window": 200_000, "autocompact_pct": 40})
    r = cli("setup", "--yes", extra_env=extra)
    assert r.code == 0 and "-c model_auto_compact_token_limit=80000" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("runner", ["codex", "gemini"])
def test_doctor_checks_the_cli_runner_preflight(env: Env, cli, runner: str) -> None:
    binary = cli_binary(runner, f"EVOLVE_TEST_{runner.upper()}")
    if binary is None:
        pytest.skip(f"{runner} CLI not installed: no .tools/node_modules/.bin/{runner}")
    extra = _runner(env, runner, argv=[binary])
    r = cli("doctor", "--json", extra_env=extra)
    found = {f["check"]: f for f in json.loads(r.stdout)}
    assert found["agent"]["level"] == "OK" and runner in found["agent"]["message"].lower() + binary
    assert found["agent config"]["level"] == "FAIL" and r.code == 1  # no provider config, no auth type
    assert "usage statistics on" in found["agent telemetry"]["message"]
    if runner == "codex":
        (env.root / "home" / ".codex").mkdir(exist_ok=True)
        (env.root / "home" / ".codex" / "config.toml").write_text("[analytics]\nenabled = false\n")
        env.write_config(git={"isolation": "none"})
    else:
        (env.root / "home" / ".gemini").mkdir(exist_ok=True)
        (env.root / "home" / ".gemini" / "settings.json").write_text(json.dumps({
            "security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False}}))
    found = {f["check"]: f for f in json.loads(cli("doctor", "--json", extra_env=extra).stdout)}
    assert found["agent config"]["level"] == "OK", found["agent config"]
    assert "edits allowed" in found["agent config"]["message"]
    assert found["agent telemetry"]["message"] == f"{runner} usage statistics off"



def test_the_preflight_checks_each_clis_own_config_once_its_binary_is_found(tmp_path: Path) -> None:
    """What every fire, ``status`` and ``doctor`` check before any work is claimed (no process started)."""
    from types import SimpleNamespace

    from evolve.agent import preflight

    def agent(runner: str, argv0: Path, **kw: str) -> SimpleNamespace:
        return SimpleNamespace(**{"runner": runner, "argv": [str(argv0)], "base_url": "", "permission_mode": "",
                                  "api_key_env": "OPENAI_API_KEY", **kw})

    binary = tmp_path / "cli"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    codex_home, gemini_home = tmp_path / "codex-home", tmp_path / "home"
    env = {"PATH": "", "CODEX_HOME": str(codex_home), "HOME": str(gemini_home)}
    (p,) = preflight.check(agent("codex", tmp_path / "none"), env)[0]
    assert "not found" in p.message and "@openai/codex" in p.fix  # the binary first
    for a, worktree, want in [
        (agent("codex", binary), False, "no provider config"),
        (agent("codex", binary, base_url="http://127.0.0.1:1/v1"), False, "$OPENAI_API_KEY is not set"),
        (agent("codex", binary, permission_mode="read-only"), False, "change nothing"),
        (agent("codex", binary, permission_mode="danger-full-access"), True, "no provider config"),
        (agent("codex", binary), True, "no provider config"),  # the worktree is fine for its sandbox (issue 23)
        (agent("gemini", binary), False, "no auth method"),
        (agent("gemini", binary, permission_mode="plan"), False, "read-only"),
    ]:
        (p,) = preflight.check(a, env, worktree=worktree)[0]
        assert want in p.message and p.fix, (a, p)
    codex_home.mkdir()
    (codex_home / "config.toml").write_text('model_provider = "x"\n')
    (gemini_home / ".gemini").mkdir(parents=True)
    (gemini_home / ".gemini" / "settings.json").write_text('{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
    assert preflight.check(agent("codex", binary), env) == ([], str(binary))
    assert preflight.check(agent("gemini", binary, permission_mode="yolo"), env) == ([], str(binary))
    assert preflight.check(agent("codex", binary, base_url="http://x/v1"), {**env, "OPENAI_API_KEY": "k"})[0] == []
