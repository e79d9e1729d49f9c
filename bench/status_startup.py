"""How long ``evolve status`` and ``evolve hook session-start`` take, and how much memory.

Compares the wall time (median of N rounds; each round runs every command once, so load hits them
alike) of ``python -m evolve --repo R status`` on a 10^3- and a 10^6-line ledger, ``status --json``,
and the SessionStart hook (``python -m evolve hook session-start`` with a ``startup`` payload on
stdin, which runs the autocompact check) with ``python -c pass`` (bare interpreter start) and
``python -c "import evolve.cli"`` (import cost), and measures each command's peak RSS
(``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper that runs it once).

The evolve package is byte-compiled first (``compileall``), as ``pip install`` does: with
``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` every run would recompile the sources (~30 ms).

Exits 1 when status on 10^6 lines takes >= 1.5x status on 10^3 lines, when ``evolve status`` (10^6
lines) takes >= 3x ``python -c pass``, or when the hook takes >= 2x ``python -c pass``.

    python bench/status_startup.py [--runs 15] [--rebuild]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ledger_tail import MAX_RATIO, SIZES, bench_env, repo_for

MAX_STATUS_X = 3.0  # evolve status / python -c pass
MAX_HOOK_X = 2.0  # evolve hook session-start / python -c pass: it runs at every agent session start

RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, input=sys.stdin.buffer.read())\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)

Command = tuple[list[str], bytes]  # argv, stdin


def git_repo(repo: Path) -> Path:
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def byte_compile() -> None:
    import evolve

    compileall.compile_dir(Path(evolve.__file__).parent, quiet=1)


def wall(cmds: dict[str, Command], env: dict[str, str], cwd: Path, runs: int, warmup: int = 2
         ) -> dict[str, list[float]]:
    """Wall times per command, in rounds (each command once per round)."""
    out: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(warmup + runs):
        for name, (argv, stdin) in cmds.items():
            t0 = time.perf_counter()
            rc = subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, env=env, cwd=cwd).returncode
            dt = time.perf_counter() - t0
            if rc not in (0, 1):  # 1: status says DEGRADED (e.g. no agent CLI on this PATH): still a status
                raise SystemExit(f"{name}: exit {rc}")
            if i >= warmup:
                out[name].append(dt)
    return out


def peak_rss_kb(cmd: Command, env: dict[str, str], cwd: Path) -> int:
    """Peak RSS of ``argv`` alone: a fresh wrapper process whose only child is that command."""
    argv, stdin = cmd
    out = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], input=stdin, capture_output=True,
                         env=env, cwd=cwd, check=True)
    return int(out.stdout.strip())


def verdicts(med: dict[str, float]) -> list[str]:
    """The checks, printed; the failed ones returned."""
    base = med["python -c pass"]
    big, small = med["evolve status (1e6 lines)"], med["evolve status (1e3 lines)"]
    hook = med["evolve hook session-start"]
    checks = [
        ("evolve status on 1e6 vs 1e3 lines", big / small, MAX_RATIO),
        ("evolve status (1e6 lines) / python -c pass", big / base, MAX_STATUS_X),
        ("evolve hook session-start / python -c pass", hook / base, MAX_HOOK_X),
    ]
    failed = []
    print()
    for what, ratio, limit in checks:
        ok = ratio < limit
        print(f"{what}: {ratio:.2f}x (limit < {limit}) {'OK' if ok else 'FAIL'}")
        if not ok:
            failed.append(f"{what}: {ratio:.2f}x")
    imp = med['python -c "import evolve.cli"']
    print(f"over a bare interpreter: import evolve.cli +{(imp - base) * 1e3:.1f} ms, "
          f"evolve status (1e6) +{(big - base) * 1e3:.1f} ms, hook +{(hook - base) * 1e3:.1f} ms")
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--rebuild", action="store_true", help="regenerate the ledgers")
    args = ap.parse_args(argv)

    repos = {label: git_repo(repo_for(label, rebuild=args.rebuild)) for label in SIZES}
    env = bench_env()
    byte_compile()
    py = sys.executable
    hook_payload = b'{"hook_event_name": "SessionStart", "source": "startup", "session_id": "bench"}'
    commands: dict[str, Command] = {
        "python -c pass": ([py, "-c", "pass"], b""),
        'python -c "import evolve.cli"': ([py, "-c", "import evolve.cli"], b""),
        "evolve status (1e3 lines)": ([py, "-m", "evolve", "--repo", str(repos["1e3"]), "status"], b""),
        "evolve status (1e6 lines)": ([py, "-m", "evolve", "--repo", str(repos["1e6"]), "status"], b""),
        "evolve status --json (1e6 lines)": ([py, "-m", "evolve", "--repo", str(repos["1e6"]), "status", "--json"],
                                             b""),
        "evolve hook session-start": ([py, "-m", "evolve", "hook", "session-start"], hook_payload),
    }
    size_mb = (repos["1e6"] / ".agents" / "evolve" / "cycle-history.jsonl").stat().st_size / 1e6
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, median of {args.runs} rounds "
          f"(+2 warm-up); big ledger {SIZES['1e6']:,} lines / {size_mb:.0f} MB")

    cwd = repos["1e3"]  # the hook's project (the payload has no cwd)
    times = wall(commands, env, cwd, args.runs)
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["python -c pass"]
    print(f"\n{'command':<34} {'median ms':>10} {'min ms':>8} {'x pass':>7} {'peak RSS MB':>12}")
    for name, cmd in commands.items():
        rss = peak_rss_kb(cmd, env, cwd)
        print(f"{name:<34} {med[name] * 1e3:>10.1f} {min(times[name]) * 1e3:>8.1f} {med[name] / base:>7.2f}"
              f" {rss / 1024:>12.1f}")
    failed = verdicts(med)
    for f in failed:
        print(f"FAIL: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
