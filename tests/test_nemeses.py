"""Nemeses (issue 15, docs/PROOF.md): I/O errors injected into a fire's writes, fsyncs and renames,
clock steps under libfaketime, and an operator editing and committing while cycles run. Each ends
with the invariants of :mod:`invariants`: the git side, and the history of every queue line and claim.

(The appenders during fires are in tests/test_queue_appenders.py and SIGHUP in tests/test_signals.py;
both check the git side too.)
"""

from __future__ import annotations

import errno
import itertools
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from invariants import GitWatch, History, git_run
from support import Env, entry, improved_step

WAIT_S = 180  # hang guards only

# -- I/O errors ------------------------------------------------------------------------------------

SHIM_SRC = Path(__file__).with_name("evio.c")
LOOP = [
    improved_step("src/a.txt"),
    {**improved_step("src/b.txt"), "commit": True},
    {"report": {"result": "unchanged"}},
]
# (calls, on the path containing, how many succeed first, errno): the reduced set CI runs. Each
# of evolve's stores at each of its durable steps: the ledger's append and fsync, the state files'
# atomic replace, the queue's in-place edit (its redo journal's name contains the queue's too).
FAULTS = [
    ("write", "cycle-history.jsonl", 1, errno.ENOSPC),
    ("fsync", "cycle-history.jsonl", 0, errno.EIO),
    ("write", "session-state.json", 3, errno.ENOSPC),
    ("rename", "session-state.json", 2, errno.EIO),
    ("write,pwrite", "next-work.jsonl", 1, errno.ENOSPC),
    ("fsync", "next-work.jsonl", 2, errno.EIO),
    ("rename", "next-work.jsonl", 0, errno.ENOSPC),
    # The finalize's redo journal: the fire once logged this and went on, the item in_progress for good.
    ("rename", "next-work.jsonl", 2, errno.EIO),
    ("write", "cycle-state.json", 1, errno.EIO),
    ("rename", "cycle-state.json", 1, errno.ENOSPC),
]


def _compile(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build an LD_PRELOAD library from ``src``; skip (with the reason) where there is no compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler (cc) to build the LD_PRELOAD shim {src.name}")
    out = tmp_path_factory.mktemp(src.stem) / f"{src.stem}.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-ldl"], capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return out


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(SHIM_SRC, tmp_path_factory)


@pytest.fixture(scope="module")
def realsleep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(SHIM_SRC.with_name("realsleep.c"), tmp_path_factory)


def _fire(env: Env, *args: str, **extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", *args],
                          capture_output=True, env=env.env(**extra), timeout=WAIT_S)


def _whole(path: Path, *, torn_tail_ok: bool) -> None:
    """Every line of ``path`` parses; a tail without its newline only where the reader skips one."""
    if not path.exists():
        return
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in a newline
    for line in lines:
        assert not line.strip() or isinstance(orjson.loads(line), dict), (path.name, line[:200])
    assert torn_tail_ok or not tail, f"{path.name} ends in half a line: {tail[:200]!r}"


def _queued(env: Env, n: int) -> History:
    history = History()
    titles = [f"item-{k}" for k in range(n)]
    env.queue(entry(*titles))
    history.append(titles)
    return history


def _settled(env: Env, history: History, gitw: GitWatch) -> None:
    """One clean recovery fire, then every invariant."""
    r = _fire(env, "--cycles", "1")
    assert r.returncode in (0, 75), r.stderr.decode()[-2000:]
    _whole(env.paths.ledger, torn_tail_ok=False)
    state = env.state()
    assert state["fire"] is None and state["claimed_work"] is None, state
    cycles = [e["cycle"] for e in env.ledger()]
    assert cycles == sorted(set(cycles)), cycles
    history.observe(env, 1)
    gitw.check()


def _io_fault(env: Env, shim: Path, ops: str, match: str, after: int, err: int, times: int = 0) -> None:
    history = _queued(env, 4)
    env.steps(LOOP, loop=True)
    gitw = GitWatch(env)
    gitw.plant()
    log = env.root / "evio.log"
    faults = {"LD_PRELOAD": str(shim), "EVIO_OPS": ops, "EVIO_MATCH": match, "EVIO_AFTER": str(after),
              "EVIO_ERRNO": str(err), "EVIO_TIMES": str(times), "EVIO_LOG": str(log)}
    r = _fire(env, "--cycles", "3", **faults)
    assert log.exists(), f"no {ops} on {match} failed: the fault never hit"
    out = (r.stdout + r.stderr).decode(errors="replace")
    if r.returncode != 0:  # failing is allowed, silently is not: the error is named
        assert r.returncode == 1 and ("rror" in out), (r.returncode, out[-2000:])
        assert "Traceback" not in out, out[-3000:]
    # Whatever the moment: the files the fire left parse (the ledger's reader skips a torn tail).
    _whole(env.paths.ledger, torn_tail_ok=True)
    _whole(env.paths.nextwork, torn_tail_ok=False)
    if env.paths.state.exists():
        assert isinstance(orjson.loads(env.paths.state.read_bytes()), dict)
    gitw.check(settled=False)  # before any recovery: no index.lock, no improved entry without its commit
    History.claims_held(env)  # and no claim left in_progress that session-state does not record
    _settled(env, history, gitw)


