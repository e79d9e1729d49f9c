"""How long ``evolve status`` takes, and how much memory, on a repository with a 10^6-line ledger.

Compares the wall time (median of N runs) of ``python -m evolve --repo R status`` with ``python -c pass``
(bare interpreter start) and ``python -c "import evolve.cli"`` (import cost), and measures each
command's peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper that runs it once).
The same status call on a 10^3-line repository shows that the ledger's length does not matter;
exits 1 when status on 10^6 lines is >= 1.5x status on 10^3 lines.

    python bench/status_startup.py [--runs 15] [--rebuild]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ledger_tail import MAX_RATIO, SIZES, bench_env, repo_for

RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def git_repo(repo: Path) -> Path:
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def wall(argv: list[str], env: dict[str, str], runs: int, warmup: int = 2) -> list[float]:
    out = []
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True)
        dt = time.perf_counter() - t0
        if i >= warmup:
            out.append(dt)
    return out


def peak_rss_kb(argv: list[str], env: dict[str, str]) -> int:
    """Peak RSS of ``argv`` alone: a fresh wrapper process whose only child is that command."""
    out = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], capture_output=True, text=True, env=env,
                         check=True)
    return int(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--rebuild", action="store_true", help="regenerate the ledgers")
    args = ap.parse_args(argv)

    repos = {label: git_repo(repo_for(label, rebuild=args.rebuild)) for label in SIZES}
    env = bench_env()
    py = sys.executable
    commands = {
        "python -c pass": [py, "-c", "pass"],
        'python -c "import evolve.cli"': [py, "-c", "import evolve.cli"],
        "evolve status (1e3 lines)": [py, "-m", "evolve", "--repo", str(repos["1e3"]), "status"],
        "evolve status (1e6 lines)": [py, "-m", "evolve", "--repo", str(repos["1e6"]), "status"],
    }
    size_mb = (repos["1e6"] / ".agents" / "evolve" / "cycle-history.jsonl").stat().st_size / 1e6
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, median of {args.runs} runs "
          f"(+2 warm-up); big ledger {SIZES['1e6']:,} lines / {size_mb:.0f} MB")

    med: dict[str, float] = {}
    fastest: dict[str, float] = {}
    rss: dict[str, int] = {}
    for name, cmd in commands.items():
        times = wall(cmd, env, args.runs)
        med[name], fastest[name] = statistics.median(times), min(times)
        rss[name] = peak_rss_kb(cmd, env)
    base = med["python -c pass"]
    print(f"\n{'command':<32} {'median ms':>10} {'min ms':>8} {'x pass':>7} {'peak RSS MB':>12}")
    for name in commands:
        print(f"{name:<32} {med[name] * 1e3:>10.1f} {fastest[name] * 1e3:>8.1f} {med[name] / base:>7.2f}"
              f" {rss[name] / 1024:>12.1f}")
    big, small = med["evolve status (1e6 lines)"], med["evolve status (1e3 lines)"]
    ratio = big / small
    print(f"\nevolve status on 1e6 vs 1e3 lines: {ratio:.2f}x (limit < {MAX_RATIO})")
    imp = med['python -c "import evolve.cli"']
    print(f"over a bare interpreter: import evolve.cli +{(imp - base) * 1e3:.1f} ms, "
          f"evolve status (1e6) +{(big - base) * 1e3:.1f} ms")
    if ratio >= MAX_RATIO:
        print("FAIL: status time grows with the ledger")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
