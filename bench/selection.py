"""How long one work selection takes (SPEC §6), against the agent's own start-up as the yardstick.

Builds, in a temporary directory:

* harvested queues (``next-work.jsonl``, schema v1.4) of 10^3, 10^4 and 10^5 items (10 items per
  entry, realistic fields; a mix of consumed entries, claimed items, blocked / gated / deferred /
  other-repo items and selectable ones), plus a 10^5-item queue with **no** selectable item;
* a fake ``bd`` (a Python script on a temporary PATH) that prints 10^3 ready beads as JSON;
* a ``git init`` repository.

Then measures (median of several runs):

a. ``HarvestedQueue.candidates()`` on 10^3, 10^4 and 10^5 items, and the per-item cost ratio
   10^5/10^3 (1.0 = linear); the same with the cyclic GC disabled is printed as a diagnostic;
b. one full ``Selector.select()`` (``evolve/cycle/select.py``) with ``EVOLVE_NEXTWORK`` pointing at the
   10^5-item queue that has nothing selectable, so the harvested rung reads and rejects every item and
   the beads rung (10^3 beads from the fake ``bd``) decides; plus a breakdown by probe;
c. the scripted agent's start-up: wall time of ``python -m evolve.agent.scripted --script s.json``
   (one step reporting ``unchanged``).

Prints the selection time as a percentage of the agent start-up and PASS/FAIL against the 10% limit
(exit 1 on FAIL, or when the per-item cost ratio of (a) reaches the linearity limit). On FAIL it also
prints a cProfile summary of one selection (``--profile`` prints it always).

    python bench/selection.py [--runs 11] [--agent-runs 15] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

LIMIT_PCT = 10.0  # per-selection time must stay under this share of the agent's start-up
MAX_ITEM_RATIO = 1.5  # per-item cost at 10^5 vs 10^3 items: at most this (1.0 = linear)
ITEMS_PER_ENTRY = 10
SIZES = (10**3, 10**4, 10**5)
BEADS = 10**3
REPO_NAME = "bench-repo"

KINDS = ("bug", "tech-debt", "improvement", "feature", "pattern-fix", "task", "process-improvement", "docs", "chore")
SEVERITIES = ("high", "medium", "low")
WORDS = ("retry", "ledger", "queue", "parser", "timeout", "gate", "claim", "handoff", "session", "marker",
         "goal", "bead", "config", "budget", "scheduler", "snapshot", "report", "prompt", "runner", "lock")


# -- data -----------------------------------------------------------------------------------------


def _words(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + k * 13) % len(WORDS)] for k in range(n))


def make_item(e: int, i: int, *, selectable_allowed: bool) -> dict[str, Any]:
    """Item ``i`` of entry ``e``; which lifecycle state it is in depends only on (e, i)."""
    n = e * ITEMS_PER_ENTRY + i
    ts = f"2026-{1 + e % 12:02d}-{1 + e % 28:02d}T{e % 24:02d}:{i * 5:02d}:{n % 60:02d}Z"
    item: dict[str, Any] = {
        "title": f"{_words(6, n)} #{n}",
        "description": (f"Found while working on epic-{e}: {_words(30, n + 1)}. "
                        f"See evolve/{WORDS[n % 20]}.py:{n % 900}."),
        "type": KINDS[n % len(KINDS)],
        "severity": SEVERITIES[n % 3],
        "source": ("post-mortem", "council", "evolve-generator", "retro")[n % 4],
        "dedup_key": f"k-{n:07d}",
        "evidence": [f"evolve/{WORDS[(n + 3) % 20]}.py:{n % 500}"],
    }
    state = n % 10
    if state in (0, 1):
        item.update(claim_status="in_progress", claimed_by=f"evolve:cycle-{n % 300}", claimed_at=ts)
    elif state == 2:
        item.update(status="blocked", blocked_note="scope-too-big; needs operator triage")
    elif state == 3:
        item.update(requires=[f"k-{max(n - 11, 0):07d}"])
    elif state == 4:
        item.update(target_repo="someone/other-repo")
    elif state == 5:
        item.update(disposition="defer:waiting for the parser rewrite")
    elif state == 6:
        item.update(status="proposed")
    elif selectable_allowed:  # 7, 8, 9: selectable, scoped three ways
        item.update(target_repo=(REPO_NAME, "*", None)[state - 7], claim_status="available")
    else:
        item.update(claim_status="in_progress", claimed_by="evolve:cycle-1", claimed_at=ts)
    return item


def make_entry(e: int, *, selectable_allowed: bool) -> dict[str, Any]:
    ts = f"2026-{1 + e % 12:02d}-{1 + e % 28:02d}T{e % 24:02d}:00:00Z"
    items = [make_item(e, i, selectable_allowed=selectable_allowed) for i in range(ITEMS_PER_ENTRY)]
    entry: dict[str, Any] = {"source_epic": f"epic-{e}", "timestamp": ts, "items": items, "consumed": False,
                             "claim_status": "available", "claimed_by": None, "claimed_at": None,
                             "consumed_by": None, "consumed_at": None}
    if e % 3 == 0:  # a third of the entries are done
        for it in items:
            it.update(consumed=True, claim_status="consumed", consumed_by=f"evolve:cycle-{e}", consumed_at=ts)
        entry.update(consumed=True, claim_status="consumed", consumed_by=f"evolve:cycle-{e}", consumed_at=ts)
    return entry


def write_queue(path: Path, n_items: int, *, selectable_allowed: bool) -> None:
    with open(path, "wb") as fh:
        for e in range(n_items // ITEMS_PER_ENTRY):
            fh.write(orjson.dumps(make_entry(e, selectable_allowed=selectable_allowed),
                                  option=orjson.OPT_APPEND_NEWLINE))


def make_beads(n: int) -> list[dict[str, Any]]:
    """``bd ready --json`` output: the br/bd field set (reference notes §1.7)."""
    beads = []
    for k in range(n):
        labels = [WORDS[k % 20]] + (["operator-shape"] if k % 50 == 0 else [])
        beads.append({
            "id": f"bd-{k:04x}",
            "title": f"{_words(5, k)} ({k})",
            "status": "open",
            "priority": (k * 7) % 5,
            "issue_type": ("task", "bug", "feature", "chore")[k % 4],
            "labels": labels,
            "created_at": f"2026-{1 + k % 12:02d}-{1 + k % 28:02d}T{k % 24:02d}:{k % 60:02d}:00Z",
            "updated_at": f"2026-{1 + k % 12:02d}-{1 + k % 28:02d}T{k % 24:02d}:{k % 60:02d}:30Z",
            "description": f"{_words(25, k)}. Touches evolve/{WORDS[k % 20]}.py.",
            "assignee": None if k % 3 else "agent",
        })
    return beads


FAKE_BD = '''#!{python} -S
"""A stand-in for the beads CLI: ``bd ready --json`` prints the ready beads, anything else fails."""
import sys
if sys.argv[1:2] != ["ready"]:
    sys.stderr.write("fake bd: only 'ready' is implemented\\n")
    sys.exit(2)
with open({data!r}, "rb") as fh:
    sys.stdout.buffer.write(fh.read())
'''


def write_fake_bd(bindir: Path, beads: list[dict[str, Any]]) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    data = bindir / "ready.json"
    data.write_bytes(orjson.dumps(beads))
    bd = bindir / "bd"
    bd.write_text(FAKE_BD.format(python=sys.executable, data=str(data)), encoding="utf-8")
    bd.chmod(0o755)
    return bd


# -- timing ---------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], runs: int, warmup: int = 2) -> tuple[float, float, Any]:
    """(median s, min s, last result) of ``runs`` calls after ``warmup`` calls."""
    out: Any = None
    times = []
    for k in range(warmup + runs):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        if k >= warmup:
            times.append(dt)
    return statistics.median(times), min(times), out


def ms(s: float) -> str:
    return f"{s * 1e3:9.1f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11, help="timed runs for the 10^5-item measurements")
    ap.add_argument("--agent-runs", type=int, default=15, help="timed runs of the scripted agent")
    ap.add_argument("--profile", action="store_true", help="print a cProfile summary of one selection")
    args = ap.parse_args(argv)

    from evolve import config as configmod
    from evolve import log as logmod
    from evolve.cycle.select import Selector
    from evolve.paths import Paths
    from evolve.store.session_state import SessionState
    from evolve.work.harvested import HarvestedQueue

    logmod.configure(stream=sys.stderr)  # keep structlog lines out of the report
    with tempfile.TemporaryDirectory(prefix="evolve-bench-sel-") as tmpdir:
        tmp = Path(tmpdir)
        repo = tmp / REPO_NAME
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        t0 = time.perf_counter()
        queues = {}
        for n in SIZES:
            queues[n] = tmp / f"next-work-{n}.jsonl"
            write_queue(queues[n], n, selectable_allowed=True)
        empty_q = tmp / "next-work-none-selectable.jsonl"
        write_queue(empty_q, SIZES[-1], selectable_allowed=False)
        beads = make_beads(BEADS)
        write_fake_bd(tmp / "bin", beads)
        build_s = time.perf_counter() - t0

        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; data built in {build_s:.1f} s")
        print(f"queues: {', '.join(f'{n:,} items {queues[n].stat().st_size / 1e6:.1f} MB' for n in SIZES)}; "
              f"no-selectable queue {empty_q.stat().st_size / 1e6:.1f} MB; fake bd: {BEADS:,} ready beads "
              f"({(tmp / 'bin' / 'ready.json').stat().st_size / 1e3:.0f} KB)")

        # (a) HarvestedQueue.candidates() growth
        print("\n(a) HarvestedQueue.candidates()")
        per_item: dict[int, float] = {}
        for n in SIZES:
            q = HarvestedQueue(queues[n], repo_names=(REPO_NAME,))
            runs = max(args.runs, int(args.runs * SIZES[-1] / n / 10))
            med, best, cands = timed(q.candidates, runs)
            per_item[n] = med / n
            gc.disable()  # diagnostic only: how much of the growth is the cyclic garbage collector
            try:
                nogc, _, _ = timed(q.candidates, runs)
            finally:
                gc.enable()
            print(f"  {n:>7,} items: median {ms(med)}  (min {ms(best).strip()}, {runs} runs)  "
                  f"{per_item[n] * 1e6:6.2f} us/item  {len(cands):,} selectable  | gc off: {ms(nogc).strip()}, "
                  f"{nogc / n * 1e6:.2f} us/item")
        ratio = per_item[SIZES[-1]] / per_item[SIZES[0]]
        linear_ok = ratio < MAX_ITEM_RATIO
        print(f"  per-item cost 1e5/1e3: {ratio:.2f}  (1.00 = linear; limit < {MAX_ITEM_RATIO})")

        # (b) one full selection
        env = {**os.environ, "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               "EVOLVE_NEXTWORK": str(empty_q)}
        paths = Paths.for_repo(repo, env)
        cfg = configmod.resolve({}, "x", {})
        selector = Selector(paths, cfg, env, logmod.get())
        state = SessionState()

        def one_selection():
            return selector.select(state, restorative=False)

        sel_med, sel_min, sel = timed(one_selection, args.runs)
        want = min((b for b in beads if "operator-shape" not in b["labels"]),
                   key=lambda b: (b["priority"], b["created_at"], b["id"]))
        assert sel.item is not None and sel.rung == "beads" and sel.item.ref == f"bead:{want['id']}", sel
        assert not sel.probe_errors, sel.probe_errors
        assert not selector.harvested.candidates()
        inp_med, _, _ = timed(lambda: selector.ladder_input(state, restorative=False, excluded=frozenset()), args.runs)
        h_med, _, _ = timed(selector.harvested.candidates, args.runs)
        b_med, _, _ = timed(selector.beads.candidates, args.runs)
        print(f"\n(b) Selector.select(): harvested rung {SIZES[-1]:,} items, none selectable; beads rung decides "
              f"({sel.item.ref})")
        print(f"  full selection           median {ms(sel_med)}  (min {ms(sel_min).strip()}, {args.runs} runs)")
        print(f"    ladder_input (ledger, markers, GOALS era)  {ms(inp_med)}")
        print(f"    harvested probe (read + reject 1e5 items)  {ms(h_med)}")
        print(f"    beads probe (run fake bd, parse 1e3 beads) {ms(b_med)}")

        # (c) the scripted agent's start-up
        script = tmp / "agent-script.json"
        script.write_bytes(orjson.dumps({"steps": [{"report": {"result": "unchanged"}}]}))
        agent_env = {**os.environ, "EVOLVE_REPORT_FILE": str(tmp / "report.json")}

        def run(argv: list[str]) -> Callable[[], None]:
            return lambda: subprocess.run(argv, cwd=repo, env=agent_env, stdout=subprocess.DEVNULL, check=True)

        agent_med, agent_min, _ = timed(run([sys.executable, "-m", "evolve.agent.scripted", "--script", str(script)]),
                                        args.agent_runs)
        assert orjson.loads((tmp / "report.json").read_bytes())["result"] == "unchanged"
        pass_med, _, _ = timed(run([sys.executable, "-c", "pass"]), args.agent_runs)
        print("\n(c) agent start-up (the yardstick)")
        print(f"  python -m evolve.agent.scripted  median {ms(agent_med)}  (min {ms(agent_min).strip()}, "
              f"{args.agent_runs} runs)")
        print(f"  python -c pass                   median {ms(pass_med)}")

        pct = 100 * sel_med / agent_med
        ok = pct < LIMIT_PCT
        print(f"\nselection / agent start-up: {pct:.1f}%  (limit < {LIMIT_PCT:g}%; "
              f"budget {ms(agent_med * LIMIT_PCT / 100).strip()})")
        if args.profile or not ok:
            prof = cProfile.Profile()
            prof.enable()
            one_selection()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(12)
            print("\ncProfile of one selection (by own time):")
            print("\n".join(ln for ln in buf.getvalue().splitlines()[4:] if ln.strip()))
        print(f"\n{'PASS' if ok else 'FAIL'}: selection {ms(sel_med).strip()} = {pct:.1f}% of agent start-up "
              f"{ms(agent_med).strip()} (limit < {LIMIT_PCT:g}%)")
        if not linear_ok:
            print(f"FAIL: candidates() per-item cost grew {ratio:.2f}x from 1e3 to 1e5 items")
        return 0 if ok and linear_ok else 1


if __name__ == "__main__":
    sys.exit(main())
