"""``evolve demo``: a throwaway repo, a harvested queue and the bundled scripted agent, narrated.

Two real fires run as subprocesses. The first does an improved cycle, then two context-heavy ones,
writes HANDOFF and a ``context-handoff`` entry and ends; the second clears HANDOFF in step one and
carries on in a fresh agent session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from evolve.git import run as gitrun
from evolve.paths import Paths

QUEUE = [
    {
        "source_epic": "demo-1",
        "timestamp": "2026-11-29T00:00:00Z",
        "consumed": False,
        "claim_status": "available",
        "items": [
            {
                "title": "Add a greeting module",
                "description": "Create src/greeting.py with greet(name).",
                "type": "feature",
                "severity": "high",
                "source": "council-finding",
            },
            {
                "title": "Refactor the whole parser",
                "description": "A big one: needs a deep read of many files.",
                "type": "tech-debt",
                "severity": "medium",
                "source": "council-finding",
            },
        ],
    },
    {
        "source_epic": "demo-2",
        "timestamp": "2026-11-29T00:05:00Z",
        "consumed": False,
        "claim_status": "available",
        "items": [
            {
                "title": "Document the greeting",
                "description": "Add a docs/greeting.md page.",
                "type": "docs",
                "severity": "low",
                "source": "retro-learning",
            },
        ],
    },
]

USAGE_HEAVY = {
    "input_tokens": 60000,
    "output_tokens": 2000,
    "cache_read_input_tokens": 30000,
    "cache_creation_input_tokens": 0,
}
USAGE_LIGHT = {
    "input_tokens": 9000,
    "output_tokens": 900,
    "cache_read_input_tokens": 3000,
    "cache_creation_input_tokens": 0,
}

SCRIPT = {
    "steps": [
        # fire 1, cycle 1: the greeting lands.
        {
            "write": [{"path": "src/greeting.py", "content": "def greet(name):\n    return f'hello, {name}'\n"}],
            "report": {
                "result": "improved",
                "summary": "Added src/greeting.py.",
                "usage": USAGE_LIGHT,
                "context_window": 200000,
                "cost_usd": 0.02,
            },
        },
        # fire 1, cycle 2: the parser refactor is too big for this session's context: a scout.
        {
            "report": {
                "result": "scout",
                "disposition": "context-too-heavy",
                "summary": "Parser refactor needs a deep read; this session is too heavy.",
                "usage": USAGE_HEAVY,
                "context_window": 200000,
                "cost_usd": 0.05,
            }
        },
        # fire 1, cycle 3: deferred again; 45% of the window in use is a second heavy cycle -> hand-off.
        {
            "report": {
                "result": "harvested",
                "disposition": "context-budget-defer",
                "summary": "Deferred the parser refactor for a fresh session.",
                "usage": USAGE_HEAVY,
                "context_window": 200000,
                "cost_usd": 0.05,
            }
        },
        # fire 2: a fresh session takes the parked item and lands it, then the docs item.
        {
            "write": [{"path": "src/parser.py", "content": "def parse(text):\n    return text.split()\n"}],
            "report": {
                "result": "improved",
                "summary": "Refactored the parser into src/parser.py.",
                "usage": USAGE_LIGHT,
                "context_window": 200000,
                "cost_usd": 0.02,
            },
        },
        {
            "write": [{"path": "docs/greeting.md", "content": "# greet(name)\n\nReturns a greeting.\n"}],
            "report": {
                "result": "improved",
                "summary": "Documented greet().",
                "usage": USAGE_LIGHT,
                "context_window": 200000,
                "cost_usd": 0.02,
            },
        },
    ]
}


def _say(text: str = "") -> None:
    print(text, flush=True)


def _git(repo: Path, *args: str) -> None:
    ident = {
        "GIT_AUTHOR_NAME": "demo",
        "GIT_AUTHOR_EMAIL": "demo@localhost",
        "GIT_COMMITTER_NAME": "demo",
        "GIT_COMMITTER_EMAIL": "demo@localhost",
    }
    proc = gitrun.run_git(repo, *args, extra_env=ident)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, ["git", *args], proc.stdout, proc.stderr)


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "README.md").write_text("# demo project\n", encoding="utf-8")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-q", "-m", "initial")
    paths = Paths.for_repo(repo, env={})
    paths.evolve_dir.mkdir(parents=True)
    (repo / ".agents" / ".gitignore").write_text("*\n", encoding="utf-8")
    script = root / "agent-script.json"
    script.write_bytes(orjson.dumps(SCRIPT, option=orjson.OPT_INDENT_2))
    argv = [sys.executable, "-m", "evolve.agent.scripted", "--script", str(script)]
    paths.config.write_text(
        '[agent]\nrunner = "command"\n'
        f"argv = {orjson.dumps(argv).decode()}\n"
        # PYTHONPATH: the scripted agent imports evolve, wherever this one was imported from.
        'timeout_s = 120\nidle_timeout_s = 60\npass_env = ["PYTHONPATH"]\n\n[fire]\nmax_cycles = 5\n',
        encoding="utf-8",
    )
    paths.nextwork.parent.mkdir(parents=True, exist_ok=True)
    paths.nextwork.write_bytes(b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in QUEUE))
    return repo


def _fire(repo: Path, root: Path, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(root / "xdg")}
    env.pop("EVOLVE_DIR", None)
    env.pop("EVOLVE_NEXTWORK", None)
    proc = subprocess.run(
        [sys.executable, "-m", "evolve", "--repo", str(repo), "fire", *extra], capture_output=True, env=env, check=False
    )
    events, logs, other = [], [], []
    for line in proc.stderr.splitlines():  # the fire's logs (JSON lines, stderr is not a terminal here)
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            events.append(obj)
            logs.append(line + b"\n")
        else:
            other.append(line + b"\n")
    with (root / "fire-logs.jsonl").open("ab") as fh:
        fh.write(b"".join(logs))
    if other:
        sys.stderr.write(b"".join(other).decode(errors="replace"))
    return proc.returncode, events


def _narrate(events: list[dict[str, Any]]) -> None:
    for e in events:
        ev = e.get("event")
        if ev == "fire.start":
            _say(f"  fire.start        pid {e.get('pid')}, mode {e.get('mode')}")
        elif ev == "handoff.cleared":
            first = str(e.get("content", "")).splitlines()[:2]
            _say(f"  handoff.cleared   step 1 deleted HANDOFF ({' / '.join(first)})")
        elif ev == "cycle.start":
            _say(f"  cycle.start       #{e.get('cycle')} {e.get('title')!r} from {e.get('source')}")
        elif ev == "agent.mode":
            _say(f"  agent.mode        {e.get('mode')} ({e.get('reason')})")
        elif ev == "cycle.end":
            heavy = f", context-heavy: {e.get('context_signal')}" if e.get("context_heavy") else ""
            _say(f"  cycle.end         #{e.get('cycle')} {e.get('result')}{heavy}")
        elif ev == "context.streak":
            _say(f"  context.streak    {e.get('streak')} of {e.get('limit')}")
        elif ev == "handoff.written":
            _say(f"  handoff.written   parked {e.get('parked')}")
        elif ev == "git.commit":
            _say(f"  git.commit        {str(e.get('sha'))[:10]}")
        elif ev == "fire.end":
            _say(f"  fire.end          reason {e.get('reason')}, {e.get('cycles')} cycle(s), exit {e.get('exit_code')}")


def run_demo(where: Path | None, *, keep: bool = True) -> int:
    """The demo in ``where`` (or a new temp dir). It is kept unless ``keep`` is false: the narration
    points at its files, so deleting them would leave the operator with paths to nothing."""
    root = Path(tempfile.mkdtemp(prefix="evolve-demo-")) if where is None else where.resolve()
    if where is not None:
        if root.exists() and any(root.iterdir()):
            print(f"evolve: demo directory {root} is not empty", file=sys.stderr)
            return 2
        root.mkdir(parents=True, exist_ok=True)
    try:
        repo = make_repo(root)
        paths = Paths.for_repo(repo, env={})
        _say(f"evolve demo: a throwaway repo at {repo}")
        _say("  a harvested queue with 3 items, and a scripted agent (a real program the command runner starts)\n")

        _say("Fire 1 — what cron or a systemd timer runs: `evolve fire`")
        code1, ev1 = _fire(repo, root)
        _narrate(ev1)
        handoff = paths.handoff.read_text(encoding="utf-8") if paths.handoff.exists() else ""
        _say("\nHANDOFF (non-sticky; the next fire clears it in step 1):")
        for line in handoff.splitlines():
            _say(f"  | {line}")
        last = _last_entry(paths)
        _say("\nLast ledger entry (jq -r 'select(.result==\"context-handoff\")' .agents/evolve/cycle-history.jsonl):")
        _say(f"  {orjson.dumps(last).decode() if last else '(none)'}")
        state = orjson.loads(paths.state.read_bytes())
        _say(f"  context_streak = {state.get('context_streak')} (reset after the hand-off)\n")

        _say("Fire 2 — the next scheduled trigger resumes in a fresh agent session")
        code2, ev2 = _fire(repo, root)
        _narrate(ev2)
        cleared = any(e.get("event") == "handoff.cleared" for e in ev2)
        improved = [e for e in ev2 if e.get("event") == "cycle.end" and e.get("result") == "improved"]

        _say("\nevolve status:")
        st = subprocess.run(
            [sys.executable, "-m", "evolve", "--repo", str(repo), "status"],
            capture_output=True,
            text=True,
            env={**os.environ, "XDG_CONFIG_HOME": str(root / "xdg")},
        )
        for line in st.stdout.splitlines():
            _say(f"  {line}")
        if keep:
            _say("\nLook at:")
            _say(f"  {paths.ledger}")
            _say(f"  {paths.state}")
            _say(f"  {paths.nextwork}")
            _say(f"  {root / 'fire-logs.jsonl'}   (the fires' structured logs)")
            _say(f"  git -C {repo} log --oneline")
            _say(f"  evolve --repo {repo} history    (and status, report, logs N)")
            _say(f"(the demo stays in {root}; remove it with `rm -rf {root}`)")
        ok = (
            code1 == 0
            and code2 == 0
            and bool(handoff)
            and last is not None
            and last.get("result") == "context-handoff"
            and cleared
            and bool(improved)
        )
        _say("\n" + ("demo ok: context exhaustion was a hand-off, not a stop." if ok else "demo FAILED: see above."))
        return 0 if ok else 1
    finally:
        if not keep:
            _say(f"(removed the demo directory {root}, as --rm asked)")
            shutil.rmtree(root, ignore_errors=True)


def _last_entry(paths: Paths) -> dict[str, Any] | None:
    from evolve.store.ledger import Ledger

    return Ledger(paths.ledger).last()
