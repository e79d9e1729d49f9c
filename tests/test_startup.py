"""``evolve status`` answers fast: it must not import the daemon's heavy modules (APScheduler, structlog)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from support import Env

HEAVY = ("apscheduler", "structlog")

PROBE = textwrap.dedent(
    """
    import json
    import sys

    import evolve.cli

    code = evolve.cli.main(sys.argv[1:])
    loaded = [m for m in ("apscheduler", "structlog") if m in sys.modules
              or any(k.startswith(m + ".") for k in sys.modules)]
    sys.stderr.write("PROBE " + json.dumps([code, loaded]) + "\\n")
    """
)


def probe(env: Env, *args: str) -> tuple[int, list[str], str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "--repo", str(env.repo), *args],
        capture_output=True, text=True, env=env.env(), timeout=60,
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("PROBE "))
    code, loaded = orjson.loads(line[len("PROBE "):])
    return code, loaded, out.stdout


def seed(env: Env) -> None:
    p = env.paths
    p.evolve_dir.mkdir(parents=True, exist_ok=True)
    with open(p.ledger, "wb") as fh:
        for c in range(1, 30):
            fh.write(orjson.dumps({"cycle": c, "result": "improved", "target": f"t{c}",
                                   "timestamp": "2026-11-01T00:00:00Z"}, option=orjson.OPT_APPEND_NEWLINE))
        fh.write(b"garbage\n")
    p.state.write_bytes(orjson.dumps({"context_streak": 1, "parked_work": ["a"]}))
    p.handoff.write_text("2026-11-01T00:00:00Z\ncontext_streak=2\nparked_work: []\nnext-action: x\n")


@pytest.mark.parametrize("args", [("status", "--json"), ("status",)])
def test_status_does_not_import_heavy_modules(env: Env, args: tuple[str, ...]) -> None:
    seed(env)
    code, loaded, stdout = probe(env, *args)
    assert code == 0
    assert loaded == [], f"`evolve {' '.join(args)}` imported {loaded}"
    if "--json" in args:
        info = orjson.loads(stdout)
        assert info["last_logged_cycle"] == 29
        assert info["context_streak"] == 1
        assert "HANDOFF" in info["markers"]
        assert info["malformed_lines_seen"] == 1


def test_status_empty_repo_does_not_import_heavy_modules(env: Env) -> None:
    code, loaded, stdout = probe(env, "status", "--json")
    assert code == 0 and loaded == []
    assert orjson.loads(stdout)["last_logged_cycle"] == 0


def test_history_does_not_import_heavy_modules(env: Env) -> None:
    seed(env)
    code, loaded, _ = probe(env, "history", "--json")
    assert code == 0 and loaded == []


def test_status_is_read_only(env: Env, cli) -> None:
    seed(env)
    p = env.paths
    p.state.write_bytes(b"corrupt{")
    with open(p.ledger, "ab") as fh:
        fh.write(b'{"cycle": 30, "torn')

    def listing() -> dict[str, bytes]:
        return {q.name: q.read_bytes() for q in p.evolve_dir.iterdir()}

    before = listing()
    r = cli("status", "--json")
    assert r.code == 0, r.stderr
    assert orjson.loads(r.stdout)["last_logged_cycle"] == 29
    assert listing() == before


def test_status_reports_running_while_lock_held(env: Env, cli) -> None:
    from evolve.store.lock import FireLock

    lock = FireLock(env.paths.lock)
    assert lock.acquire()
    try:
        assert orjson.loads(cli("status", "--json").stdout)["running"] is True
    finally:
        lock.release()
    assert orjson.loads(cli("status", "--json").stdout)["running"] is False
    assert Path(env.paths.lock).exists()
