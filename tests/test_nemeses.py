"""Nemeses (issues 15 and 22, docs/PROOF.md): I/O errors injected into a fire's writes, fsyncs and renames,
clock steps under libfaketime, and an operator editing, committing, dropping, amending, switching branch,
detaching and rebasing while cycles run. Each ends with the invariants of :mod:`invariants`: the git
side, and the history of every queue line and claim.

(The appenders during fires are in tests/test_queue_appenders.py and SIGHUP in tests/test_signals.py;
both check the git side too.)
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from invariants import GitWatch, History, branch_tips, checked_out, common_dir, git_run, held_cycles
from support import GIT_ENV, Env, entry, improved_step, live

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


def test_a_write_failing_as_the_agent_starts_leaves_no_agent_running(tmp_path: Path) -> None:
    """Recording the agent's group (``on_start``: session-state, on a full disk) fails once the agent runs:
    its whole group is killed before the error goes on, so no agent works on unsupervised while its cycle
    is recorded failed and its tree reset. (The sweep's ``write,pwrite-session-state.json-5`` case once
    found that late agent's ``git add`` in evolve's worktree after recovery.)"""
    from evolve.procgroup import Limits, group_alive, run_group

    started, pgids = tmp_path / "started", []
    child = ("import pathlib, subprocess, sys, time;"
             " subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
             f" pathlib.Path({str(started)!r}).touch(); time.sleep(120)")

    def on_start(pgid: int) -> None:
        pgids.append(pgid)
        _wait(started.exists, "the agent and its child")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        run_group([sys.executable, "-c", child], cwd=tmp_path, env=dict(os.environ), limits=Limits(timeout_s=300),
                  on_start=on_start)
    assert not Path(f"/proc/{pgids[0]}").exists(), "the agent outlived the failed start"
    _wait(lambda: not group_alive(pgids[0]), "the agent's child to die with its group")


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


# -- the operator's git during cycles (issue 22) ----------------------------------------------------

# Each action and the ways it can go (the seeded run picks one at random; CI runs each once).
OPERATOR_ACTIONS = {"drop": ("tip", "two"), "amend": ("tip", "evolve"), "switch": ("stay", "back"), "detach": ("back",),
                    "rebase": ("abort", "continue"), "edit": ("drop", "commit", "chain", "switch")}
SHARED = "src/shared.txt"  # a path the operator edits and the agent changes too (the "edit" action)
ITEM_KINDS = ("bug", "feature", "tech-debt", "improvement", "pattern-fix", "task")  # the metronome wants a mix


class Operator:
    """The operator at work in their own checkout while cycles run: every move is made while a cycle's
    agent certainly runs (it waits for a file) and recorded on the :class:`GitWatch`, and every fire is
    followed by all the invariants. Deterministic from the seed."""

    def __init__(self, env: Env, seed: int) -> None:
        self.env, self.repo = env, env.repo
        self.rng = random.Random(seed)
        self.go, self.mark = env.root / "agent-go", env.root / "agent-running"
        env.write_config(agent={"timeout_s": 600, "idle_timeout_s": 600}, fire={"max_cycles": 50},
                         work={"max_attempts": 1000}, breaker={"max_consecutive_failures": 1000})
        (self.repo / SHARED).parent.mkdir(parents=True, exist_ok=True)
        (self.repo / SHARED).write_text("shared by the operator and the agent\n")
        self.ok("add", "--", SHARED)
        self.ok("commit", "-q", "-m", "operator: a file both of us change")
        self.gitw, self.history = GitWatch(env), History()
        self.gitw.plant()  # an uncommitted README edit and an untracked file, there all along
        self.gitw.operator_left()
        self.round = 0
        self.fires = 0
        self.stats: Counter[str] = Counter()

    # -- git, as the operator types it ------------------------------------------------------------------

    def run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", *args], cwd=self.repo, capture_output=True,
                              env={**os.environ, **GIT_ENV, "GIT_EDITOR": "true"})

    def ok(self, *args: str) -> str:
        r = self.run(*args)
        assert r.returncode == 0, f"the operator's git {' '.join(args)} failed: {r.stderr.decode()[-600:]}"
        return r.stdout.decode().strip()

    def branch(self) -> str:
        b = checked_out(self.repo)
        assert b is not None, "the operator should be on a branch between rounds"
        return b

    def tip(self, ref: str = "HEAD") -> str:
        return self.ok("rev-parse", ref)

    def commit(self, path: str, content: str, msg: str) -> str:
        (self.repo / path).parent.mkdir(parents=True, exist_ok=True)
        (self.repo / path).write_text(content)
        self.ok("add", "--", path)
        self.ok("commit", "-q", "-m", msg, "--", path)
        self.gitw.operator_moved(self.branch())
        return self.tip()

    def commit_beside(self, ref: str, at: str, path: str, content: str, msg: str) -> str:
        """A commit on a new branch ``ref`` at ``at`` made with a scratch index (the checkout untouched)."""
        with tempfile.TemporaryDirectory() as tmp:
            idx = {**os.environ, **GIT_ENV, "GIT_INDEX_FILE": str(Path(tmp) / "index")}

            def g(*args: str, data: bytes | None = None) -> str:
                r = subprocess.run(["git", *args], cwd=self.repo, capture_output=True, env=idx, input=data)
                assert r.returncode == 0, r.stderr.decode()
                return r.stdout.decode().strip()

            blob = g("hash-object", "-w", "--stdin", data=content.encode())
            g("read-tree", at)
            g("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
            sha = g("commit-tree", g("write-tree"), "-p", at, "-m", msg)
        self.ok("update-ref", ref, sha, "0" * 40)
        self.gitw.operator_moved(ref)
        return sha

    # -- fires ----------------------------------------------------------------------------------------

    def refill(self) -> None:
        q = self.env.paths.nextwork
        items = [i for e in live(q) for i in e["items"]] if q.exists() else []
        if sum(1 for i in items if not i.get("consumed") and i.get("claim_status") != "in_progress") >= 3:
            return
        n = len(self.history.appended)
        titles = [f"op-item-{n + k}" for k in range(6)]
        batch = entry(*titles, epic=f"op-batch-{n}")
        for k, item in enumerate(batch["items"]):
            item["type"] = ITEM_KINDS[k % len(ITEM_KINDS)]
        self.env.queue(batch)
        self.history.append(titles)

    def fire(self, during: Callable[[], None] | None = None, *, shared: bool = False) -> tuple[int, list[dict], str]:
        """One fire of one cycle; ``during`` is done while its agent runs (it writes a file of its own, and
        ``shared``: appends to SHARED too, then waits). Then every invariant. Its new entries and its log."""
        self.fires += 1
        writes = [{"path": f"src/fire-{self.fires}.txt", "content": "cycle {cycle}\n"}]
        if shared:
            writes.append({"path": SHARED, "content": "the agent's line, cycle {cycle}\n", "append": True})
        step: dict[str, Any] = {"write": writes, "report": {"result": "improved", "summary": "did it"}}
        if during is not None:
            self.go.unlink(missing_ok=True)
            self.mark.unlink(missing_ok=True)
            step["write"] = [*writes, {"path": str(self.mark), "content": "running\n"}]
            step["wait_for"] = str(self.go)
        self.env.steps([step])
        self.refill()
        before = len(self.env.ledger())
        self.gitw.baseline()
        fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(self.repo), "fire", "--cycles", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env.env())
        if during is not None:
            _wait(lambda: self.mark.exists() or fire.poll() is not None, "the agent's mark")
            assert fire.poll() is None, f"the fire ended before its agent ran: {fire.communicate()[1][-3000:]!r}"
            during()
            self.gitw.operator_left()  # what the operator has uncommitted now is theirs, byte for byte
            self.go.touch()
        _out, err = fire.communicate(timeout=WAIT_S)
        log = err.decode(errors="replace")
        assert fire.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        self.check()
        return fire.returncode, self.env.ledger()[before:], log

    def check(self, *, all_landed: bool = False) -> None:
        self.gitw.check()
        self.history.observe(self.env, self.fires, all_landed=all_landed)

    def busy_fire(self, why: str) -> None:
        """The operator is mid-operation: the fire runs no agent, writes no entry, moves nothing."""
        calls, ledger, tips = len(self.env.calls()), len(self.env.ledger()), branch_tips(self.repo)
        self.gitw.baseline()
        r = subprocess.run([sys.executable, "-m", "evolve", "--repo", str(self.repo), "fire", "--cycles", "1"],
                           capture_output=True, env=self.env.env(), timeout=WAIT_S)
        log = r.stderr.decode(errors="replace")
        assert r.returncode == 0 and "fire.operator_busy" in log and why in log, log[-3000:]
        assert len(self.env.calls()) == calls and len(self.env.ledger()) == ledger, "a busy fire ran a cycle"
        assert branch_tips(self.repo) == tips, "a busy fire moved a branch"
        self.stats["busy fires (no agent, nothing moved)"] += 1
        self.check()

    # -- the actions ----------------------------------------------------------------------------------------

    def secret(self, kind: str) -> str:
        return f"SECRET-{kind}-{self.round}-{self.rng.getrandbits(48):012x}"

    def drop(self, how: str) -> None:
        """A commit with a secret, dropped while the cycle runs (``reset --hard`` to its parent; ``two``: the
        commit below goes too, often evolve's last landing, whose improved sha is then off the branch by the
        operator's hand, as the watch records)."""
        if how == "two" and self.run("rev-parse", "-q", "--verify", "HEAD~2").returncode != 0:
            self.fire()  # something of evolve's to drop with it
        secret = self.secret("drop")
        self.commit(f"ops/secret-{self.round}.txt", f"key={secret}\n", "operator: oops, committed a secret")
        depth = 2 if how == "two" else 1
        branch = self.branch()
        dropped_to: list[str] = []

        def during() -> None:
            self.ok("reset", "-q", "--hard", f"HEAD~{depth}")
            gone = self.gitw.operator_moved(branch, secrets=(secret,))
            assert len(gone) == depth, gone
            dropped_to.append(self.tip())
            self.stats[f"drop: {depth} commit(s) removed"] += 1

        _, entries, _ = self.fire(during)
        assert [e["result"] for e in entries] == ["improved"], entries  # replayed onto the new tip, landed
        assert self.tip(branch) == entries[0]["sha"] and self.tip(f"{branch}~1") == dropped_to[0]

    def amend(self, how: str) -> None:
        """A commit with a password, amended while the cycle runs (the password gone for good); ``evolve``:
        the operator amends evolve's last landing instead (a line of theirs into its file): the ledger's
        sha for it is then off the branch by their hand, and the cycle running meanwhile replays onto it."""
        branch = self.branch()
        secret = self.secret("amend")
        if how == "evolve":
            _, landed, _ = self.fire()
            assert [e["result"] for e in landed] == ["improved"] and self.tip() == landed[0]["sha"], landed
            path = f"src/fire-{self.fires}.txt"
            content = (self.repo / path).read_text() + "the operator's amendment\n"
        else:
            path = f"ops/conf-{self.round}.txt"
            self.commit(path, f"password={secret}\n", "operator: conf")
            content = "password=<from the vault>\n"

        def during() -> None:
            (self.repo / path).write_text(content)
            self.ok("add", "--", path)
            message = ["--no-edit"] if how == "evolve" else ["-m", "operator: conf (no password)"]
            self.ok("commit", "-q", "--amend", *message)
            gone = self.gitw.operator_moved(branch, secrets=() if how == "evolve" else (secret,))
            assert len(gone) == 1, gone

        _, entries, _ = self.fire(during)
        assert [e["result"] for e in entries] == ["improved"], entries
        assert self.ok("show", f"{branch}:{path}") + "\n" == content

    def switch(self, how: str) -> None:
        """The operator switches to the other branch while the cycle runs and commits there; the cycle
        lands on the branch it planned, the other keeps the operator's commit as its tip."""
        here = self.branch()
        other = "refs/heads/feature" if here != "refs/heads/feature" else "refs/heads/main"
        if self.run("rev-parse", "-q", "--verify", other).returncode != 0:
            self.ok("branch", other.removeprefix("refs/heads/"))
            self.gitw.operator_moved(other)
        mine: list[str] = []

        def during() -> None:
            r = self.run("checkout", "-q", other.removeprefix("refs/heads/"))
            if r.returncode != 0:  # git refused (their edits would be overwritten): they stay where they are
                self.stats["switch refused by git"] += 1
                return
            mine.append(self.commit(f"ops/feature-{self.round}.txt", "the operator's work\n", "operator: feature work"))

        _, entries, _ = self.fire(during)
        assert [e["result"] for e in entries] == ["improved"], entries
        assert self.gitw.landed_on[entries[0]["cycle"]] == here  # the branch planned at the cycle's start
        if mine:
            assert self.tip(other) == mine[0], "evolve moved the branch the operator switched to"
            self.stats["switch: landed on the branch left"] += 1
            if how == "back":
                self.ok("checkout", "-q", here.removeprefix("refs/heads/"))
                self.stats["switch: and back"] += 1

    def detach(self, how: str) -> None:
        """The operator detaches HEAD while the cycle runs; the cycle lands on the branch nobody has now;
        a fire while detached does nothing; then they check the branch out again."""
        branch = self.branch()
        _, entries, _ = self.fire(lambda: self.ok("checkout", "-q", "--detach"))
        assert [e["result"] for e in entries] == ["improved"], entries
        assert self.tip(branch) == entries[0]["sha"]
        self.busy_fire("detached")
        self.ok("checkout", "-q", branch.removeprefix("refs/heads/"))

    def rebase(self, how: str) -> None:
        """The operator starts rebasing their branch while the cycle runs; it stops on a conflict. The
        landing waits for them (their rebase must be able to finish); a fire meanwhile does nothing; then
        they abort, or resolve and continue, and the next fire lands the waiting work."""
        branch = self.branch()
        path = f"ops/rebase-{self.round}.txt"
        side = f"refs/heads/side-{self.round}"
        self.commit_beside(side, self.tip(), path, "the side branch's version\n", "operator: side")
        ours = self.commit(path, "our version\n", "operator: ours")

        def during() -> None:
            r = self.run("rebase", "--autostash", side.removeprefix("refs/heads/"))  # their README edit aside
            assert r.returncode != 0 and (common_dir(self.repo) / "rebase-merge").is_dir(), r.stderr

        _, entries, _ = self.fire(during)
        assert [e["result"] for e in entries] == ["pending"], entries
        assert "rebase" in entries[0]["pending_reason"], entries[0]
        self.busy_fire("rebase")
        if how == "abort":
            self.ok("rebase", "--abort")
            assert self.tip(branch) == ours  # the rebase put the branch back as it was: nothing moved it
            self.stats["rebase: aborted"] += 1
        else:
            (self.repo / path).write_text("resolved by hand\n")
            self.ok("add", "--", path)
            r = self.run("rebase", "--continue")
            assert r.returncode == 0, f"the operator's rebase cannot finish: {r.stderr.decode()[-800:]}"
            gone = self.gitw.operator_moved(branch)
            assert ours in gone  # rewritten: the old commit is off the branch
            self.stats["rebase: continued"] += 1
        self.gitw.operator_left()
        _, entries, _ = self.fire()
        settled = [e for e in entries if e.get("pending_cycle")]
        assert [e["result"] for e in settled] == ["improved"], entries  # replayed onto the rebased branch

    def edit(self, how: str) -> None:
        """An uncommitted edit of a path the agent changes too, made while the cycle runs: the landing
        waits (pending, the claim kept; ``chain``: another cycle chains onto it); then the operator drops
        their edit (the work lands), or commits it (the work no longer replays onto their commit:
        released, kept unlanded), or (``switch``) drops it and switches to the other branch: the next fire
        lands the waiting work on the branch it waited for (by compare-and-swap), its own on theirs."""
        branch = self.branch()

        def during() -> None:
            with open(self.repo / SHARED, "a") as fh:
                fh.write(f"the operator's own line, round {self.round}\n")

        _, entries, _ = self.fire(during, shared=True)
        assert [e["result"] for e in entries] == ["pending"] and SHARED in entries[0]["pending_reason"], entries
        waiting = [entries[0]["cycle"]]
        if how == "chain":
            _, more, _ = self.fire()
            assert [e["result"] for e in more] == ["pending"], more  # chained onto the waiting work
            waiting.append(more[0]["cycle"])
        if how == "commit":
            self.ok("commit", "-q", "-m", "operator: my line", "--", SHARED)
            self.gitw.operator_moved(branch)
            outcome = "failed"
            self.stats["edit: committed by the operator, work released"] += 1
        else:
            self.ok("checkout", "-q", "--", SHARED)
            outcome = "improved"
            self.stats["edit: dropped by the operator, work landed"] += 1
        if how == "switch":
            other = "feature" if branch != "refs/heads/feature" else "main"
            if self.run("rev-parse", "-q", "--verify", other).returncode != 0:
                self.ok("branch", other)
                self.gitw.operator_moved(f"refs/heads/{other}")
            self.ok("checkout", "-q", other)
        self.gitw.operator_left()
        _, entries, _ = self.fire()
        settled = [e for e in entries if e.get("pending_cycle")]
        assert [(e["pending_cycle"], e["result"]) for e in settled] == [(c, outcome) for c in waiting], entries
        assert not held_cycles(self.env)
        if how == "switch":  # the waiting work on the branch it waited for, this fire's cycle on the other
            assert all(self.gitw.landed_on[e["cycle"]] == branch for e in settled), self.gitw.landed_on
            assert self.tip(branch) == settled[-1]["sha"]
            own = [e for e in entries if not e.get("pending_cycle")]
            assert [e["result"] for e in own] == ["improved"] and self.tip() == own[0]["sha"], own
            self.stats["edit: the waiting work landed on the branch left"] += 1

    # -- a run ----------------------------------------------------------------------------------------------

    def play(self, action: str, how: str | None = None) -> None:
        self.round += 1
        how = how or self.rng.choice(OPERATOR_ACTIONS[action])
        getattr(self, action)(how)
        self.stats[f"action {action}"] += 1
        self.stats[f"action {action} {how}"] += 1

    def finish(self) -> Counter[str]:
        """A final clean fire: everything that waited has landed or was settled, nothing is left in_progress."""
        self.fire()
        self.check(all_landed=True)
        ledger = self.env.ledger()
        self.stats["cycles"] = len(ledger)
        self.stats["improved commits checked"] = len(self.gitw.checked)
        self.stats["improved commits the operator removed later"] = len(self.gitw.exempt)
        self.stats["branch moves checked"] = self.gitw.moves
        self.stats.update({f"pending {k}": v for k, v in self.history.pending.items()})
        return self.stats


@pytest.mark.parametrize("operation", ["rebase", "rebase --apply", "bisect", "rebase of a detached HEAD", "detach"])
def test_a_checkout_rebasing_or_bisecting_a_branch_holds_it(env: Env, operation: str) -> None:
    """``git worktree list`` names no branch for a checkout mid-rebase or mid-bisect (HEAD is detached), yet
    the branch is theirs until it ends: the landing's holder is that checkout, busy, so the landing waits
    (a branch moved under a rebase makes ``rebase --continue`` fail and ``--abort`` drop what landed)."""
    from evolve.git import landing

    repo = env.repo
    op = Operator(env, seed=0)
    main = op.tip()
    side = op.commit_beside("refs/heads/side", main, "f.txt", "side\n", "side")
    op.commit("f.txt", "ours\n", "ours")
    op.ok("stash", "-q", "-u")  # a clean checkout for the operation
    if operation.startswith("rebase"):
        if operation.endswith("HEAD"):
            op.ok("checkout", "-q", "--detach")
        assert op.run("rebase", *operation.split()[1:2] if "apply" in operation else (), side).returncode != 0
    elif operation == "bisect":
        for n in range(3):  # enough commits for bisect to check one out in between
            op.commit(f"g{n}.txt", f"{n}\n", f"step {n}")
        op.ok("bisect", "start")
        op.ok("bisect", "bad")
        op.ok("bisect", "good", main)
    else:
        op.ok("checkout", "-q", "--detach")
    assert checked_out(repo) is None  # detached, whatever the operation
    holder = landing.holder_of(repo, "refs/heads/main")
    if operation in ("detach", "rebase of a detached HEAD"):
        assert holder is None  # nobody is on main: a landing may move it (compare-and-swap)
        return
    assert holder is not None and holder.path == repo
    snap = landing.snapshot(repo, landing.Want("refs/heads/main", op.tip("main"), side))
    assert snap.holder_busy and operation.split()[0] in snap.holder_busy, snap


ONE_EACH = [(a, how) for a, ways in OPERATOR_ACTIONS.items() for how in ways]


@pytest.mark.parametrize(("action", "how"), ONE_EACH, ids=[f"{a}-{h}" for a, h in ONE_EACH])
def test_the_operator_s_git_during_a_cycle(env: Env, action: str, how: str) -> None:
    """Each operator move on its own, made while a cycle's agent runs, then a clean fire: the invariants
    after every fire, and what the move means for the landing (replayed, on the planned branch, waiting)."""
    op = Operator(env, seed=ONE_EACH.index((action, how)))
    op.play(action, how)
    stats = op.finish()
    assert stats["improved commits checked"] > 0 and stats["branch moves checked"] > 0, stats


ROUNDS_EACH = 10


@pytest.mark.slow
def test_operator_nemesis(env: Env) -> None:
    """A seeded run of operator moves during cycles: every action several times, in a random order."""
    rng = random.Random(22)
    actions = [a for a in OPERATOR_ACTIONS for _ in range(ROUNDS_EACH)]  # each way of each picked by the seed
    rng.shuffle(actions)
    op = Operator(env, seed=22)
    for action in actions:
        op.play(action)
    stats = op.finish()
    print("\noperator nemesis")
    for key in sorted(stats):
        print(f"  {key:<52} {stats[key]:>6}")
    assert all(stats[f"action {a}"] == ROUNDS_EACH for a in OPERATOR_ACTIONS)
