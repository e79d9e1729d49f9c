"""Issue 16 items 1-4: status, notifications, metrics and the report say what actually happened.

Real fires on real git repositories with real command agents (tests/support.py).
"""

from __future__ import annotations

import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
from support import CliResult, Env, entry, git, improved_step, results

DOCS = Path(__file__).resolve().parent.parent / "docs" / "AGENTS.md"


def _doc_agent(env: Env) -> Path:
    """The ten-line example agent of docs/AGENTS.md, exactly as documented."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## A complete agent in ten lines", 1)[1]
    code = re.search(r"```python\n(.*?)```\n", section, re.S)
    assert code is not None
    lines = code.group(1).splitlines()
    assert len(lines) == 10  # the docs promise ten lines
    script = env.root / "agent.py"
    script.write_text("\n".join([f"#!{sys.executable}", *lines[1:]]) + "\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _assert_git_clean(env: Env) -> None:
    assert not (env.repo / ".git" / "index.lock").exists()
    for e in env.ledger():
        if e.get("result") == "improved" and e.get("sha"):
            assert git(env.repo, "cat-file", "-t", e["sha"]).strip() == "commit"


# -- item 3: the command-runner contract -------------------------------------------------------


def test_documented_example_agent_reporting_on_stdout_lands_its_work(env: Env, cli: Callable[..., CliResult]) -> None:
    script = _doc_agent(env)
    env.write_config(agent={"argv": [str(script)], "pass_env": []})
    env.queue(entry("add a note"))
    dry = cli("fire", "--dry-run")
    plan = orjson.loads(dry.stdout[dry.stdout.index("{\n") :])
    assert "[Report hand-back]" in plan["agent"]["prompt"]  # the dry run shows the prompt file as written
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert results(ledger) == ["improved"], ledger
    assert ledger[-1]["summary"] == "noted 'add a note'"
    assert (env.repo / "NOTES.md").read_text() == "- add a note\n"
    assert git(env.repo, "log", "-1", "--format=%H").strip() == ledger[-1]["sha"]
    _assert_git_clean(env)


# -- item 2: why a cycle went red is kept ------------------------------------------------------

APP = "def add(a, b):\n    return a + b\n"
TESTS = "from app import add\n\n\ndef test_add():\n    assert add(2, 3) == 5, 'add is broken'\n"
PYTEST = [sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_app.py"]
SECRET = "sk-ant-api03-" + "k" * 40
BREAK = {
    "write": [{"path": "app.py", "content": "def add(a, b):\n    return a - b\n"}],
    "report": {"result": "improved"},
}


def _project(env: Env, gate: list[list[str]]) -> str:
    (env.repo / "app.py").write_text(APP)
    (env.repo / "test_app.py").write_text(TESTS)
    git(env.repo, "add", "app.py", "test_app.py")
    git(env.repo, "commit", "-q", "-m", "app")
    env.write_config(gate={"commands": gate, "timeout_s": 60})
    return git(env.repo, "rev-parse", "HEAD").strip()


def test_a_red_gate_keeps_the_failing_command_and_its_output_tail(env: Env, cli: Callable[..., CliResult]) -> None:
    # The second gate command prints a secret of the fire's environment, then fails: it is masked everywhere.
    leak = [sys.executable, "-c", f"print('token {SECRET}'); print('pytest said no'); raise SystemExit(3)"]
    start = _project(env, [[sys.executable, "-c", "print('lint ok')"], leak])
    (env.repo / "README.md").write_text("# operator's unsaved edit\n")
    env.queue(entry("speed up add"))
    env.steps([BREAK, improved_step()])
    r = cli("fire", "--cycles", "1", extra_env={"ANTHROPIC_API_KEY": SECRET})
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "regressed"
    # gate_detail names the command that failed (not just "python"), and the output's tail is kept.
    assert e["gate_detail"].startswith(sys.executable) and e["gate_detail"].endswith(": exit 3"), e
    assert " -c " in e["gate_detail"] and SECRET not in e["gate_detail"]
    assert "pytest said no" in e["gate_output"] and SECRET not in e["gate_output"]
    run_log = Path(e["run_log"])
    assert run_log == env.paths.runs_dir / f"cycle-{e['cycle']}.log"
    assert stat.S_IMODE(run_log.stat().st_mode) == 0o600  # a run log, like the agent's own output
    log_text = run_log.read_text()
    assert "--- evolve gate:" in log_text and "pytest said no" in log_text and SECRET not in log_text
    assert SECRET not in env.paths.ledger.read_text()
    # history, status (text and JSON) show it.
    h = cli("history")
    assert "gate: " in h.stdout and "| pytest said no" in h.stdout and SECRET not in h.stdout
    s = cli("status")
    assert "last red   #1" in s.stdout and "| pytest said no" in s.stdout and str(run_log) in s.stdout
    js = cli("status", "--json")
    red = orjson.loads(js.stdout)["last_red"]
    assert red["cycle"] == e["cycle"] and red["gate_detail"] == e["gate_detail"]
    assert git(env.repo, "rev-parse", "HEAD").strip() == start and (env.repo / "app.py").read_text() == APP
    assert (env.repo / "README.md").read_text() == "# operator's unsaved edit\n"  # never reverted or committed
    assert git(env.repo, "status", "--porcelain").strip() == "M README.md"
    _assert_git_clean(env)


def test_the_next_attempt_at_the_item_is_told_why_the_last_was_reverted(
    env: Env, cli: Callable[..., CliResult]
) -> None:
    _project(env, [PYTEST])
    env.queue(entry("speed up add"))
    env.steps([BREAK, improved_step()])
    assert cli("fire", "--cycles", "2").code == 0
    ledger = env.ledger()
    assert results(ledger) == ["regressed", "improved"], ledger
    first, second = (c["prompt"] for c in env.calls())
    assert "your last attempt was reverted because" not in first
    assert "your last attempt was reverted because: cycle 1 (regressed):" in second
    assert "-m pytest" in second and "add is broken" in second  # the command and pytest's own words
    _assert_git_clean(env)


def test_a_regressed_goal_keeps_its_check_output(env: Env, cli: Callable[..., CliResult]) -> None:
    (env.repo / "app.py").write_text(APP)
    (env.repo / "GOALS.yaml").write_text(
        "version: 3\nmission: m\ngoals:\n  - id: app-adds\n    description: add adds\n"
        "    check: \"grep -q 'a + b' app.py || { echo 'app.py lost a + b'; exit 1; }\"\n    weight: 5\n"
    )
    git(env.repo, "add", "app.py", "GOALS.yaml")
    git(env.repo, "commit", "-q", "-m", "goals")
    env.queue(entry("refactor add"))
    env.steps([BREAK])
    assert cli("fire", "--cycles", "1").code == 0
    e = env.ledger()[-1]
    assert e["result"] == "regressed" and e["gate_detail"] == "goal regressed: app-adds", e
    assert "app.py lost a + b" in e["gate_output"]
    assert "goal app-adds: fail" in Path(e["run_log"]).read_text()
    assert (env.repo / "app.py").read_text() == APP
    _assert_git_clean(env)


def test_output_tail_and_excerpt_are_bounded_tails() -> None:
    from evolve.cycle.gate import EXCERPT_CHARS, command_label, excerpt, output_tail

    text = "".join(f"line {i}\r\n" for i in range(100)) + "\x1b[31mred\x1b[0m\n"
    tail = output_tail(text, lines=3, cap=1000)
    assert tail == "line 98\nline 99\n[31mred[0m"  # control characters dropped, CRLF folded
    assert output_tail("x" * 50, lines=5, cap=10) == "…" + "x" * 9
    assert excerpt("   \n") == "" and len(excerpt("y" * 5000)) == EXCERPT_CHARS
    assert command_label(["python", "-c", "print('a b')"]) == "python -c 'print('\"'\"'a b'\"'\"')'"
    assert command_label(["x" * 500]).endswith("…") and len(command_label(["x" * 500])) == 160


def test_last_attempt_note_table() -> None:
    from evolve.cycle.entry import last_attempt_note

    red = {
        "work_ref": "r1",
        "cycle": 4,
        "result": "regressed",
        "gate_detail": "pytest: exit 1",
        "gate_output": "E boom",
    }
    failed = {"work_ref": "r1", "cycle": 5, "result": "failed", "error_class": "timeout", "error": "agent hard timeout"}
    good = {"work_ref": "r1", "cycle": 6, "result": "improved"}
    other = {"work_ref": "r2", "cycle": 7, "result": "regressed", "gate_detail": "other"}
    rows = [
        ([], ""),
        ([red], "cycle 4 (regressed): pytest: exit 1\noutput tail:\nE boom"),
        ([red, other], "cycle 4 (regressed): pytest: exit 1\noutput tail:\nE boom"),
        ([red, failed], "cycle 5 (failed): agent hard timeout"),
        ([red, good], ""),  # once it landed, an older red is no longer news
        ([other], ""),
    ]
    for entries, want in rows:
        assert last_attempt_note(entries, "r1") == want, entries


# -- item 4: infrastructure failures are not the work item's fault -----------------------------


def _notifier(env: Env) -> Path:
    """A real notify command that appends each event (JSON on stdin) to a file."""
    out = env.root / "events.jsonl"
    script = env.root / "notify.py"
    script.write_text(f"import sys\nopen({str(out)!r}, 'a').write(sys.stdin.read().strip() + '\\n')\n")
    env.write_config(notify={"command": [sys.executable, str(script)], "timeout_s": 30})
    return out


def _events(path: Path) -> list[dict]:
    return [orjson.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _queue_item(env: Env) -> dict:
    items = [it for line in env.paths.nextwork.read_text().splitlines() for it in orjson.loads(line)["items"]]
    assert len(items) == 1
    return items[0]


def test_a_missing_agent_binary_exits_78_before_claiming_and_charges_nothing(
    env: Env, cli: Callable[..., CliResult]
) -> None:
    events = _notifier(env)
    env.write_config(agent={"argv": [str(env.root / "no-such-agent")]})
    env.queue(entry("fix the thing"))
    for _ in range(4):  # more fires than the attempt budget and the breaker's count
        r = cli("fire")
        assert r.code == 78, (r.code, r.stderr)
        assert "preflight.failed" in r.names()
    assert env.ledger() == []  # no cycle ran, so none was charged
    state = env.state() if env.paths.state.exists() else {}
    assert not state.get("attempts") and not state.get("consecutive_failures")
    assert state.get("breaker_open_until") is None and not state.get("parked_items")
    item = _queue_item(env)
    assert item.get("claim_status") in (None, "available") and "status" not in item  # neither claimed nor parked
    assert [e["event"] for e in _events(events)] == ["preflight.failed"] * 4
    s = cli("status")
    assert s.code == 1 and "agent preflight fails" in s.stdout and "no-such-agent" in s.stdout
    # doctor says the same thing, from the same check.
    d = cli("doctor")
    assert d.code == 1 and "no-such-agent" in d.stdout and "not found on PATH" in d.stdout
    _assert_git_clean(env)


def test_an_empty_base_url_exits_78(env: Env, cli: Callable[..., CliResult]) -> None:
    env.write_config(agent={"runner": "http", "base_url": ""})
    env.queue(entry("fix the thing"))
    r = cli("fire")
    assert r.code == 78 and env.ledger() == []
    assert any(e["event"] == "preflight.failed" and "base_url" in e["error"] for e in r.events())


def test_http_401_opens_the_breaker_without_charging_the_item_and_breaker_reset_closes_it(
    env: Env, fire_inproc: Callable[..., object], cli: Callable[..., CliResult]
) -> None:
    from fake_openai import FakeOpenAI, Scripted

    env.queue(entry("fix the thing"))
    with FakeOpenAI() as server:
        env.write_config(agent={"runner": "http", "base_url": server.url, "model": "m"})
        server.push(Scripted(401, {"error": "bad key"}))
        out = fire_inproc(cycles=3, extra_env={"OPENAI_API_KEY": "k-test"})
    assert out.exit_code == 1 and out.reason == "agent_fatal"
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "fatal")
    state = env.state()
    assert state["attempts"] == {}  # the item is not charged
    assert state["breaker_open_until"] is not None  # opened at once, on the first infrastructure failure
    assert _queue_item(env).get("claim_status") in (None, "available")
    s = cli("status")
    assert s.code == 1 and "breaker open" in s.stdout and "`evolve breaker reset`" in s.stdout
    r = cli("fire")
    assert r.code == 0 and len(env.ledger()) == 1  # halted by the open breaker: no new cycle
    reset = cli("breaker", "reset")
    assert reset.code == 0 and "breaker closed" in reset.stdout, reset.stderr
    state = env.state()
    assert state["breaker_open_until"] is None and state["consecutive_failures"] == 0
    s = cli("status")
    assert "breaker open" not in s.stdout and "breaker    closed" in s.stdout
    _assert_git_clean(env)


FAILING_AGENT = (
    "import json, os\n"
    "json.dump({'result': 'failed', 'error_class': 'transient', 'error': 'cannot do it'},"
    " open(os.environ['EVOLVE_REPORT_FILE'], 'w'))\n"
)


def test_requeue_puts_a_parked_item_back(env: Env, cli: Callable[..., CliResult]) -> None:
    agent = env.root / "failing.py"
    agent.write_text(FAILING_AGENT)
    env.write_config(agent={"argv": [sys.executable, str(agent)]}, breaker={"max_consecutive_failures": 10})
    env.queue(entry("fix the thing"))
    assert cli("fire", "--cycles", "3").code == 0
    assert results(env.ledger()) == ["failed"] * 3
    ref = env.ledger()[-1]["work_ref"]
    assert _queue_item(env)["status"] == "blocked" and env.state()["parked_items"] == [ref]
    s = cli("status")
    assert "1 item(s) parked after failed attempts" in s.stdout and f"{ref}" in s.stdout
    assert "`evolve requeue REF`" in s.stdout
    r = cli("fire")
    assert r.code == 0 and results(env.ledger())[-1] == "unchanged"  # nothing selectable: idle
    # A running fire holds the lock: requeue waits for nobody and says so (exit 75).
    from evolve.store.lock import FireLock

    lock = FireLock(env.paths.lock)
    assert lock.acquire()
    try:
        busy = cli("requeue", ref)
        assert busy.code == 75 and "a fire is running" in busy.stderr
    finally:
        lock.release()
    assert cli("requeue", "no-such-ref").code == 1
    ok = cli("requeue", ref)
    assert ok.code == 0 and "unblocked in the queue" in ok.stdout, ok.stderr
    assert "status" not in _queue_item(env) and env.state()["parked_items"] == []
    assert "parked after failed attempts" not in cli("status").stdout
    env.steps([improved_step()])  # the agent fixed, the item lands
    env.write_config(agent={"argv": [sys.executable, "-m", "evolve.agent.scripted", "--script", str(env.script)]})
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["result"] == "improved" and env.ledger()[-1]["work_ref"] == ref
    _assert_git_clean(env)


# -- item 1: a stall is never HEALTHY ------------------------------------------------------------


def _metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + "{") or ln.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


def test_six_different_items_of_one_type_in_a_row_are_worked_not_blocked(
    env: Env, cli: Callable[..., CliResult]
) -> None:
    env.queue(entry("alpha", "beta", "gamma", "delta", "epsilon", "zeta"))  # all type "task"
    env.steps([improved_step()], loop=True)
    r = cli("fire", "--cycles", "6")
    assert r.code == 0, r.stderr
    ledger = env.ledger()
    assert results(ledger) == ["improved"] * 6, [(e["result"], e["selected_source"]) for e in ledger]
    assert "metronome.blocked" not in r.names()
    assert cli("status").code == 0
    _assert_git_clean(env)


def _thrash(env: Env, n: int = 5) -> None:
    """``n`` productive cycles on the same work coming back ("retry the flaky test 1", "... 2", ...)."""
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "cycle": i + 1,
            "result": "improved",
            "mode": "harvested:task",
            "target": f"retry the flaky test {i + 1}",
            "selected_source": "harvested",
            "timestamp": f"2026-11-01T00:0{i}:00Z",
        }
        for i in range(n)
    ]
    env.paths.ledger.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    env.queue(entry(f"retry the flaky test {n + 1}"))


def test_a_metronome_stall_is_degraded_notified_once_and_measured_until_rescope(
    env: Env, cli: Callable[..., CliResult]
) -> None:
    events = _notifier(env)
    _thrash(env)
    assert cli("status").code == 0  # not stalled yet: the block happens at the next fire
    for _ in range(2):
        r = cli("fire")
        assert r.code == 0 and "metronome.blocked" in r.names()
    blocked = env.ledger()[-2:]
    assert [e["selected_source"] for e in blocked] == ["metronome-gate-blocked"] * 2
    assert blocked[-1]["remedy"] == "write .agents/evolve/RESCOPE with the new direction"
    # Notified when the stall starts, not on every blocked fire.
    assert [e["event"] for e in _events(events)] == ["metronome.blocked"]
    assert _events(events)[0]["mode"] == "harvested:task~retry the flaky test"
    s = cli("status")
    assert s.code == 1 and "DEGRADED" in s.stdout, s.stdout
    assert "metronome blocked since cycle 6" in s.stdout and "write .agents/evolve/RESCOPE" in s.stdout
    js = orjson.loads(cli("status", "--json").stdout)
    assert js["health"] == "degraded" and js["metronome_blocked"]["cycle"] == 6
    assert js["metronome_blocked"]["blocked_fires"] == 2
    h = cli("history")
    assert h.stdout.count("[metronome block: write .agents/evolve/RESCOPE with the new direction]") == 2
    m = cli("metrics")
    assert _metric(m.stdout, "evolve_metronome_blocked") == 1 and _metric(m.stdout, "evolve_status_health") == 1
    # The remedy works: with RESCOPE written the stall is lifted and the next fire takes the directive.
    env.paths.rescope.write_text("Quarantine the flaky test and open an issue instead\n")
    s = cli("status")
    assert s.code == 0 and "metronome blocked" not in s.stdout
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["selected_source"] == "directive"
    assert _metric(cli("metrics").stdout, "evolve_metronome_blocked") == 0
    assert cli("status").code == 0
    _assert_git_clean(env)
