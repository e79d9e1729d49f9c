"""What a fire costs besides the agent, against the ledger's and the queue's size; start-up and memory.

Fire overhead is everything one ``evolve fire --cycles 1`` does around an agent that exits at once:
the lock, repairing the ledger tail, loading session-state, reconciling, Step 1, selection, the claim,
the gate (git), the ledger entry, the state saves and finalizing the claim. The agent is the real
scripted agent, ``python -m evolve.agent.scripted`` with a one-step script reporting ``unchanged``
(it writes nothing, so there is nothing to commit). Each fire runs in-process (``Fire(...).run()``)
on a real git repository; the agent's own wall time (its process start-up and run) is timed apart
and subtracted: overhead = fire - agent.

Configurations: ledgers of 10^3, 10^4, 10^5 and 10^6 lines (written as bytes, cached under
``bench/.data/fire/``) with a 10^2-item queue; queues of 10^2..10^5 items with the 10^3-line ledger;
and the corner 10^6 lines x 10^5 items. Before each rep the ledger is truncated back, session-state
and the queue restored, so every fire starts from the same state; reps are interleaved across
configurations so that machine noise hits them alike. Exits 1 when overhead(10^6 lines) /
overhead(10^3 lines) > 1.5 at either queue size.

A second part times, as separate processes (median of N): ``python -c pass``, ``evolve status``
(10^6-line ledger), ``evolve --version`` (when the CLI has it) and a whole ``evolve fire --cycles 1``
at 10^3 and 10^6 lines, and measures the peak RSS of the evolve process itself (the agent and git
are other processes) for a fire and for status. Exits 1 when status takes >= 3x ``python -c pass``
or a peak RSS reaches 60 MB.

    python bench/fire_overhead.py [--reps 15] [--runs 15] [--quick] [--rebuild]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from ledger_tail import build_ledger
from status_startup import byte_compile

DATA = Path(__file__).resolve().parent / ".data" / "fire"
LEDGERS = {"1e3": 10**3, "1e4": 10**4, "1e5": 10**5, "1e6": 10**6}
QUEUES = {"1e2": 10**2, "1e3": 10**3, "1e4": 10**4, "1e5": 10**5}
CONFIGS = [("1e3", "1e2"), ("1e4", "1e2"), ("1e5", "1e2"), ("1e6", "1e2"),
           ("1e3", "1e3"), ("1e3", "1e4"), ("1e3", "1e5"), ("1e6", "1e5")]
MAX_RATIO = 1.5
MAX_STATUS_X = 3.0
MAX_RSS_MB = 60.0
STEP = {"steps": [{"report": {"result": "unchanged", "summary": "nothing to do"}}]}


# -- data ------------------------------------------------------------------------------------------


def _stamped(path: Path, want: str, build: Callable[[], None], what: str, force: bool = False) -> bool:
    """Build ``path`` unless it exists with the stamp ``want``; returns whether it was built."""
    stamp = path.with_name(path.name + ".stamp")
    if not force and path.exists() and stamp.exists() and stamp.read_text() == want:
        return False
    t0 = time.perf_counter()
    build()
    stamp.write_text(want)
    print(f"built {what}: {path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f}s", flush=True)
    return True


def queue_bytes(n_items: int) -> bytes:
    """A v1.4 queue of ``n_items`` items, 10 per entry: a third of the entries consumed, the rest open
    with a mix of selectable, claimed, blocked, deferred and foreign items (shaped like real ones)."""
    kinds = ["bug", "tech-debt", "improvement", "docs", "chore", "feature"]
    sev = ["high", "medium", "low"]
    out = []
    for e in range(max(1, n_items // 10)):
        consumed = e % 3 == 0
        items = []
        for i in range(10):
            k = e * 10 + i
            item: dict[str, Any] = {
                "title": f"Fix retry handling in module {k % 997} (case {k})",
                "description": (f"The retry loop in module {k % 997} swallows the last error and reports success; "
                                "make it re-raise after the final attempt and add a test that pins the "
                                f"behaviour. Seen in cycle {k}; evidence attached. ") * 2,
                "type": kinds[k % len(kinds)], "severity": sev[k % 3], "source": "council-finding",
                "dedup_key": f"retry-{k}", "evidence": {"file": f"src/mod{k % 997}.py", "line": k % 400},
            }
            r = k % 10
            if consumed:
                item.update(consumed=True, claim_status="consumed", consumed_by="evolve:cycle-1")
            elif r == 0:
                item.update(claim_status="in_progress", claimed_by="someone")
            elif r == 1:
                item["status"] = "blocked"
            elif r == 2:
                item["disposition"] = "defer:later"
            elif r == 3:
                item["target_repo"] = "other/repo"
            elif r == 4:
                item["target_repo"] = "*"
            items.append(item)
        out.append({"source_epic": f"epic-{e}", "timestamp": "2026-11-01T00:00:00Z", "consumed": consumed,
                    "claim_status": "consumed" if consumed else "available", "items": items})
    return b"".join(orjson.dumps(x, option=orjson.OPT_APPEND_NEWLINE) for x in out)


def git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)


def repo_for(label: str, rebuild: bool) -> Path:
    """A git repository whose ledger has LEDGERS[label] lines (ledger cached across runs)."""
    repo = DATA / f"repo-{label}"
    evolve_dir = repo / ".agents" / "evolve"
    evolve_dir.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        git(repo, "init", "-q")
        (repo / "README.md").write_text("# bench\n")
        (repo / ".agents" / ".gitignore").write_text("*\n")
        git(repo, "add", "README.md")
        git(repo, "commit", "-q", "-m", "initial")
    ledger = evolve_dir / "cycle-history.jsonl"
    n = LEDGERS[label]
    pristine = ledger.with_name(".pristine-size")
    what = f"{label}-line ledger {ledger.relative_to(DATA.parent.parent)}"
    if _stamped(ledger, str(n), lambda: build_ledger(ledger, n), what, force=rebuild or not pristine.exists()):
        pristine.write_text(str(ledger.stat().st_size))
    with open(ledger, "r+b") as fh:  # lines a fire appended (an interrupted run) go: every run starts the same
        fh.truncate(int(pristine.read_text()))
    return repo


def queue_for(label: str) -> Path:
    path = DATA / f"queue-{label}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    _stamped(path, str(QUEUES[label]), lambda: path.write_bytes(queue_bytes(QUEUES[label])),
             f"{label}-item queue {path.name}")
    return path


def bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")}
    env["XDG_CONFIG_HOME"] = str(DATA / "xdg")  # a real global KILL cannot leak in
    return env


def write_config(repo: Path, script: Path) -> None:
    argv = orjson.dumps([sys.executable, "-m", "evolve.agent.scripted", "--script", str(script)]).decode()
    (repo / ".agents" / "evolve" / "config.toml").write_text(
        f'[agent]\nrunner = "command"\nargv = {argv}\ntimeout_s = 60\nidle_timeout_s = 30\n\n'
        '[work]\nbeads_command = ["evolve-bench-no-such-tracker"]\n')


class Setup:
    """One configuration: a repo, its pristine ledger size and state, and the queue it starts from."""

    def __init__(self, lkey: str, qkey: str) -> None:
        self.lkey, self.qkey = lkey, qkey
        self.repo = repo_for(lkey, False)
        self.queue = queue_for(qkey)
        self.evolve_dir = self.repo / ".agents" / "evolve"
        self.ledger = self.evolve_dir / "cycle-history.jsonl"
        self.size = int(self.ledger.with_name(".pristine-size").read_text())
        self.lines = LEDGERS[lkey]
        self.script = DATA / "agent.json"
        self.script.write_bytes(orjson.dumps(STEP))
        write_config(self.repo, self.script)
        self.state = orjson.dumps({"last_logged_cycle": self.lines, "last_result": "improved",
                                   "context_streak": 0, "agentops_extra": {"kept": True}})

    def reset(self) -> None:
        with open(self.ledger, "r+b") as fh:
            fh.truncate(self.size)
        (self.evolve_dir / "session-state.json").write_bytes(self.state)
        for name in ("cycle-state.json", "HANDOFF", "DORMANT", "STOP"):
            (self.evolve_dir / name).unlink(missing_ok=True)
        nextwork = self.repo / ".agents" / "rpi" / "next-work.jsonl"
        nextwork.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.queue, nextwork)
        self.script.with_name(self.script.name + ".pos").unlink(missing_ok=True)
        self.script.with_name(self.script.name + ".calls.jsonl").unlink(missing_ok=True)


# -- in-process fires ------------------------------------------------------------------------------


PHASES = ("step1", "selection", "claim+finalize", "ledger append", "state saves", "agent")


def timed_fire(s: Setup) -> dict[str, float]:
    """One fire in this process; returns the wall time of the whole and of the phases we can wrap."""
    from evolve import config
    from evolve.cycle import step1
    from evolve.cycle.fire import Fire, FireOptions
    from evolve.paths import Paths

    s.reset()
    env = bench_env()
    t: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def wrap(obj: Any, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                t[phase] += time.perf_counter() - t0

        setattr(obj, name, timed)

    t0 = time.perf_counter()
    paths = Paths.for_repo(s.repo, env=env)
    cfg = config.load(paths.config, env)
    fire = Fire(paths, cfg, FireOptions(cycles=1), env=env)
    step1_run = step1.run  # a module function: timed for this fire, put back after it
    wrap(step1, "run", "step1")
    wrap(fire.selector, "select", "selection")
    wrap(fire.selector.harvested, "claim", "claim+finalize")
    wrap(fire.selector.harvested, "finalize", "claim+finalize")
    wrap(fire.ledger, "append", "ledger append")
    wrap(fire.ctx, "save", "state saves")
    make_runner = fire._runner

    def runner() -> Any:
        r = make_runner()
        wrap(r, "run", "agent")
        return r

    fire._runner = runner  # type: ignore[method-assign]
    try:
        outcome = fire.run()
    finally:
        step1.run = step1_run
    t["total"] = time.perf_counter() - t0
    assert outcome.exit_code == 0 and outcome.cycles == 1, outcome
    entry = outcome.entries[-1]
    assert entry["cycle"] == s.lines + 1 and entry["selected_source"] == "harvested", entry
    assert entry["result"] == "unchanged", entry
    t["overhead"] = t["total"] - t["agent"]
    return t


def run_fires(setups: list[Setup], reps: int, warmup: int = 2) -> dict[tuple[str, str], list[dict[str, float]]]:
    from evolve import log

    devnull = open(os.devnull, "wb")  # noqa: SIM115
    log.configure(json=True, stream=devnull)
    out: dict[tuple[str, str], list[dict[str, float]]] = {(s.lkey, s.qkey): [] for s in setups}
    for i in range(warmup + reps):
        for s in setups:
            t = timed_fire(s)
            if i >= warmup:
                out[(s.lkey, s.qkey)].append(t)
    for s in setups:
        s.reset()
    return out


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


# -- separate processes ----------------------------------------------------------------------------

# VmHWM is the high-water mark of this process image's own memory. (getrusage's ru_maxrss is not: Linux
# carries it across exec from the forked parent, which here is this big benchmark process.)
RSS_SELF = (
    "import re, sys\n"
    "from evolve.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "hwm = re.search(r'VmHWM:\\s*(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
    "sys.stderr.write('\\nPEAK_RSS_KB %s\\n' % hwm)\n"
    "sys.exit(code)\n"
)


def wall(cmds: dict[str, tuple[list[str], Callable[[], None] | None]], env: dict[str, str], runs: int,
         warmup: int = 2) -> dict[str, list[float]]:
    """Wall times per command, run in rounds (each command once per round) so load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(warmup + runs):
        for name, (argv, before) in cmds.items():
            if before:
                before()
            t0 = time.perf_counter()
            p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
            dt = time.perf_counter() - t0
            if p.returncode != 0:
                raise SystemExit(f"{argv} exited {p.returncode}: {p.stderr.decode()[-500:]}")
            if i >= warmup:
                times[name].append(dt)
    return times