@pytest.mark.parametrize(("ops", "match", "after", "err"), FAULTS,
                         ids=[f"{o}-{m}-{a}-{errno.errorcode[e]}" for o, m, a, e in FAULTS])
def test_an_io_error_fails_the_fire_loudly_or_not_at_all(env: Env, shim: Path, ops: str, match: str, after: int,
                                                          err: int) -> None:
    _io_fault(env, shim, ops, match, after, err)


# The ledger is appended to (one line per cycle: three calls of each kind in a three-cycle fire), never
# renamed; the other stores are written, synced and renamed several times a cycle.
SWEEP = [
    *itertools.product(("write,pwrite", "fsync"), ("cycle-history.jsonl",), range(3)),
    *itertools.product(("write,pwrite", "fsync", "rename"), ("session-state.json", "next-work.jsonl",
                                                             "cycle-state.json"), range(6)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("ops", "match", "after"), SWEEP, ids=[f"{o}-{m}-{a}" for o, m, a in SWEEP])
def test_io_error_sweep(env: Env, shim: Path, ops: str, match: str, after: int) -> None:
    """Each call of each kind on each store, in turn, fails: from there on with ENOSPC (even
    positions), or once with EIO (odd: a transient fault the fire may survive)."""
    odd = after % 2
    _io_fault(env, shim, ops, match, after, errno.EIO if odd else errno.ENOSPC, times=1 if odd else 0)


# -- clock steps ----------------------------------------------------------------------------------

LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))), None)
needs_faketime = pytest.mark.skipif(LIBFAKETIME is None or shutil.which("faketime") is None,
                                    reason="libfaketime and faketime (Debian package faketime) are missing")


