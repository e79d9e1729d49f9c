"""A scripted agent: a real program the command runner starts, for the demo and the tests.

Usage: ``python -m evolve.agent.scripted --script steps.json``. Each invocation plays the next step
of the script (the position is kept in ``<script>.pos``); the last step repeats when the script
runs out, or the whole script does with ``{"steps": [...], "loop": true}``. Every call is recorded
in ``<script>.calls.jsonl`` so tests can assert what it received.

A step (all keys optional)::

    {"write": [{"path": "src/x.py", "content": "...", "append": false}],
     "commit": false, "run": [["git", "checkout", "feature"]], "sleep": 0, "hang": false,
     "spawn_sleeper": 0, "wait_for": "path", "stdout": "text", "exit": 0, "report": {...},
     "raw_report": "not json"}

``run``: argv lists started in the agent's cwd after the writes and the commit, whatever they exit
with (an agent that runs git itself: checks out a branch, resets, commits with ``add -f``).

``wait_for`` polls until that path (relative to the repo) exists, for at most 600 s: a test can then
act while the agent is certainly running, however loaded the machine.

With no script it appends a line about the work item to ``EVOLVE_LOG.md`` and reports improved.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson


def _next_step(script: Path) -> tuple[int, dict[str, Any]]:
    spec = orjson.loads(script.read_bytes())
    steps = spec["steps"] if isinstance(spec, dict) else spec
    loop = isinstance(spec, dict) and spec.get("loop") is True
    pos_file = script.with_name(script.name + ".pos")
    with open(pos_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read().strip()
        pos = int(text) if text else 0
        fh.seek(0)
        fh.truncate()
        fh.write(str(pos + 1))
    return pos, steps[pos % len(steps) if loop else min(pos, len(steps) - 1)]


def _record(script: Path | None, pos: int) -> None:
    if script is None:
        return
    env = {k: v for k, v in os.environ.items() if k.startswith("EVOLVE_")}
    prompt = ""
    if pf := env.get("EVOLVE_PROMPT_FILE"):
        try:
            prompt = Path(pf).read_text(encoding="utf-8")
        except OSError:
            prompt = ""
    call = {
        "pos": pos,
        "argv": sys.argv[1:],
        "env": env,
        "prompt": prompt,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
    }
    with open(script.with_name(script.name + ".calls.jsonl"), "ab") as fh:
        fh.write(orjson.dumps(call, option=orjson.OPT_APPEND_NEWLINE))


def _write_report(report: Any, raw: str | None) -> None:
    path = os.environ.get("EVOLVE_REPORT_FILE")
    if not path:
        return
    if raw is not None:
        Path(path).write_text(raw, encoding="utf-8")
    elif report is not None:
        if isinstance(report, dict):
            report.setdefault("session_id", os.environ.get("EVOLVE_SESSION_ID", ""))
        Path(path).write_bytes(orjson.dumps(report))


def play(step: dict[str, Any]) -> int:
    for w in step.get("write", []) or []:
        target = Path(w["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        text = str(w.get("content", "")).replace("{cycle}", os.environ.get("EVOLVE_CYCLE", ""))
        with open(target, "a" if w.get("append") else "w", encoding="utf-8") as fh:
            fh.write(text)
    if step.get("commit"):
        paths = [w["path"] for w in step.get("write", []) or []]
        subprocess.run(["git", "add", "--", *paths], check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"agent: cycle {os.environ.get('EVOLVE_CYCLE', '')}"], check=True)
    for argv in step.get("run", []) or []:
        subprocess.run([str(a) for a in argv], check=False)
    if step.get("stdout"):
        print(step["stdout"], flush=True)
    if n := step.get("spawn_sleeper"):
        # A child that outlives us unless someone kills our process group.
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({float(n)})"])
    if step.get("wait_for"):
        deadline = time.monotonic() + 600
        while not Path(step["wait_for"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    if step.get("sleep"):
        time.sleep(float(step["sleep"]))
    if step.get("hang"):
        while True:
            time.sleep(3600)
    _write_report(step.get("report", {"result": "improved", "summary": "scripted step"}), step.get("raw_report"))
    return int(step.get("exit", 0))


def default_step() -> dict[str, Any]:
    work = orjson.loads(os.environ.get("EVOLVE_WORK_JSON", "{}") or "{}")
    title = str(work.get("title", "work")).replace("\n", " ")
    return {
        "write": [{"path": "EVOLVE_LOG.md", "content": f"- cycle {{cycle}}: {title}\n", "append": True}],
        "report": {"result": "improved", "summary": f"logged {title}"},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolve-scripted-agent")
    ap.add_argument("--script", type=Path, default=None)
    args, _ = ap.parse_known_args(argv)
    if args.script is None:
        return play(default_step())
    pos, step = _next_step(args.script)
    _record(args.script, pos)
    return play(step)


if __name__ == "__main__":
    raise SystemExit(main())
