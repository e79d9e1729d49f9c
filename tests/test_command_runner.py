"""The command runner with real child processes: substitution, env, reports, failures."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from evolve.agent.command import CommandRunner, substitute
from evolve.agent.invocation import Invocation
from evolve.agent.prompt import Orientation
from evolve.config import AgentConfig
from evolve.work.item import WorkItem

WORK = WorkItem(source="harvested", ref="r1", title="t; $(echo hi)", type="bug")


def _inv(tmp_path: Path, **kw) -> Invocation:
    args = {"repo": tmp_path, "run_dir": tmp_path / "runs", "cycle": 7, "mode": "first", "session_id": "sid-1",
            "resume": False, "work": WORK,
            "orientation": Orientation(static="STATIC", dynamic="DYNAMIC", task="PROMPT TEXT")}
    args.update(kw)
    return Invocation(**args)


def _agent(tmp_path: Path, code: str) -> list[str]:
    script = tmp_path / "agent.py"
    script.write_text(code)
    return [sys.executable, str(script)]


def test_substitution_is_per_element_and_single_pass() -> None:
    values = {"prompt_file": "/p {cycle}", "report_file": "/r", "session_id": "s", "mode": "m",
              "work_json": "{}", "cycle": "3"}
    assert substitute(["a", "{prompt_file}", "--x={cycle}-{mode}", "{unknown}", "{{cycle}}"], values) == [
        "a", "/p {cycle}", "--x=3-m", "{unknown}", "{3}"]


ECHO_AGENT = """
import json, os, sys
env = {k: v for k, v in os.environ.items() if k.startswith("EVOLVE_")}
prompt = open(os.environ["EVOLVE_PROMPT_FILE"]).read()
seen = {"argv": sys.argv[1:], "env": env, "prompt": prompt, "cwd": os.getcwd(),
        "claudecode": os.environ.get("CLAUDECODE")}
json.dump({"result": "improved", "summary": json.dumps(seen),
           "usage": {"input_tokens": 10, "output_tokens": 2}, "cost_usd": 0.5, "num_turns": 3,
           "session_id": "agent-sid"}, open(os.environ["EVOLVE_REPORT_FILE"], "w"))
