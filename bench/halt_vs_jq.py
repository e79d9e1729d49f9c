"""The same halt decision, side by side: bash + jq (``bench/halt_check.sh``) vs evolve's Step 1.

Builds a 10^6-line ledger (entries shaped like evolve's, work cycles carrying ``goals_passing`` /
``goals_total``; cached under ``bench/.data/halt/``) and, for each scenario below, sets the ledger's
last lines and the markers, then times in one run:

* ``bash bench/halt_check.sh --json``: a plain bash + jq implementation of the documented halt check
  (spec notes §3); it reads the whole ledger with one jq pass;
* evolve's Step 1 in-process: ``step1.run(fire.ctx, now, apply=False)`` after loading session-state, as a
  fire does before its first cycle (the cost evolve adds to a fire);
* evolve's Step 1 as a process: ``python -c`` that imports evolve and runs the same (what a cron
  job would pay to ask evolve instead of bash whether to halt);
* ``evolve fire --dry-run``: Step 1 plus selection plus the agent plan, as a process.

The two decisions must agree (bash's ``prior_cycle_fail`` is evolve's restorative mode: not a halt).
Prints medians and the ratios bash / evolve; exits 1 when a decision differs or when evolve (every
variant, including ``fire --dry-run``) is not at least 10x faster than bash + jq at 10^6 lines.

    python bench/halt_vs_jq.py [--bash-runs 3] [--runs 9] [--rebuild]
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

import orjson
from ledger_tail import _line

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data" / "halt"
SCRIPT = HERE / "halt_check.sh"
LINES = 10**6
SMALL = 10**3
MIN_SPEEDUP = 10.0
DAY = 86400


def goals_line(c: int) -> bytes:
    """ledger_tail's entry for cycle ``c``; work cycles also carry goals (9 of 10 passing, flat)."""
    line = _line(c)
    if b'"result":"improved"' in line:
        line = line[:-2] + b',"goals_passing":9,"goals_total":10,"goals_era":"e1"}\n'
    return line


def build(path: Path, lines: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".building")
    with open(tmp, "wb") as fh:
        for start in range(1, lines + 1, 50_000):
            fh.write(b"".join(goals_line(c) for c in range(start, min(start + 50_000, lines + 1))))
    os.replace(tmp, path)


def entry(cycle: int, **kw: object) -> bytes:
    base = {"cycle": cycle, "result": "improved", "timestamp": "2026-11-30T00:00:00Z", "target": "t",
            "selected_source": "harvested", "work_ref": "e/x", "mode": "harvested:task"}
    return orjson.dumps({**base, **kw}, option=orjson.OPT_APPEND_NEWLINE)


# name -> (ledger tail lines (given the next cycle number), markers {name: age in days}, bash, evolve)
SCENARIOS: dict[str, tuple[Callable[[int], bytes], dict[str, float], str | None, str | None]] = {
    "continue (HANDOFF present)": (
        lambda c: entry(c, goals_passing=9, goals_total=10, goals_era="e1"), {"HANDOFF": 0}, None, None),
    "goal_regression": (
        lambda c: entry(c, goals_passing=9, goals_total=10, goals_era="e1")
        + entry(c + 1, goals_passing=8, goals_total=10, goals_era="e1"), {}, "goal_regression", "goal_regression"),
    "prior_cycle_fail": (
        lambda c: entry(c, result="BLOCKED: gate red", gate="BLOCKED"), {}, "prior_cycle_fail", "restorative"),
    "stale STOP (30 days)": (lambda c: b"", {"STOP": 30}, None, None),
    "user_halt (fresh STOP)": (lambda c: b"", {"STOP": 0}, "user_halt", "user_halt"),
    "dormant (nothing queued)": (lambda c: b"", {"DORMANT": 0}, "dormant", "dormant"),
}