def _wait(pred, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, f"{what} not reached within {WAIT_S}s"
        time.sleep(0.02)


def _held(path: Path, marks: Path, name: str) -> dict:
    """An improved step that says it runs (``marks/name``), then waits for ``marks/name.go``."""
    step = improved_step(path)
    step["write"] = [*step["write"], {"path": str(marks / name), "content": "running\n"}]
    return {**step, "wait_for": str(marks / f"{name}.go")}


def _ts(e: dict) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()


@needs_faketime
def test_clock_steps_inside_a_fire_leave_its_budget_ledger_and_agent_alone(env: Env, cli, realsleep: Path) -> None:
    """The wall clock of a running fire jumps 2 h ahead during cycle 1's agent, then 5 h back during
    cycle 2's (libfaketime reading an offset file at every call; the monotonic clock stays real, as on
    a host whose clock is set: tests/realsleep.c keeps Python's sleeps working there). A 30-minute
    budget and the agent's timeouts ignore both steps."""
    offset, marks = env.root / "faketime", env.root / "marks"
    offset.write_text("+0\n")
    marks.mkdir()
    history = _queued(env, 4)
    env.steps([_held("src/a.txt", marks, "c1"), _held("src/b.txt", marks, "c2"), improved_step("src/c.txt")])
    env.write_config(fire={"max_minutes": 30}, agent={"timeout_s": 600, "idle_timeout_s": 600})
    gitw = GitWatch(env)
    gitw.plant()
    faked = {"LD_PRELOAD": f"{realsleep}:{LIBFAKETIME}", "FAKETIME_TIMESTAMP_FILE": str(offset),
             "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env(**faked))
    for name, step in (("c1", "+2h"), ("c2", "-3h")):
        _wait(lambda name=name: (marks / name).exists() or fire.poll() is not None, f"the agent of {name}")
        offset.write_text(step + "\n")
        (marks / f"{name}.go").touch()
    out, err = fire.communicate(timeout=WAIT_S)
    assert fire.returncode == 0, err.decode()[-4000:]
    ledger = env.ledger()
    assert [(e["cycle"], e["result"]) for e in ledger] == [(1, "improved"), (2, "improved"), (3, "improved")]
    assert all(e["duration_s"] >= 0 for e in ledger), [e["duration_s"] for e in ledger]
    # The steps happened (an entry is stamped as its cycle ends): cycle 1 after the +2 h step, cycle 2
    # after the step 5 h back, so the ledger's order is its cycle numbers, not its timestamps.
    assert _ts(ledger[0]) - _ts(ledger[1]) > 4 * 3600 and _ts(ledger[2]) >= _ts(ledger[1])
    assert b"budget" not in out and b"timed out" not in out
    for args in (("status", "--json"), ("history", "--json"), ("fire", "--dry-run")):
        r = cli(*args)
        assert r.code in (0, 75) and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
    history.observe(env, 1)
    gitw.check()


@needs_faketime
@pytest.mark.parametrize("marker", ["kill", "stop", "kill by hand"])
def test_a_backward_clock_step_voids_no_marker(env: Env, cli, marker: str) -> None:
    """A KILL or STOP written now, read by a fire whose clock is 3 h behind (written "in the future"):
    it holds, no agent starts; the fire ahead by 3 h after the marker is gone runs again."""
    if marker == "kill by hand":
        env.paths.kill.parent.mkdir(parents=True, exist_ok=True)
        env.paths.kill.write_text("by hand\n")
    else:
        assert cli(marker).code == 0
    history = _queued(env, 2)
    behind = ["faketime", "-f", "-3h", sys.executable, "-m", "evolve", "--repo", str(env.repo)]
    st = subprocess.run([*behind, "status", "--json"], capture_output=True, env=env.env(), timeout=WAIT_S)
    assert st.returncode == 75, st.stderr[-2000:]
    assert orjson.loads(st.stdout)["halt"]["reason"] == {"stop": "user_halt"}.get(marker, "kill")
    fire = subprocess.run([*behind, "fire"], capture_output=True, env=env.env(), timeout=WAIT_S)
    assert fire.returncode == 0 and env.calls() == [] and env.ledger() == [], fire.stderr[-2000:]
    assert cli("resume", "--kill").code == 0
    ahead = ["faketime", "-f", "+3h", sys.executable, "-m", "evolve", "--repo", str(env.repo)]
    fire = subprocess.run([*ahead, "fire", "--cycles", "1"], capture_output=True, env=env.env(), timeout=WAIT_S)
    assert fire.returncode == 0 and [e["result"] for e in env.ledger()] == ["improved"], fire.stderr[-2000:]
    history.observe(env, 1)
    GitWatch(env).check()


@needs_faketime
def test_fires_on_a_clock_set_years_back_continue_the_ledger(env: Env) -> None:
    """A fire, then two on a clock set to 2020 (``faketime '2020-01-01 00:00:00'``), then one on the
    real clock: cycle numbers go on, no duration is negative, the budget and the breaker hold."""
    history = _queued(env, 6)
    env.steps(LOOP, loop=True)
    env.write_config(fire={"max_minutes": 30})
    gitw = GitWatch(env)
    gitw.plant()
    back = ["faketime", "2020-01-01 00:00:00"]
    for prefix in ([], back, back, []):
        r = subprocess.run([*prefix, sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                           capture_output=True, env=env.env(), timeout=WAIT_S)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    ledger = env.ledger()
    assert [e["cycle"] for e in ledger] == [1, 2, 3, 4]
    assert [e["result"] for e in ledger] == ["improved", "improved", "unchanged", "improved"]
    assert all(e["duration_s"] >= 0 for e in ledger)
    assert [_ts(e) < _ts(ledger[0]) for e in ledger] == [False, True, True, False]  # the clock was set back
    history.observe(env, 1)
    gitw.check()


# -- an operator at work during cycles ------------------------------------------------------------


def test_an_operator_editing_and_committing_during_cycles_loses_nothing(env: Env) -> None:
    """While a three-cycle fire runs (its agent edits files), the operator edits a tracked file,
    creates an untracked one and commits an unrelated change in the checkout. Afterwards the
    operator's commit is on the branch (never reverted), their uncommitted edit and untracked file
    are byte for byte as they left them, and no commit of evolve's holds any of their paths."""
    marks = env.root / "marks"
    marks.mkdir()
    history = _queued(env, 4)
    env.steps([_held("src/agent.txt", marks, "c1"), improved_step("src/agent.txt"), improved_step("src/other.txt")])
    env.write_config(git={"isolation": "worktree"}, agent={"timeout_s": 600, "idle_timeout_s": 600})
    repo = env.repo
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(repo), "fire", "--cycles", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    _wait(lambda: (marks / "c1").exists() or fire.poll() is not None, "the agent of cycle 1")
    # The operator, while cycle 1's agent runs: a commit of their own, then uncommitted work.
    (repo / "docs").mkdir()
    (repo / "docs" / "operator.md").write_bytes(b"the operator's committed note\n")
    git_run(repo, "add", "docs/operator.md")
    assert git_run(repo, "commit", "-q", "-m", "operator: a note").returncode == 0
    op_commit = git_run(repo, "rev-parse", "HEAD").stdout.decode().strip()
    gitw = GitWatch(env)
    gitw.plant()
    gitw.operator["docs/operator.md"] = b"the operator's committed note\n"
    (marks / "c1.go").touch()
    _out, err = fire.communicate(timeout=WAIT_S)
    assert fire.returncode == 0, err.decode()[-2000:]
    assert [e["result"] for e in env.ledger()] == ["improved"] * 3
    tip = git_run(repo, "rev-parse", "HEAD").stdout.decode().strip()
    assert git_run(repo, "merge-base", "--is-ancestor", op_commit, tip).returncode == 0, "the operator's commit is gone"
    gitw.check()  # operator's bytes, no evolve commit with their paths, no agent edit in the checkout
    history.observe(env, 1)
