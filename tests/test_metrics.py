"""Prometheus textfile metrics: the format parses with prometheus_client's parser, the values match the
ledger, the counters are kept incrementally, the file is replaced atomically, and a fire rewrites it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import orjson
import pytest
from ops_fixture import write_every_kind
from support import Env, entry, git, heavy_step, improved_step

from evolve import metrics
from evolve.status import load_config
from evolve.timeutil import parse_iso, utc_iso

parser = pytest.importorskip("prometheus_client.parser")


def parse(text: str) -> dict[str, Any]:
    """``{family name: family}`` and every sample keyed by ``(name, frozenset(labels - repo))``."""
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    samples = {}
    for f in fams.values():
        for s in f.samples:
            labels = {k: v for k, v in s.labels.items() if k != "repo"}
            samples[(s.name, frozenset(labels.items()))] = s.value
    return {"families": fams, "samples": samples}


def sample(parsed: dict[str, Any], name: str, **labels: str) -> float:
    return parsed["samples"][(name, frozenset(labels.items()))]


def render(env: Env, **kw: Any) -> str:
    cfg, _ = load_config(env.paths, env.env())
    return metrics.render(env.paths, cfg, env.env(), beads=False, **kw)


def test_metrics_parse_and_match_the_ledger(env: Env, cli) -> None:
    entries = write_every_kind(env)
    env.paths.stop.write_text("lunch\n")
    env.paths.handoff.write_text("x\n")
    r = cli("metrics", "--no-beads")
    assert r.code == 0, r.stderr
    p = parse(r.stdout)
    fams = p["families"]
    assert fams["evolve_cycles"].type == "counter"
    assert fams["evolve_cycle_duration_seconds"].type == "histogram"
    assert fams["evolve_agent_cost_usd"].type == "counter"
    for name in ("evolve_last_cycle_timestamp_seconds", "evolve_last_success_timestamp_seconds", "evolve_halted",
                 "evolve_context_streak", "evolve_breaker_open", "evolve_items_ready"):
        assert fams[name].type == "gauge", name
    for f in fams.values():
        assert all(s.labels["repo"] == str(env.repo) for s in f.samples)
        assert all(s.timestamp is None for s in f.samples)  # no timestamps inside the file

    by_result: dict[str, int] = {}
    idle = [e for e in entries if e["target"] == "idle" and e["mode"] == "idle"]
    for e in entries:
        if e not in idle:  # an idle poll is not a cycle (issue 16): counted apart
            by_result[e["result"]] = by_result.get(e["result"], 0) + 1
    for result, n in by_result.items():
        assert sample(p, "evolve_cycles_total", result=result) == n
    assert idle and sample(p, "evolve_idle_polls_total") == len(idle)
    assert sample(p, "evolve_last_idle_poll_timestamp_seconds") == parse_iso(idle[-1]["timestamp"])
    durations = [e["duration_s"] for e in entries if "duration_s" in e]
    assert sample(p, "evolve_cycle_duration_seconds_count") == len(durations)
    assert sample(p, "evolve_cycle_duration_seconds_sum") == pytest.approx(sum(durations))
    assert sample(p, "evolve_cycle_duration_seconds_bucket", le="300.0") == sum(d <= 300 for d in durations)
    assert sample(p, "evolve_cycle_duration_seconds_bucket", le="+Inf") == len(durations)
    assert sample(p, "evolve_agent_cost_usd_total") == pytest.approx(sum(e.get("cost_usd", 0) for e in entries))
    assert sample(p, "evolve_last_cycle_timestamp_seconds") == parse_iso(entries[-1]["timestamp"])
    assert sample(p, "evolve_last_success_timestamp_seconds") == parse_iso(entries[-1]["timestamp"])
    assert sample(p, "evolve_halted", marker="STOP") == 1
    assert sample(p, "evolve_halted", marker="KILL") == 0 and sample(p, "evolve_dormant") == 0
    assert ("evolve_halted", frozenset({("marker", "DORMANT")})) not in p["samples"]  # dormant is not a halt
    assert sample(p, "evolve_handoff_pending") == 1
    assert sample(p, "evolve_context_streak") == 1 and sample(p, "evolve_context_streak_limit") == 2
    assert sample(p, "evolve_breaker_open") == 0 and sample(p, "evolve_consecutive_failures") == 0
    assert sample(p, "evolve_status_health") == 75
    assert sample(p, "evolve_items_ready", source="harvested") == 2  # blocked and deferred items do not count
    assert sample(p, "evolve_items_ready", source="goals") == 2


def test_last_success_skips_failures_and_breaker_open(env: Env) -> None:
    entries = write_every_kind(env)
    st = orjson.loads(env.paths.state.read_bytes())
    env.paths.state.write_bytes(orjson.dumps({**st, "breaker_open_until": utc_iso(time.time() + 600)}))
    with open(env.paths.ledger, "ab") as fh:
        fh.write(orjson.dumps({"cycle": 17, "result": "failed", "timestamp": utc_iso(), "target": "t"},
                              option=orjson.OPT_APPEND_NEWLINE))
    p = parse(render(env))
    assert sample(p, "evolve_last_success_timestamp_seconds") == parse_iso(entries[-1]["timestamp"])
    assert sample(p, "evolve_last_cycle_timestamp_seconds") > parse_iso(entries[-1]["timestamp"])
    assert sample(p, "evolve_breaker_open") == 1


def test_ready_beads_are_counted_from_the_tracker(env: Env, tmp_path) -> None:
    bd = tmp_path / "bin" / "bd"
    bd.parent.mkdir()
    bd.write_text('#!/bin/sh\necho \'[{"id": "bd-1", "title": "a", "priority": 1}, {"id": "bd-2", "title": "b"}]\'\n')
    bd.chmod(0o755)
    e = env.env(PATH=f"{bd.parent}:{os.environ['PATH']}")
    cfg, _ = load_config(env.paths, e)
    p = parse(metrics.render(env.paths, cfg, e, beads=True))
    assert sample(p, "evolve_items_ready", source="beads") == 2
    assert sample(p, "evolve_items_ready", source="harvested") == 0


def test_counters_are_incremental_and_recount_when_the_ledger_changes(env: Env) -> None:
    write_every_kind(env)
    first = metrics.ledger_counts(env.paths)
    cache = env.paths.metrics_cache
    assert first.offset == env.paths.ledger.stat().st_size and cache.exists()
    # Prove the next read starts at the cached offset: a doctored cached count survives it.
    doctored = orjson.loads(cache.read_bytes())
    doctored["results"]["improved"] = 1000
    cache.write_bytes(orjson.dumps(doctored))
    with open(env.paths.ledger, "ab") as fh:
        fh.write(orjson.dumps({"cycle": 17, "result": "improved", "timestamp": utc_iso(), "duration_s": 10},
                              option=orjson.OPT_APPEND_NEWLINE))
        fh.write(b'{"cycle": 18, "torn')  # not a line yet: not counted, offset stays before it
    again = metrics.ledger_counts(env.paths)
    assert again.results["improved"] == 1001
    assert again.offset == env.paths.ledger.stat().st_size - len(b'{"cycle": 18, "torn')
    # A ledger rewritten before the cached offset (restored from backup, edited) is counted again.
    lines = env.paths.ledger.read_bytes().splitlines(keepends=True)[:5]
    env.paths.ledger.write_bytes(b"".join(lines) + b"x" * 4000 + b"\n")
    fresh = metrics.ledger_counts(env.paths)
    assert sum(fresh.results.values()) == 5 and fresh.malformed == 1


def test_textfile_is_replaced_atomically(env: Env, tmp_path) -> None:
    write_every_kind(env)
    out = tmp_path / "textfile"
    cfg, _ = load_config(env.paths, env.env())
    texts = [metrics.render(env.paths, cfg, env.env(), beads=False)]
    # a second, different content: one more cycle
    with open(env.paths.ledger, "ab") as fh:
        fh.write(orjson.dumps({"cycle": 17, "result": "improved", "timestamp": utc_iso()},
                              option=orjson.OPT_APPEND_NEWLINE))
    texts.append(metrics.render(env.paths, cfg, env.env(), beads=False))
    assert texts[0] != texts[1]
    path = metrics.write_textfile(out, texts[0])
    assert path == out / "evolve.prom" and path.read_text() == texts[0]
    ino = path.stat().st_ino
    pinned = open(path, "rb")  # noqa: SIM115 - keeps the first inode allocated so its number cannot be reused
    stop = threading.Event()
    seen: list[str] = []
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                data = path.read_text()
            except FileNotFoundError:
                bad.append("missing")
                continue
            seen.append(data)
            if data not in texts:
                bad.append(data[-200:])

    th = threading.Thread(target=reader)
    th.start()
    try:
        for i in range(300):
            metrics.write_textfile(out, texts[i % 2])
    finally:
        stop.set()
        th.join()
    assert not bad, bad[:3]
    assert len(seen) > 10 and {texts[0], texts[1]} <= set(seen) | {texts[0]}
    assert path.stat().st_ino != ino  # replaced by rename, never rewritten in place
    assert pinned.read() == texts[0].encode()  # and the old file was never written through
    pinned.close()
    assert sorted(q.name for q in out.iterdir()) == ["evolve.prom"]  # no temp files left behind
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)  # node_exporter must be able to read it
    for text in texts:
        list(parser.text_string_to_metric_families(text))


def test_every_fire_rewrites_the_textfile(env: Env, cli, tmp_path) -> None:
    out = tmp_path / "node-exporter"
    env.write_config(metrics={"textfile_dir": str(out)})
    env.queue(entry("a", "b"))
    env.steps([improved_step(), heavy_step()])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    prom = out / metrics.textfile_name(env.repo.resolve())
    p1 = parse(prom.read_text())
    assert sample(p1, "evolve_cycles_total", result="improved") == 1
    mtime = prom.stat().st_mtime_ns
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    p2 = parse(prom.read_text())
    assert sample(p2, "evolve_cycles_total", result="scout") == 1
    assert sample(p2, "evolve_context_streak") == 1
    assert prom.stat().st_mtime_ns >= mtime
    # a halted fire rewrites it too
    env.paths.stop.write_text("stop\n")
    assert cli("fire").code == 0
    assert sample(parse(prom.read_text()), "evolve_halted", marker="STOP") == 1
    assert "metrics.failed" not in r.stdout + r.stderr


def test_two_repos_sharing_a_textfile_dir_keep_their_own_files(env: Env, cli, tmp_path) -> None:
    """Issue 16: the textfile was always ``evolve.prom``, so a second repository overwrote the first."""
    out = tmp_path / "node-exporter"
    out.mkdir()
    other = tmp_path / "nested" / env.repo.name  # the same directory name: the path's hash tells them apart
    other.mkdir(parents=True)
    git(other, "init", "-q")
    git(other, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", "i")
    # What an older evolve left behind for this repository: removed once its own file is written.
    (out / "evolve.prom").write_text(f'evolve_status_health{{repo="{env.repo.resolve()}"}} 0\n')
    for repo in (env.repo, other):
        r = cli("metrics", "--no-beads", "--textfile", str(out), repo=repo)
        assert r.code == 0, r.stderr
    names = sorted(q.name for q in out.iterdir())
    want = sorted(metrics.textfile_name(r.resolve()) for r in (env.repo, other))
    assert names == want and len(set(want)) == 2, names
    for repo in (env.repo, other):
        fams = parse((out / metrics.textfile_name(repo.resolve())).read_text())["families"]
        assert {s.labels["repo"] for f in fams.values() for s in f.samples} == {str(repo.resolve())}
    # Another repository's legacy file is not ours to delete.
    (out / "evolve.prom").write_text('evolve_status_health{repo="/somewhere/else"} 0\n')
    assert cli("metrics", "--no-beads", "--textfile", str(out)).code == 0
    assert (out / "evolve.prom").exists()


def test_relative_textfile_dir_is_under_the_repo_and_cli_writes_it(env: Env, cli, tmp_path) -> None:
    env.write_config(metrics={"textfile_dir": "prom"})
    env.queue(entry("a"))
    assert cli("fire", "--cycles", "1").code == 0
    name = metrics.textfile_name(env.repo.resolve())
    assert (env.repo / "prom" / name).exists()
    r = cli("metrics", "--no-beads", "--textfile", str(tmp_path / "x"))
    assert r.code == 0 and "wrote" in r.stdout
    parse((tmp_path / "x" / name).read_text())


def test_unwritable_textfile_dir_never_breaks_a_fire(env: Env, cli) -> None:
    blocker = env.root / "a-file"
    blocker.write_text("x")
    env.write_config(metrics={"textfile_dir": str(blocker / "sub")})
    env.queue(entry("a"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "metrics.failed" in r.names()
    assert env.ledger()[-1]["result"] == "improved"


def test_hostile_label_values_are_escaped(env: Env) -> None:
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    with open(env.paths.ledger, "wb") as fh:
        fh.write(orjson.dumps({"cycle": 1, "result": 'we"ird\nresult\\', "timestamp": utc_iso()},
                              option=orjson.OPT_APPEND_NEWLINE))
    p = parse(render(env))
    assert sample(p, "evolve_cycles_total", result='we"ird\nresult\\') == 1


def test_empty_repo_metrics(env: Env) -> None:
    p = parse(render(env))
    assert sample(p, "evolve_cycles_total", result="improved") == 0
    assert sample(p, "evolve_last_success_timestamp_seconds") == 0