class Repo:
    def __init__(self, lines: int, rebuild: bool) -> None:
        self.lines = lines
        self.repo = DATA / f"repo-{lines}"
        self.evolve_dir = self.repo / ".agents" / "evolve"
        self.ledger = self.evolve_dir / "cycle-history.jsonl"
        stamp = self.evolve_dir / ".bench-lines"
        if not (self.repo / ".git").exists():
            self.evolve_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "init", "-q", str(self.repo)], check=True)
            (self.repo / ".agents" / ".gitignore").write_text("*\n")
        if rebuild or not self.ledger.exists() or not stamp.exists() or stamp.read_text() != str(lines):
            t0 = time.perf_counter()
            build(self.ledger, lines)
            stamp.write_text(str(lines))
            print(f"built {self.ledger.relative_to(HERE)}: {lines:,} lines, "
                  f"{self.ledger.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f}s", flush=True)
        self.size = self.ledger.stat().st_size
        (self.evolve_dir / "config.toml").write_text('[work]\nbeads_command = ["evolve-bench-no-such-tracker"]\n')
        self.state = orjson.dumps({"last_logged_cycle": lines, "last_result": "improved"})

    def setup(self, scenario: str) -> None:
        """The base ledger plus the scenario's last lines, its markers, an empty queue; nothing else."""
        tail, markers, _, _ = SCENARIOS[scenario]
        with open(self.ledger, "r+b") as fh:
            fh.truncate(self.size)
            fh.seek(self.size)
            fh.write(tail(self.lines + 1))
        (self.evolve_dir / "session-state.json").write_bytes(self.state)
        for name in ("STOP", "KILL", "DORMANT", "HANDOFF", "ACK-REGRESSION", "cycle-state.json"):
            (self.evolve_dir / name).unlink(missing_ok=True)
        now = time.time()
        for name, age_days in markers.items():
            p = self.evolve_dir / name
            p.write_text(f"bench {name}\n")
            os.utime(p, (now - age_days * DAY, now - age_days * DAY))
        shutil.rmtree(self.repo / ".agents" / "rpi", ignore_errors=True)


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")}
    e["XDG_CONFIG_HOME"] = str(DATA / "xdg")
    e["PATH"] = os.pathsep.join(p for p in e.get("PATH", "").split(os.pathsep) if not shutil.which("bd", path=p))
    return e


def bash_halt(r: Repo) -> tuple[str | None, str]:
    p = subprocess.run(["bash", str(SCRIPT), "--json"], cwd=r.repo, capture_output=True, env=env(), check=False)
    out = orjson.loads(p.stdout)
    assert p.returncode == (1 if out["halt"] else 0), (p.returncode, out)
    return out["halt_reason"], p.stderr.decode()


STEP1_PROC = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from evolve import config, log\n"
    "from evolve.cycle import step1\n"
    "from evolve.cycle.fire import Fire, FireOptions\n"
    "from evolve.paths import Paths\n"
    "from evolve.store import session_state\n"
    "log.configure(json=True, stream=open('/dev/null', 'w'))\n"
    "paths = Paths.for_repo(Path(sys.argv[1]))\n"
    "fire = Fire(paths, config.load(paths.config, {}), FireOptions(dry_run=True))\n"
    "fire.state = session_state.load_readonly(paths.state, fire.ledger)\n"
    "d = step1.run(fire.ctx, time.time(), apply=False)\n"
    "print(d.halt or ('restorative' if d.restorative else ''))\n"
)


_DEVNULL = open(os.devnull, "wb")  # noqa: SIM115  (the log sink for the in-process runs, kept open)


def evolve_step1(r: Repo):
    """A ready-to-call Step 1 like a fire's: state loaded, then ``step1.run(apply=False)``."""
    from evolve import config, log
    from evolve.cycle import step1
    from evolve.cycle.fire import Fire, FireOptions
    from evolve.paths import Paths
    from evolve.store import session_state

    log.configure(json=True, stream=_DEVNULL)
    paths = Paths.for_repo(r.repo, env=env())

    def step() -> str | None:
        fire = Fire(paths, config.load(paths.config, {}), FireOptions(dry_run=True), env=env())
        fire.state = session_state.load_readonly(paths.state, fire.ledger)
        d = step1.run(fire.ctx, time.time(), apply=False)
        return d.halt or ("restorative" if d.restorative else None)

    return step


def timed(fn: Callable[[], object], runs: int, before: Callable[[], None] | None = None,
          warmup: int = 1) -> tuple[list[float], object]:
    times, last = [], None
    for i in range(warmup + runs):
        if before:
            before()
        t0 = time.perf_counter()
        last = fn()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    return times, last


def proc(argv: list[str], cwd: Path) -> Callable[[], str]:
    def run() -> str:
        p = subprocess.run(argv, cwd=cwd, capture_output=True, env=env(), check=False)
        if p.returncode not in (0, 1):
            raise SystemExit(f"{argv[:4]} exited {p.returncode}: {p.stderr.decode()[-500:]}")
        return p.stdout.decode()
    return run