def peak_rss_mb(args: list[str], env: dict[str, str], before: Callable[[], None] | None = None) -> float:
    """Peak RSS of the evolve process itself (the CLI run in-process by a wrapper: imports included)."""
    if before:
        before()
    p = subprocess.run([sys.executable, "-c", RSS_SELF, *args], capture_output=True, env=env, check=False)
    for line in p.stderr.decode().splitlines():
        if line.startswith("PEAK_RSS_KB "):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no peak RSS from {args}: exit {p.returncode} {p.stderr.decode()[-500:]}")


def has_version(env: dict[str, str]) -> bool:
    p = subprocess.run([sys.executable, "-m", "evolve", "--version"], capture_output=True, env=env, check=False)
    return p.returncode == 0


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="in-process fires per configuration (default 15)")
    ap.add_argument("--runs", type=int, default=15, help="runs per separate-process command (default 15)")
    ap.add_argument("--quick", action="store_true", help="only 1e3 and 1e6 lines at 1e2 items; fewer runs")
    ap.add_argument("--rebuild", action="store_true", help="regenerate the cached ledgers")
    args = ap.parse_args(argv)
    configs = [("1e3", "1e2"), ("1e6", "1e2")] if args.quick else CONFIGS
    reps, runs = (5, 5) if args.quick else (args.reps, args.runs)
    failures: list[str] = []

    if args.rebuild:
        for lk in dict.fromkeys(lk for lk, _ in configs):
            repo_for(lk, True)
    setups = [Setup(lk, qk) for lk, qk in configs]
    byte_compile()  # as `pip install` does: the separate-process timings then match an installed evolve
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; {reps} in-process fires per configuration "
          f"(median, interleaved, after 2 warm-ups)")
    res = run_fires(setups, reps)

    print("\n(a) one fire, in-process; agent = python -m evolve.agent.scripted (one step, reports unchanged)")
    hdr = "".join(f"{p:>15}" for p in PHASES[:-1])
    print(f"  {'ledger':>9} {'queue':>8} {'fire ms':>9} {'agent ms':>9} {'overhead':>9} |{hdr}")
    for lk, qk in configs:
        rows = res[(lk, qk)]
        phases = "".join(f"{med(rows, p) * 1e3:>15.2f}" for p in PHASES[:-1])
        print(f"  {LEDGERS[lk]:>9,} {QUEUES[qk]:>8,} {med(rows, 'total') * 1e3:>9.1f} {med(rows, 'agent') * 1e3:>9.1f}"
              f" {med(rows, 'overhead') * 1e3:>9.1f} |{phases}")
    print("  (overhead = fire - agent; the phase columns are parts of it; the rest is the lock, state load,"
          " reconcile, git and the gate)")
    for qk in ("1e2", "1e5"):
        if ("1e3", qk) in res and ("1e6", qk) in res:
            ratio = med(res[("1e6", qk)], "overhead") / med(res[("1e3", qk)], "overhead")
            total = med(res[("1e6", qk)], "total") / med(res[("1e3", qk)], "total")
            verdict = "OK" if ratio <= MAX_RATIO else "FAIL"
            print(f"  ledger 1e6/1e3 at {QUEUES[qk]:,} queue items: overhead ratio {ratio:.2f}, whole fire {total:.2f}"
                  f"  (limit <= {MAX_RATIO}) {verdict}")
            if ratio > MAX_RATIO:
                failures.append(f"fire overhead grows with the ledger at {QUEUES[qk]:,} items: {ratio:.2f}")
    if ("1e3", "1e5") in res:
        ratio = med(res[("1e3", "1e5")], "overhead") / med(res[("1e3", "1e2")], "overhead")
        print(f"  queue 1e5/1e2 at 1,000 ledger lines: overhead ratio {ratio:.2f} (no target; for the record)")

    print(f"\n(b) separate processes, median of {runs} (+2 warm-up), interleaved")
    env = bench_env()
    big, small = Setup("1e6", "1e2"), Setup("1e3", "1e2")
    py = sys.executable
    cmds: dict[str, tuple[list[str], Callable[[], None] | None]] = {
        "python -c pass": ([py, "-c", "pass"], None),
        "evolve status (1e6 lines)": ([py, "-m", "evolve", "--repo", str(big.repo), "status"], big.reset),
    }
    version = has_version(env)
    if version:
        cmds["evolve --version"] = ([py, "-m", "evolve", "--version"], None)
    for s in (small, big):
        cmds[f"evolve fire --cycles 1 ({s.lkey} lines)"] = (
            [py, "-m", "evolve", "--repo", str(s.repo), "fire", "--cycles", "1"], s.reset)
    times = wall(cmds, env, runs)
    small.reset()
    big.reset()
    base = statistics.median(times["python -c pass"])
    print(f"  {'command':<34} {'median ms':>10} {'min ms':>8} {'x pass':>7}")
    for name, ts in times.items():
        print(f"  {name:<34} {statistics.median(ts) * 1e3:>10.1f} {min(ts) * 1e3:>8.1f}"
              f" {statistics.median(ts) / base:>7.2f}")
    if not version:
        print("  evolve --version: not available (the CLI has no --version flag)")
    sx = statistics.median(times["evolve status (1e6 lines)"]) / base
    verdict = "OK" if sx < MAX_STATUS_X else "FAIL"
    print(f"  evolve status / python -c pass: {sx:.2f}x (limit < {MAX_STATUS_X}) {verdict}")
    if sx >= MAX_STATUS_X:
        failures.append(f"evolve status takes {sx:.2f}x python -c pass")
    fire_x = (statistics.median(times["evolve fire --cycles 1 (1e6 lines)"])
              / statistics.median(times["evolve fire --cycles 1 (1e3 lines)"]))
    print(f"  evolve fire --cycles 1, 1e6 vs 1e3 lines: {fire_x:.2f}x")

    print("\n(c) peak RSS of the evolve process (imports included; the agent and git are separate processes)")
    rss = {"evolve status (1e6 lines)": peak_rss_mb(["--repo", str(big.repo), "status"], env, big.reset)}
    for lk, qk in configs:
        s = Setup(lk, qk)
        rss[f"evolve fire --cycles 1 ({lk} lines, {qk} items)"] = peak_rss_mb(
            ["--repo", str(s.repo), "fire", "--cycles", "1"], env, s.reset)
        s.reset()
    big.reset()
    for name, mb in rss.items():
        verdict = "OK" if mb < MAX_RSS_MB else "FAIL"
        print(f"  {name:<44} {mb:>6.1f} MB  (limit < {MAX_RSS_MB:g} MB) {verdict}")
        if mb >= MAX_RSS_MB:
            failures.append(f"peak RSS of {name}: {mb:.1f} MB")

    print()
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print("OK: all targets met")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
