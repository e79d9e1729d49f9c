"""How long one work selection takes (docs/DESIGN.md §6), against the agent's own start-up as the yardstick.

Builds, in a temporary directory:

* harvested queues (``next-work.jsonl``, schema v1.4) of 10^3, 10^4 and 10^5 items (10 items per
  entry, realistic fields; a mix of consumed entries, claimed items, blocked / gated / deferred /
  other-repo items and selectable ones), plus a 10^5-item queue with **no** selectable item;
* a fake ``bd`` (a Python script on a temporary PATH) that prints 10^3 ready beads as JSON;
* a ``git init`` repository.

Then measures (median of several runs):

a. cold ``HarvestedQueue.candidates()``: a fresh queue object (no index yet) on 10^3, 10^4 and 10^5
   items (sizes interleaved), and the per-item cost ratio 10^5/10^3 (1.0 = linear);
b. warm selection: ``Selector.select()`` (``evolve/cycle/select.py``) again and again on an unchanged
   10^5-item queue, (b1) one with selectable items, so the harvested rung decides, and (b2) one with
   none, so the beads rung (10^3 beads from the fake ``bd``) decides. The time spent waiting for the
   tracker process (``BeadsSource._run``: spawning ``bd``, its run, collecting its output) is timed
   apart: that is the tracker's own start-up, like the agent's, not evolve's selection work.
   evolve's own time is the total minus that wait;
c. a selection right after a claim + finalize rewrite of the 10^5-item queue (the index is updated
   in place, not rebuilt: the script counts rebuilds), with the rewrite's own time beside it;
d. the scripted agent's start-up: wall time of ``python -m evolve.agent.scripted --script s.json``
   (one step reporting ``unchanged``): the yardstick.

Prints evolve's own selection time in (b1), (b2) and (c) as a percentage of (d), and PASS/FAIL
against the 10% limit; exit 1 on FAIL, or when the per-item cost ratio of (a) reaches the linearity
limit. On FAIL it also prints a cProfile summary of one failing selection (``--profile``: always).

    python bench/selection.py [--runs 11] [--agent-runs 15] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import shutil
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


# In-progress claims are made a minute before the run: live claims (unselectable) for the whole bench.
# A fixed date went stale by the calendar (an hour's visibility timeout) and made them selectable.
CLAIMED_AT = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))


def make_item(e: int, i: int, *, selectable_allowed: bool) -> dict[str, Any]:
    """Item ``i`` of entry ``e``; which lifecycle state it is in depends only on (e, i)."""
    n = e * ITEMS_PER_ENTRY + i
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
        item.update(claim_status="in_progress", claimed_by=f"evolve:cycle-{n % 300}", claimed_at=CLAIMED_AT)
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
        item.update(claim_status="in_progress", claimed_by="evolve:cycle-1", claimed_at=CLAIMED_AT)
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
"""A stand-in for the beads CLI: ``bd ready --json`` prints the ready beads, anything else fails.