def fmt(s: float) -> str:
    return f"{s * 1e3:10.1f} ms" if s >= 0.001 else f"{s * 1e6:10.1f} us"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bash-runs", type=int, default=3, help="bash + jq runs per scenario at 1e6 (default 3)")
    ap.add_argument("--runs", type=int, default=9, help="runs of each evolve process (default 9)")
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args(argv)
    jq = subprocess.run(["jq", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    bash = subprocess.run(["bash", "--version"], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    big, small = Repo(LINES, args.rebuild), Repo(SMALL, args.rebuild)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; {jq}; {bash}")
    print(f"ledger {LINES:,} lines / {big.size / 1e6:.0f} MB (warm page cache); bash + jq: median of "
          f"{args.bash_runs}; evolve processes: median of {args.runs}; in-process Step 1: median of 200\n")

    failures: list[str] = []
    py = sys.executable
    rows = []
    for repo, names in ((big, list(SCENARIOS)), (small, ["continue (HANDOFF present)", "goal_regression"])):
        for name in names:
            _, _, want_bash, want_evolve = SCENARIOS[name]
            before = lambda r=repo, n=name: r.setup(n)  # noqa: E731
            runs_b = args.bash_runs if repo is big else max(args.runs, 5)
            tb, (got_bash, stderr) = timed(lambda r=repo: bash_halt(r), runs_b, before,  # type: ignore[misc]
                                           warmup=0 if repo is big else 1)
            ti, got_evolve = timed(evolve_step1(repo), 200, before, warmup=20)
            tp, out_p = timed(proc([py, "-c", STEP1_PROC, str(repo.repo)], repo.repo), args.runs, before)
            td, out_d = timed(proc([py, "-m", "evolve", "--repo", str(repo.repo), "fire", "--dry-run"], repo.repo),
                              args.runs, before)
            repo.setup(name)
            proc_decision = (out_p.strip() or None) if isinstance(out_p, str) else None
            step1 = orjson.loads(out_d[out_d.index("{\n"):])["step1"] if isinstance(out_d, str) else {}
            dry_decision = step1.get("halt") or ("restorative" if step1.get("restorative") else None)
            agree = got_bash == want_bash and want_evolve == got_evolve == proc_decision == dry_decision
            if "STALE" in name.upper() and "STALE" not in stderr:
                agree = False
            if not agree:
                failures.append(f"{name} ({repo.lines:,} lines): bash said {got_bash!r}, evolve {got_evolve!r} / "
                                f"{proc_decision!r} / {dry_decision!r}; expected {want_bash!r} / {want_evolve!r}")
            rows.append((repo.lines, name, got_bash, got_evolve, *(statistics.median(t) for t in (tb, ti, tp, td))))

    print(f"  {'lines':>9}  {'scenario':<27} {'bash decision':<17} {'evolve decision':<16}"
          f"{'bash+jq':>13} {'Step 1 in-proc':>15} {'Step 1 proc':>13} {'fire --dry-run':>15}"
          f"  {'x in-proc':>9} {'x proc':>7} {'x dry-run':>9}")
    for lines, name, gb, ge, b, i, p, d in rows:
        print(f"  {lines:>9,}  {name:<27} {gb or 'continue':<17} {ge or 'continue':<16}"
              f"{fmt(b):>13} {fmt(i):>15} {fmt(p):>13} {fmt(d):>15}  {b / i:>9.0f} {b / p:>7.1f} {b / d:>9.1f}")
        if lines == LINES and gb not in ("user_halt", "kill", "dormant") and min(b / p, b / d) < MIN_SPEEDUP:
            failures.append(f"{name}: evolve is only {min(b / p, b / d):.1f}x faster than bash + jq "
                            f"(limit >= {MIN_SPEEDUP:g}x)")
    print("\n  x = bash + jq time / evolve time, same scenario, same run. Scenarios decided by a marker")
    print("  (user_halt, dormant) stop before the ledger in both, so the ledger's size does not matter there.")
    print()
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print(f"OK: every decision agrees; at {LINES:,} lines evolve is >= {MIN_SPEEDUP:g}x faster wherever the "
              "ledger is read")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