"""


def test_env_prompt_and_report_round_trip(tmp_path: Path) -> None:
    argv = [*_agent(tmp_path, ECHO_AGENT), "{mode}", "{session_id}", "{work_json}"]
    runner = CommandRunner(AgentConfig(runner="command", argv=argv), base_env={"PATH": "/usr/bin:/bin",
                                                                                "CLAUDECODE": "1"})
    report = runner.run(_inv(tmp_path))
    assert report.result == "improved" and report.session_id == "agent-sid"
    assert report.cost_usd == 0.5 and report.num_turns == 3 and report.usage.input_tokens == 10
    seen = orjson.loads(report.summary)
    assert seen["argv"][:2] == ["first", "sid-1"]
    assert orjson.loads(seen["argv"][2])["title"] == "t; $(echo hi)"
    assert seen["prompt"].startswith("STATIC\nDYNAMIC\nPROMPT TEXT\n")
    assert "$EVOLVE_REPORT_FILE" in seen["prompt"] and "evolve-report block" in seen["prompt"]
    assert seen["cwd"] == str(tmp_path)
    assert seen["claudecode"] is None
    env = seen["env"]
    assert env["EVOLVE_CYCLE"] == "7" and env["EVOLVE_MODE"] == "first" and env["EVOLVE_SESSION_ID"] == "sid-1"
    assert env["EVOLVE_REPO"] == str(tmp_path)
    assert env["EVOLVE_REPORT_FILE"].endswith("cycle-7.report.json")


def test_missing_report_is_failed_crashed(tmp_path: Path) -> None:
    runner = CommandRunner(AgentConfig(argv=_agent(tmp_path, "print('no report')")), base_env={})
    r = runner.run(_inv(tmp_path))
    assert (r.result, r.error_class) == ("failed", "crashed") and "no report" in r.error


def test_unparsable_report_is_failed(tmp_path: Path) -> None:
    code = "import os; open(os.environ['EVOLVE_REPORT_FILE'], 'w').write('{not json')"
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(_inv(tmp_path))
    assert (r.result, r.error_class) == ("failed", "crashed")


def test_invalid_result_is_failed(tmp_path: Path) -> None:
    code = "import os, json; json.dump({'result': 'awesome'}, open(os.environ['EVOLVE_REPORT_FILE'], 'w'))"
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(_inv(tmp_path))
    assert r.result == "failed" and "awesome" in r.error


def test_nonzero_exit_is_failed_even_with_a_report(tmp_path: Path) -> None:
    code = ("import os, json, sys; json.dump({'result': 'improved'}, open(os.environ['EVOLVE_REPORT_FILE'], 'w'));"
            "print('boom'); sys.exit(4)")
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(_inv(tmp_path))
    assert r.result == "failed" and r.exit_code == 4 and "boom" in r.error


def test_missing_binary_is_fatal(tmp_path: Path) -> None:
    r = CommandRunner(AgentConfig(argv=[str(tmp_path / "nope")]), base_env={}).run(_inv(tmp_path))
    assert (r.result, r.error_class) == ("failed", "fatal")


def test_stale_report_from_an_earlier_run_is_not_reused(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    inv.run_dir.mkdir(parents=True)
    inv.report_file.write_text('{"result": "improved"}')
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, "pass")), base_env={}).run(inv)
    assert r.result == "failed"


def test_output_is_logged_per_cycle(tmp_path: Path) -> None:
    code = ("import os; print('hello from the agent');"
            "open(os.environ['EVOLVE_REPORT_FILE'], 'w').write('{\"result\": \"unchanged\"}')")
    inv = _inv(tmp_path)
    CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(inv)
    assert "hello from the agent" in inv.log_file.read_text()


STDOUT_AGENT = """
import json
print("working on it")
print("```evolve-report")
print(json.dumps({"result": "harvested", "summary": "quoted first"}))
print("```")
print("more prose")
print("```evolve-report")
print(json.dumps({"result": "improved", "summary": "the final word", "cost_usd": 0.25}))
print("```")
"""


def test_report_block_on_stdout_is_the_report_when_no_file(tmp_path: Path) -> None:
    """Issue 16 item 3: the fenced block the prompt asks for counts; the LAST one wins."""
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, STDOUT_AGENT)), base_env={}).run(_inv(tmp_path))
    assert (r.result, r.summary, r.cost_usd, r.error_class) == ("improved", "the final word", 0.25, None)


def test_report_file_wins_over_stdout_block(tmp_path: Path) -> None:
    code = STDOUT_AGENT + (
        "import os\njson.dump({'result': 'unchanged', 'summary': 'from the file'},"
        " open(os.environ['EVOLVE_REPORT_FILE'], 'w'))\n"
    )
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(_inv(tmp_path))
    assert (r.result, r.summary) == ("unchanged", "from the file")


def test_bad_stdout_block_is_a_clear_crash(tmp_path: Path) -> None:
    code = "print('```evolve-report')\nprint('{not json')\nprint('```')"
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(_inv(tmp_path))
    assert (r.result, r.error_class, r.error) == ("failed", "crashed", "evolve-report block is not valid JSON")


def test_a_block_quoted_inline_is_not_a_report(tmp_path: Path) -> None:
    """Only a fence on a line of its own counts: prose mentioning ```evolve-report is not a report."""
    code = "print('see the ```evolve-report {\\\"result\\\": \\\"improved\\\"}``` block')"
    r = CommandRunner(AgentConfig(argv=_agent(tmp_path, code)), base_env={}).run(_inv(tmp_path))
    assert (r.result, r.error_class) == ("failed", "crashed") and "no evolve-report block" in r.error
