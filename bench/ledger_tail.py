"""Step 1 + reading the ledger tail must not get slower as the ledger grows (docs/DESIGN.md §3).

Builds a 10^3-line and a 10^6-line ledger of realistic entries under ``bench/.data/`` and times, on
each, what a fire does before its first cycle: ``Ledger.repair_torn()``, ``session_state.load_readonly``,
the halt snapshot (``step1.snapshot``), ``halt.evaluate`` and ``Ledger.last_cycle()``. Prints the
median of many repetitions per size and the ratio big/small; exits 1 when the ratio is >= 1.5.

    python bench/ledger_tail.py [--reps 200] [--rebuild]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import orjson

DATA = Path(__file__).resolve().parent / ".data"
SIZES = {"1e3": 10**3, "1e6": 10**6}
MAX_RATIO = 1.5

# One entry shaped like the ones evolve/cycle/fire.py writes (base_entry + agent_fields + gate fields).
_WORK = (
    b'{"cycle":%d,"result":"improved","timestamp":"2026-%02d-%02dT%02d:%02d:%02dZ",'
    b'"target":"Fix retry %d","selected_source":"harvested","work_ref":"e%d/retry-%d",'
    b'"mode":"harvested:task","session_id":"s%07d","fire_id":"%012x",'
    b'"duration_s":%d.4,"num_turns":%d,"cost_usd":0.%04d,"usage":{"input_tokens":%d,"output_tokens":%d,'
    b'"cache_read_input_tokens":%d,"cache_creation_input_tokens":%d},"context_pct":%d.5,'
    b'"context_heavy":false,"sha":"%012x"}\n'
)
_IDLE = (
    b'{"cycle":%d,"result":"unchanged","timestamp":"2026-%02d-%02dT%02d:%02d:%02dZ","target":"idle",'
    b'"selected_source":"idle","work_ref":null,"mode":"idle","session_id":null,"fire_id":"%012x"}\n'
)


def _line(c: int) -> bytes:
    mo, dd, hh, mi, ss = 1 + c % 12, 1 + c % 28, c % 24, c % 60, (c * 7) % 60
    if c % 3 == 0:  # one cycle in three idles
        return _IDLE % (c, mo, dd, hh, mi, ss, c // 3)
    return _WORK % (
        c, mo, dd, hh, mi, ss, c, c % 97, c, c % 10**7, c // 3,
        30 + c % 400, 3 + c % 40, c % 10**4, 2000 + c % 9000, 500 + c % 4000,
        50000 + c % 90000, 1000 + c % 5000, c % 39, c * 2654435761 % 2**48,
    )  # fmt: skip


def build_ledger(path: Path, lines: int) -> None:
    """Write ``lines`` entries (cycles 1..lines) straight as bytes; fast enough for 10^6 (~350 MB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".building")
    with open(tmp, "wb") as fh:
        chunk = 50_000
        for start in range(1, lines + 1, chunk):
            fh.write(b"".join(_line(c) for c in range(start, min(start + chunk, lines + 1))))
    os.replace(tmp, path)


def repo_for(label: str, *, rebuild: bool = False) -> Path:
    """``bench/.data/repo-<label>`` with ``.agents/evolve/cycle-history.jsonl`` of SIZES[label] lines."""
    lines = SIZES[label]
    repo = DATA / f"repo-{label}"
    evolve_dir = repo / ".agents" / "evolve"
    ledger = evolve_dir / "cycle-history.jsonl"
    stamp = evolve_dir / ".bench-lines"
    if rebuild or not ledger.exists() or not stamp.exists() or stamp.read_text().strip() != str(lines):
        t0 = time.perf_counter()
        build_ledger(ledger, lines)
        stamp.write_text(f"{lines}\n")
        size = ledger.stat().st_size
        print(f"built {ledger.relative_to(DATA.parent)}: {lines:,} lines, {size / 1e6:.1f} MB "
              f"({size / lines:.0f} B/line) in {time.perf_counter() - t0:.1f}s", flush=True)
    state = {"context_streak": 1, "parked_work": ["harvested:e1/retry-1"], "last_logged_cycle": lines,
             "last_result": "improved", "fire": None, "agentops_extra": {"kept": True}}
    (evolve_dir / "session-state.json").write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    (repo / ".agents" / ".gitignore").write_text("*\n")
    return repo


def bench_env() -> dict[str, str]:
    """No EVOLVE_* overrides, and a private XDG dir so a real global KILL cannot leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")}
    env["XDG_CONFIG_HOME"] = str(DATA / "xdg")
    return env


def make_step(repo: Path, *, with_state: bool):
    from evolve import config
    from evolve.cycle import halt, step1
    from evolve.cycle.fire import Fire, FireOptions
    from evolve.paths import Paths
    from evolve.store import session_state

    paths = Paths.for_repo(repo, env=bench_env())
    fire = Fire(paths, config.resolve({}, "x", {}), FireOptions(), env=bench_env())
    ledger = fire.ledger
    state_path = paths.state if with_state else paths.state.with_name("absent-session-state.json")

    def step() -> tuple[int, str | None]:
        now = time.time()
        ledger.repair_torn()
        fire.state = session_state.load_readonly(state_path, ledger)
        decision = halt.evaluate(step1.snapshot(fire.ctx, now))
        return ledger.last_cycle(), decision.halt

    return step


def measure(steps: dict[str, object], reps: int, warmup: int = 20) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(warmup + reps):
        for label, step in steps.items():  # interleaved, so drift hits both sizes alike
            t0 = time.perf_counter()
            step()  # type: ignore[operator]
            dt = time.perf_counter() - t0
            if i >= warmup:
                times[label].append(dt)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rebuild", action="store_true", help="regenerate the ledgers")
    args = ap.parse_args(argv)

    repos = {label: repo_for(label, rebuild=args.rebuild) for label in SIZES}
    from evolve.store.ledger import BLOCK

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.reps} reps (median), "
          f"ledger block reads of {BLOCK} B")
    worst = 0.0
    for with_state in (True, False):
        steps = {label: make_step(repo, with_state=with_state) for label, repo in repos.items()}
        for label, step in steps.items():
            last, decision = step()
            assert last == SIZES[label], (label, last)
            assert decision is None, decision
        times = measure(steps, args.reps)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["1e6"] / med["1e3"]
        worst = max(worst, ratio)
        what = "session-state.json present" if with_state else "session-state.json absent (rebuilt from ledger tail)"
        print(f"\nStep 1 + ledger tail, {what}:")
        for label in SIZES:
            deciles = statistics.quantiles(times[label], n=10)
            print(f"  {SIZES[label]:>9,} lines: median {med[label] * 1e6:8.1f} us"
                  f"  (p10 {deciles[0] * 1e6:.1f}, p90 {deciles[-1] * 1e6:.1f})")
        print(f"  ratio 1e6/1e3: {ratio:.2f}  (limit < {MAX_RATIO})")
    if worst >= MAX_RATIO:
        print(f"FAIL: Step 1 cost grows with the ledger (ratio {worst:.2f} >= {MAX_RATIO})")
        return 1
    print(f"\nOK: worst ratio {worst:.2f} < {MAX_RATIO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