With FAKE_BD_VARY set, each run adds one low-priority bead named after its pid: the output changes
every time (the top bead does not).
"""
import os
import sys
if sys.argv[1:2] != ["ready"]:
    sys.stderr.write("fake bd: only 'ready' is implemented\\n")
    sys.exit(2)
with open({data!r}, "rb") as fh:
    data = fh.read()
if os.environ.get("FAKE_BD_VARY"):
    data = data[:-1] + b',{{"id":"bd-run-%d","title":"varies","priority":4}}]' % os.getpid()
sys.stdout.buffer.write(data)
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


def ms3(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


class TrackerClock:
    """Times the tracker process: every ``BeadsSource._run`` call (spawn ``bd``, wait, collect output)."""

    def __init__(self, beads: Any) -> None:
        self.wait = 0.0
        self.calls = 0
        run = beads._run

        def timed_run(argv: list[str]) -> bytes:
            t0 = time.perf_counter()
            try:
                return run(argv)
            finally:
                self.wait += time.perf_counter() - t0
                self.calls += 1

        beads._run = timed_run


class Counter:
    """Counts calls of one method of one object (here: the queue's full rebuilds and full re-reads)."""

    def __init__(self, obj: Any, name: str) -> None:
        self.n = 0
        fn = getattr(obj, name)

        def counted(*a: Any, **kw: Any) -> Any:
            self.n += 1
            return fn(*a, **kw)

        setattr(obj, name, counted)


def cold_candidates(queues: dict[int, Path], rounds: int, warmup: int = 2) -> dict[int, tuple[float, float, int, int]]:
    """Per size: (median s, min s, runs, selectable count) of ``candidates()`` on a fresh queue object.

    Sizes are interleaved round by round (smaller sizes run more often, so each size gets about the
    same wall time), so that a burst of load elsewhere on the machine hits every size alike. Each run
    starts from a collected heap (``gc.collect()`` outside the timed region), so one run's garbage is
    not charged to the next.
    """
    from evolve.work.harvested import HarvestedQueue

    biggest = max(queues)
    times: dict[int, list[float]] = {n: [] for n in queues}
    count: dict[int, int] = {}
    for r in range(warmup + rounds):
        for n, path in queues.items():
            for _ in range(max(1, biggest // n // 10)):
                q = HarvestedQueue(path, repo_names=(REPO_NAME,))
                gc.collect()
                t0 = time.perf_counter()
                count[n] = len(q.candidates())
                dt = time.perf_counter() - t0
                del q
                if r >= warmup:
                    times[n].append(dt)
    return {n: (statistics.median(t), min(t), len(t), count[n]) for n, t in times.items()}


def selections(selector: Any, state: Any, clock: TrackerClock, runs: int) -> dict[str, Any]:
    """``runs`` warm selections: medians of the total, the tracker wait and evolve's own time."""
    totals, waits, owns = [], [], []
    sel = None
    for _ in range(runs):
        clock.wait = 0.0
        t0 = time.perf_counter()
        sel = selector.select(state, restorative=False)
        total = time.perf_counter() - t0
        totals.append(total)
        waits.append(clock.wait)
        owns.append(total - clock.wait)
    return {"total": statistics.median(totals), "wait": statistics.median(waits), "own": statistics.median(owns),
            "own_min": min(owns), "sel": sel}


def profile(fn: Callable[[], Any], title: str) -> None:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(12)
    print(f"\ncProfile of {title} (by own time):")
    print("\n".join(ln for ln in buf.getvalue().splitlines()[4:] if ln.strip()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11, help="timed runs of the 10^5-item measurements")
    ap.add_argument("--agent-runs", type=int, default=15, help="timed runs of the scripted agent")
    ap.add_argument("--profile", action="store_true", help="print a cProfile summary of each selection case")
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
        rewrite_q = tmp / "next-work-rewritten.jsonl"
        shutil.copyfile(queues[SIZES[-1]], rewrite_q)
        beads = make_beads(BEADS)
        bd = write_fake_bd(tmp / "bin", beads)
        build_s = time.perf_counter() - t0

        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; data built in {build_s:.1f} s")
        print(f"queues: {', '.join(f'{n:,} items {queues[n].stat().st_size / 1e6:.1f} MB' for n in SIZES)}; "
              f"no-selectable queue {empty_q.stat().st_size / 1e6:.1f} MB; fake bd: {BEADS:,} ready beads "
              f"({(tmp / 'bin' / 'ready.json').stat().st_size / 1e3:.0f} KB)")

        # (a) cold candidates(): growth
        print("\n(a) cold HarvestedQueue.candidates() (fresh queue object: read, parse, index, rank)")
        per_item: dict[int, float] = {}
        for n, (med, best, runs, count) in cold_candidates(queues, args.runs).items():
            per_item[n] = med / n
            print(f"  {n:>7,} items: median {ms(med)}  (min {ms(best).strip()}, {runs} runs)  "
                  f"{per_item[n] * 1e6:6.2f} us/item  {count:,} selectable")
        ratio = per_item[SIZES[-1]] / per_item[SIZES[0]]
        linear_ok = ratio < MAX_ITEM_RATIO
        print(f"  per-item cost 1e5/1e3: {ratio:.2f}  (1.00 = linear; limit < {MAX_ITEM_RATIO})")

        base_env = {**os.environ, "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        cfg = configmod.resolve({}, "x", {})
        state = SessionState()

        def selector_for(queue: Path, vary: bool = False) -> tuple[Any, TrackerClock]:
            env = {**base_env, "EVOLVE_NEXTWORK": str(queue), **({"FAKE_BD_VARY": "1"} if vary else {})}
            sel = Selector(Paths.for_repo(repo, env), cfg, env, logmod.get())
            return sel, TrackerClock(sel.beads)

        def first_selection(selector: Any) -> float:
            t0 = time.perf_counter()
            selector.select(state, restorative=False)
            return time.perf_counter() - t0

        # (b1) warm, harvested decides
        s1, c1 = selector_for(queues[SIZES[-1]])
        first1 = first_selection(s1)
        b1 = selections(s1, state, c1, args.runs)
        sel1 = b1["sel"]
        want1 = HarvestedQueue(queues[SIZES[-1]], repo_names=(REPO_NAME,)).candidates()[0]
        assert sel1.item == want1 and sel1.rung == "harvested" and not sel1.probe_errors, sel1
        assert c1.calls == 0  # the tracker is not asked while harvested work exists
        inp1, _, _ = timed(lambda: s1.ladder_input(state, restorative=False, excluded=frozenset()), args.runs)
        h1, _, _ = timed(s1.harvested.candidates, args.runs)
        print(f"\n(b1) warm Selector.select(), unchanged {SIZES[-1]:,}-item queue; the harvested rung decides "
              f"({sel1.item.ref})")
        print(f"  first selection (builds the index)         {ms(first1)}")
        print(f"  warm selection                total median {ms(b1['total'])}  (min own {ms3(b1['own_min'])}, "
              f"{args.runs} runs)")
        print(f"    tracker wait                             {ms(b1['wait'])}  (not consulted)")
        print(f"    evolve's own                             {ms(b1['own'])}")
        print(f"      ladder_input (ledger, markers, GOALS era) {ms3(inp1)}")
        print(f"      harvested probe (stat, reuse the index)   {ms3(h1)}")

        # (b2) warm, beads decide: the tracker's output unchanged, then changing at every call
        s2, c2 = selector_for(empty_q)
        first2 = first_selection(s2)
        b2 = selections(s2, state, c2, args.runs)
        s2v, c2v = selector_for(empty_q, vary=True)
        first_selection(s2v)
        b2v = selections(s2v, state, c2v, args.runs)
        want2 = min((b for b in beads if "operator-shape" not in b["labels"]),
                    key=lambda b: (b["priority"], b["created_at"], b["id"]))
        for sel2 in (b2["sel"], b2v["sel"]):
            assert sel2.item is not None and sel2.rung == "beads" and sel2.item.ref == f"bead:{want2['id']}", sel2
            assert not sel2.probe_errors, sel2.probe_errors
        assert not s2.harvested.candidates()
        inp2, _, _ = timed(lambda: s2.ladder_input(state, restorative=False, excluded=frozenset()), args.runs)
        h2, _, _ = timed(s2.harvested.candidates, args.runs)

        def probe_own(selector: Any, clock: TrackerClock) -> float:
            """Median time of the beads probe minus its tracker wait."""
            owns = []
            for _ in range(args.runs):
                clock.wait = 0.0
                t0 = time.perf_counter()
                selector.beads.candidates()
                owns.append(time.perf_counter() - t0 - clock.wait)
            return statistics.median(owns)

        bp, bpv = probe_own(s2, c2), probe_own(s2v, c2v)
        bare, _, _ = timed(lambda: subprocess.run([str(bd), "ready", "--json"], stdout=subprocess.DEVNULL,
                                                  check=True), args.runs)
        print(f"\n(b2) warm Selector.select(), unchanged {SIZES[-1]:,}-item queue with nothing selectable; the beads "
              f"rung decides ({b2['sel'].item.ref})")
        print(f"  first selection (builds the index)         {ms(first2)}")
        for name, b, own in (("tracker output unchanged", b2, bp), ("tracker output changed each time", b2v, bpv)):
            print(f"  {name}:")
            print(f"    warm selection              total median {ms(b['total'])}  (min own {ms3(b['own_min'])}, "
                  f"{args.runs} runs)")
            print(f"      tracker wait (BeadsSource._run)        {ms(b['wait'])}")
            print(f"      evolve's own                           {ms(b['own'])}")
            print(f"        beads probe minus the wait (parse, rank, convert 1e3 beads if changed) {ms3(own)}")
        print(f"  bare `bd ready --json` through subprocess.run: {ms3(bare)} (the wait above also holds "
              f"run_capture's temp dir, process-group and exit-polling overhead)")
        print(f"  ladder_input (ledger, markers, GOALS era) {ms3(inp2)}; harvested probe (stat, reuse the index) "
              f"{ms3(h2)}")

        # (c) right after a claim + finalize rewrite
        s3, c3 = selector_for(rewrite_q)
        first3 = first_selection(s3)
        rebuilds = Counter(s3.harvested, "_rebuild")
        rereads = Counter(s3.harvested, "_same_lines")
        totals, owns, rewrites = [], [], []
        done_refs = set()
        for k in range(args.runs):
            item = s3.select(state, restorative=False).item
            assert item is not None and item.source == "harvested" and item.ref not in done_refs, item
            t0 = time.perf_counter()
            s3.harvested.claim(item, f"evolve:cycle-{k}", "2026-06-01T00:00:00Z")
            s3.harvested.finalize(item, f"evolve:cycle-{k}", "2026-06-01T00:00:01Z")
            rewrites.append(time.perf_counter() - t0)
            done_refs.add(item.ref)
            c3.wait = 0.0
            t0 = time.perf_counter()
            sel3 = s3.select(state, restorative=False)
            total = time.perf_counter() - t0
            totals.append(total)
            owns.append(total - c3.wait)
            assert sel3.item is not None and sel3.item.ref not in done_refs, sel3
        fresh = [w.ref for w in HarvestedQueue(rewrite_q, repo_names=(REPO_NAME,)).candidates()]
        assert [w.ref for w in s3.harvested.candidates()] == fresh  # the index agrees with a full parse
        c_own = statistics.median(owns)
        print(f"\n(c) Selector.select() right after claim + finalize of the selected item ({SIZES[-1]:,}-item queue, "
              f"{args.runs} rounds)")
        print(f"  first selection (builds the index)         {ms(first3)}")
        print(f"  claim + finalize (two in-place edits)      {ms(statistics.median(rewrites))}  (median)")
        print(f"  selection after it            total median {ms(statistics.median(totals))}  "
              f"(min own {ms3(min(owns))})")
        print(f"    evolve's own                             {ms(c_own)}")
        print(f"  index rebuilds during the rounds: {rebuilds.n}; full re-reads (racy-timestamp checks): "
              f"{rereads.n}; index == fresh parse: yes")

        # (d) the scripted agent's start-up
        script = tmp / "agent-script.json"
        script.write_bytes(orjson.dumps({"steps": [{"report": {"result": "unchanged"}}]}))
        agent_env = {**os.environ, "EVOLVE_REPORT_FILE": str(tmp / "report.json")}

        def run(argv: list[str]) -> Callable[[], None]:
            return lambda: subprocess.run(argv, cwd=repo, env=agent_env, stdout=subprocess.DEVNULL, check=True)

        agent_med, agent_min, _ = timed(run([sys.executable, "-m", "evolve.agent.scripted", "--script", str(script)]),
                                        args.agent_runs)
        assert orjson.loads((tmp / "report.json").read_bytes())["result"] == "unchanged"
        pass_med, _, _ = timed(run([sys.executable, "-c", "pass"]), args.agent_runs)
        print("\n(d) agent start-up (the yardstick)")
        print(f"  python -m evolve.agent.scripted  median {ms(agent_med)}  (min {ms(agent_min).strip()}, "
              f"{args.agent_runs} runs)")
        print(f"  python -c pass                   median {ms(pass_med)}")

        budget = agent_med * LIMIT_PCT / 100
        print(f"\nbudget: {LIMIT_PCT:g}% of agent start-up = {ms3(budget)} of evolve's own time per selection")
        cases = [("b1 warm, harvested decides", b1["own"], lambda: s1.select(state, restorative=False)),
                 ("b2 warm, beads decide, tracker output unchanged", b2["own"],
                  lambda: s2.select(state, restorative=False)),
                 ("b2 warm, beads decide, tracker output changed", b2v["own"],
                  lambda: s2v.select(state, restorative=False)),
                 ("c  after claim + finalize", c_own, None)]
        ok = linear_ok
        for name, own, fn in cases:
            pct = 100 * own / agent_med
            good = pct < LIMIT_PCT
            ok = ok and good
            print(f"{'PASS' if good else 'FAIL'}: {name}: evolve's own {ms3(own)} = {pct:.1f}% of agent start-up "
                  f"{ms3(agent_med)} (limit < {LIMIT_PCT:g}%)")
            if fn is not None and (args.profile or not good):
                profile(fn, f"one selection ({name})")
        print(f"{'PASS' if linear_ok else 'FAIL'}: cold candidates() per-item cost 1e5/1e3 = {ratio:.2f} "
              f"(limit < {MAX_ITEM_RATIO})")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
