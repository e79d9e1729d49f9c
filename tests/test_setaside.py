"""Set-aside refs are manageable (issue 22 item 11, docs/DESIGN.md §8.3): ``evolve setaside`` lists, shows,
applies and drops them, retention drops old ones, and status is DEGRADED only while one needs the operator.

Real repositories, real fires and real ``python -m evolve`` subprocesses; every test that touches the
operator's checkout asserts it byte for byte (files, index, HEAD, refs, no stray ``index.lock``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from support import GIT_ENV, Env, entry, git, improved_step, live

from evolve.cycle.retention import SETASIDE_PRUNED, expired
from evolve.status import setaside
from evolve.status.setaside import Aside, apply_refusal, assess, full_ref, health

# -- the pure rules, as tables ------------------------------------------------------------------


@pytest.mark.parametrize(("arg", "ref"), [
    ("stranded/12", "refs/evolve/stranded/12"),
    ("refs/evolve/unlanded/7-2", "refs/evolve/unlanded/7-2"),
    ("evolve/uncommitted/4", "refs/evolve/uncommitted/4"),
    ("interrupted/3", "refs/evolve/interrupted/3"),
    ("pending/main", "refs/evolve/pending/main"),
    ("applied/unlanded/7", "refs/evolve/applied/unlanded/7"),
    ("  stranded/1 ", "refs/evolve/stranded/1"),
])
def test_short_forms_name_full_refs(arg: str, ref: str) -> None:
    assert full_ref(arg) == ref


@pytest.mark.parametrize("arg", ["", "12", "other/1", "stranded/", "stranded/../heads/main", "stranded/1 x",
                                 "stranded/1\x1b[2J", "-stranded/1", "stranded/1.lock", "refs/heads/main",
                                 "stranded/a:b", "x" * 500])
def test_anything_else_is_refused_in_one_line(arg: str) -> None:
    with pytest.raises(ValueError) as exc:
        full_ref(arg)
    assert "\n" not in str(exc.value) and "not a set-aside ref" in str(exc.value)


def _e(cycle: int, result: str, ref: str | None = "q:a", **kw: object) -> dict[str, object]:
    return {"cycle": cycle, "result": result, "work_ref": ref, **kw}


@pytest.mark.parametrize(("entries", "origin", "item", "superseded_by"), [
    # the entry that names the ref is its origin; a later cycle that finalized the item supersedes it
    ([_e(5, "failed", unlanded_ref="refs/evolve/unlanded/5", cycle_start_sha="s5"), _e(6, "improved")],
     5, "q:a", 6),
    ([_e(5, "failed", unlanded_ref="refs/evolve/unlanded/5"), _e(6, "unchanged")], 5, "q:a", 6),
    ([_e(5, "failed", unlanded_ref="refs/evolve/unlanded/5"), _e(6, "harvested")], 5, "q:a", 6),
    # a red, failed or heavy retry does not; another item does not; an earlier success does not
    ([_e(5, "failed", unlanded_ref="refs/evolve/unlanded/5"), _e(6, "regressed"), _e(7, "failed")], 5, "q:a", None),
    ([_e(5, "failed", unlanded_ref="refs/evolve/unlanded/5"), _e(6, "improved", context_heavy=True)],
     5, "q:a", None),
    ([_e(5, "failed", unlanded_ref="refs/evolve/unlanded/5"), _e(6, "improved", ref="q:b")], 5, "q:a", None),
    ([_e(4, "improved"), _e(5, "failed", unlanded_ref="refs/evolve/unlanded/5")], 5, "q:a", None),
    # no entry names it: the entry of the cycle its name gives; upstream's entries carry only a target
    ([_e(5, "crashed"), _e(6, "improved")], 5, "q:a", 6),
    ([{"cycle": 5, "result": "crashed", "target": "q:t"}, {"cycle": 6, "result": "improved", "target": "q:t"}],
     5, "q:t", 6),
    ([_e(5, "crashed", ref=None), _e(6, "improved")], 5, None, None),
    # not in the ledger read: no origin, never superseded
    ([_e(9, "improved")], None, None, None),
])
def test_assess_table(entries, origin, item, superseded_by) -> None:
    ref = "refs/evolve/unlanded/5"
    (a,) = assess({"unlanded": [ref]}, entries)
    assert (a.origin_cycle, a.work_ref, a.superseded_by) == (origin, item, superseded_by)
    assert a.needs_operator is (superseded_by is None)


def test_assess_reads_start_sha_and_leaves_pending_alone() -> None:
    got = assess({"stranded": ["refs/evolve/stranded/5-2"], "pending": ["refs/evolve/pending/main"]},
                 [_e(5, "crashed", cycle_start_sha="abc")])
    assert [(a.kind, a.cycle, a.start_sha, a.needs_operator) for a in got] == [
        ("stranded", 5, "abc", False), ("pending", None, None, False)]


def test_health_table() -> None:
    un = Aside("refs/evolve/unlanded/5", "unlanded", 5, 5, "q:a")
    done = Aside("refs/evolve/unlanded/6", "unlanded", 6, 6, "q:b", superseded_by=8)
    st = Aside("refs/evolve/stranded/2", "stranded", 2, 2, "q:c")
    it = Aside("refs/evolve/interrupted/3", "interrupted", 3, 3, "q:d")
    uc = Aside("refs/evolve/uncommitted/4", "uncommitted", 4, 4, "q:e")
    ap = Aside("refs/evolve/applied/unlanded/1", "applied", 1)
    pe = Aside("refs/evolve/pending/main", "pending", None)
    degraded, warnings = health([un], {}, 30)
    assert len(degraded) == 1 and "refs/evolve/unlanded/5" in degraded[0]
    assert "`evolve setaside apply unlanded/5`" in degraded[0] and "`evolve setaside drop unlanded/5`" in degraded[0]
    assert warnings == []
    degraded, warnings = health([done, st, it, uc, ap, pe], {"refs/evolve/pending/main": 2}, 30)
    assert degraded == []  # nothing here needs the operator: retried items, superseded work, a backup
    text = "\n".join(warnings)
    for ref in (done.ref, st.ref, it.ref, uc.ref, pe.ref):
        assert ref in text, ref
    assert ap.ref not in text and "2 commit(s) wait" in text and "dropped after 30 day(s)" in text
    assert "`evolve setaside drop --superseded`" in text and "`evolve setaside`" in text
    assert "kept until dropped" in "\n".join(health([st], {}, 0)[1])


@pytest.mark.parametrize(("kind", "in_progress", "touched", "dirty", "present", "refused"), [
    ("unlanded", [], {"a"}, set(), set(), None),
    ("stranded", [], {"a"}, {"b"}, set(), None),
    ("unlanded", [], {"a", "b"}, {"b"}, set(), "b"),
    ("uncommitted", [], {"a"}, set(), {"a"}, "ignored: a"),
    ("stranded", ["a merge"], {"a"}, set(), set(), "a merge is in progress"),
    ("unlanded", [], set(), set(), set(), "empty"),
    ("pending", [], {"a"}, set(), set(), "land by themselves"),
])
def test_apply_refusal_table(kind, in_progress, touched, dirty, present, refused) -> None:
    why = apply_refusal(kind, in_progress=in_progress, touched=touched, dirty=dirty, present=present)
    assert (why is None) if refused is None else (why is not None and refused in why), why


def test_retention_expiry_table() -> None:
    now, day = 1_000_000_000.0, 86400.0
    refs = [(f"refs/evolve/{k}/1", f"{k}-old", now - 31 * day) for k in SETASIDE_PRUNED]
    refs += [("refs/evolve/stranded/2", "young", now - 29 * day), ("refs/evolve/pending/main", "p", now - 99 * day),
             ("refs/evolve/landing/x", "other", now - 99 * day), ("refs/evolve/stranded/3", "undated", None)]
    assert expired(refs, now=now, keep_s=30 * day) == [(f"refs/evolve/{k}/1", f"{k}-old") for k in SETASIDE_PRUNED]
    assert expired(refs, now=now, keep_s=0) == []
    assert set(SETASIDE_PRUNED) == set(setaside.PRUNABLE) and "pending" not in SETASIDE_PRUNED


# -- helpers for the real ones ------------------------------------------------------------------------


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def evolve_refs(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/evolve/")
    return dict(line.split(" ", 1) for line in out.splitlines())


def checkout_state(repo: Path) -> dict[str, object]:
    """Everything of the operator's that apply must not touch: files (bytes), index, HEAD, branches, refs."""
    files = {}
    for root, dirs, names in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in (".git", ".agents")]
        for n in names:
            p = Path(root, n)
            files[str(p.relative_to(repo))] = p.read_bytes()
    status = git(repo, "status", "--porcelain=v1", "--untracked-files=all", "--ignored")  # may refresh the index
    return {"files": files, "head": head(repo), "index": git(repo, "ls-files", "-s"), "status": status,
            "refs": git(repo, "for-each-ref"), "lock": (repo / ".git" / "index.lock").exists()}


def wait_until(pred, what: str, timeout: float = 120.0) -> None:
    """A hang guard only: the condition is an event, never a speed."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def status(cli) -> tuple[int, dict]:
    r = cli("status", "--json")
    return r.code, orjson.loads(r.stdout)


BOTH_RED = [sys.executable, "-c",
            "import os, sys; sys.exit(1 if os.path.exists('theirs.txt') and os.path.exists('agent.txt') else 0)"]
RED = [sys.executable, "-c", "raise SystemExit(1)"]


def make_unlanded(env: Env, *, conflict: bool) -> dict:
    """A real fire whose green commit cannot land: the operator commits while the agent runs, and the commit
    either conflicts with theirs (``conflict``) or replays cleanly but is red on their commit."""
    if conflict:
        (env.repo / "shared.txt").write_text("base\n")
        git(env.repo, "add", "shared.txt")
        git(env.repo, "commit", "-q", "-m", "base")
        path = "shared.txt"
    else:
        env.write_config(gate={"commands": [BOTH_RED], "timeout_s": 60})
        path = "agent.txt"
    go = env.root / "go"
    env.queue(entry("the agent's item"))
    env.steps([{"write": [{"path": path, "content": "agent\n"}], "wait_for": str(go),
                "report": {"result": "improved"}}])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.env())
    made = env.tree / path
    wait_until(lambda: made.exists() and made.read_text() == "agent\n", "the agent's change")
    theirs = "shared.txt" if conflict else "theirs.txt"
    (env.repo / theirs).write_text("operator\n")
    git(env.repo, "add", theirs)
    git(env.repo, "commit", "-q", "-m", "operator: theirs")
    go.write_text("")
    _out, err = fire.communicate(timeout=300)
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "land_conflict"), (e, err.decode()[-2000:])
    assert e["unlanded_ref"] == "refs/evolve/unlanded/1"
    return e


def retry_red(env: Env, cli) -> None:
    """The released item's next attempt goes red: the last cycle is not a failure, the unlanded work stands."""
    env.write_config(gate={"commands": env.config.get("gate", {}).get("commands") or [RED], "timeout_s": 60})
    env.steps([{"write": [{"path": "agent.txt", "content": "again\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["result"] == "regressed", r.stderr


def git_shim(env: Env) -> tuple[dict[str, str], Path]:
    """A ``git`` first on PATH that records every call, then runs the real one."""
    shim, calls = env.root / "shim", env.root / "git-calls"
    shim.mkdir(exist_ok=True)
    (shim / "git").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexec {shutil.which('git')} \"$@\"\n")
    (shim / "git").chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}"}, calls


# -- unlanded: DEGRADED until applied, dropped or superseded ----------------------------------------------


def test_an_unlanded_ref_degrades_status_until_a_later_cycle_supersedes_it_then_drop_removes_it(env: Env, cli
                                                                                                 ) -> None:
    e = make_unlanded(env, conflict=True)
    code, info = status(cli)
    assert code == 1 and any("evolve setaside apply unlanded/1" in r for r in info["reasons"]), info["reasons"]
    assert [a["needs_operator"] for a in info["set_aside_refs"]] == [True]
    # The item was released; its retry on the operator's commit lands: that finalizes it.
    env.steps([{"write": [{"path": "shared.txt", "content": "agent\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["result"] == "improved", r.stderr
    assert (env.repo / "shared.txt").read_text() == "agent\n"
    code, info = status(cli)
    assert (code, info["health"]) == (0, "healthy"), info["reasons"]
    (a,) = info["set_aside_refs"]
    assert (a["ref"], a["superseded_by"], a["work_ref"], a["needs_operator"]) == (
        e["unlanded_ref"], 2, e["work_ref"], False)
    assert any("superseded" in w and e["unlanded_ref"] in w for w in info["warnings"]), info["warnings"]
    listed = orjson.loads(cli("setaside", "list", "--json").stdout)["refs"]
    assert [(x["short"], x["superseded_by"], x["paths"]) for x in listed] == [("unlanded/1", 2, ["shared.txt"])]
    # The morning report and the metrics say the same.
    out = env.root / "report.html"
    assert cli("report", "-o", str(out)).code == 0
    html = out.read_text().split('id="set-aside"', 1)[1].split("</table>", 1)[0]
    assert "refs/evolve/unlanded/1" in html and "by cycle 2" in html and "evolve setaside drop unlanded/1" in html
    metrics = cli("metrics").stdout
    assert f'evolve_setaside_refs{{repo="{env.repo}",kind="unlanded"}} 1' in metrics, metrics
    assert f'evolve_setaside_needs_operator{{repo="{env.repo}"}} 0' in metrics
    sha = evolve_refs(env.repo)[e["unlanded_ref"]]
    d = cli("setaside", "drop", "--superseded")
    assert d.code == 0 and sha in d.stdout and "setaside.dropped" in d.names(), d.stderr
    assert evolve_refs(env.repo) == {}
    code, info = status(cli)
    assert code == 0 and info["set_aside_refs"] == [] and not any("setaside" in w for w in info["warnings"])


def test_drop_and_apply_clear_an_unlanded_ref_and_a_conflicting_one_is_only_merged_when_asked(env: Env, cli
                                                                                              ) -> None:
    e = make_unlanded(env, conflict=True)
    retry_red(env, cli)
    ref, sha = e["unlanded_ref"], evolve_refs(env.repo)[e["unlanded_ref"]]
    code, info = status(cli)
    assert code == 1 and len(info["reasons"]) == 1 and ref in info["reasons"][0], info["reasons"]
    assert 'kind="unlanded"} 1' in cli("metrics").stdout
    # The change was made on the old base and conflicts with the operator's commit: refused, nothing moves.
    before = checkout_state(env.repo)
    r = cli("setaside", "apply", "unlanded/1")
    assert r.code == 1 and "does not apply cleanly" in r.stderr and "--3way" in r.stderr, r.stderr
    assert checkout_state(env.repo) == before
    # Dropped: status is healthy again; the line printed restores it.
    d = cli("setaside", "drop", "unlanded/1")
    assert d.code == 0 and f"git update-ref {ref} {sha}" in d.stdout, d.stdout
    assert ref not in evolve_refs(env.repo)
    code, info = status(cli)
    assert (code, info["health"]) == (0, "healthy"), info["reasons"]
    git(env.repo, "update-ref", ref, sha)
    assert status(cli)[0] == 1
    # Asked to merge it: conflict markers in the operator's file, nothing committed, the ref kept as applied.
    r = cli("setaside", "apply", "unlanded/1", "--3way")
    assert r.code == 1 and "conflicts to resolve" in r.stdout and "shared.txt" in r.stdout, (r.stdout, r.stderr)
    text = (env.repo / "shared.txt").read_text()
    assert "<<<<<<<" in text and "agent" in text and "operator" in text
    assert head(env.repo) == before["head"] and not (env.repo / ".git" / "index.lock").exists()
    assert evolve_refs(env.repo) == {"refs/evolve/applied/unlanded/1": sha}
    code, info = status(cli)
    assert (code, info["health"]) == (0, "healthy"), info["reasons"]


def test_apply_brings_the_change_in_as_uncommitted_edits_and_refuses_over_the_operator_s_paths(env: Env, cli
                                                                                               ) -> None:
    e = make_unlanded(env, conflict=False)
    retry_red(env, cli)
    ref, sha = e["unlanded_ref"], evolve_refs(env.repo)[e["unlanded_ref"]]
    shim_env, calls = git_shim(env)
    r = cli("status", "--json", extra_env=shim_env)
    info = orjson.loads(r.stdout)
    assert r.code == 1 and info["reasons"] and "evolve setaside apply unlanded/1" in info["reasons"][0]
    assert not calls.exists(), calls.read_text()  # status read the refs and the ledger, and started no git
    # The operator has a file of their own where the change adds one: untracked, ignored, staged. Refused.
    exclude = env.repo / ".git" / "info" / "exclude"
    for how in ("untracked", "ignored", "staged"):
        (env.repo / "agent.txt").write_text("the operator's own agent.txt\n")
        if how == "ignored":
            exclude.write_text(exclude.read_text() + "agent.txt\n")
            assert git(env.repo, "status", "--porcelain").strip() == ""  # invisible to status
        if how == "staged":
            exclude.write_text(exclude.read_text().replace("agent.txt\n", ""))
            git(env.repo, "add", "agent.txt")
        before = checkout_state(env.repo)
        r = cli("setaside", "apply", "unlanded/1")
        assert r.code == 1 and "refusing to apply" in r.stderr and "agent.txt" in r.stderr, r.stderr
        assert len(r.error_lines()) == 1, r.stderr
        assert checkout_state(env.repo) == before
    git(env.repo, "rm", "-q", "--cached", "agent.txt")
    (env.repo / "agent.txt").unlink()
    # An edit elsewhere is no obstacle and stays exactly as it was.
    (env.repo / "README.md").write_text("the operator's unsaved edit\n")
    before = checkout_state(env.repo)
    r = cli("setaside", "apply", "unlanded/1")
    assert r.code == 0, r.stderr
    assert "agent.txt" in r.stdout and "nothing was committed" in r.stdout
    assert (env.repo / "agent.txt").read_text() == "agent\n"
    assert (env.repo / "README.md").read_text() == "the operator's unsaved edit\n"
    assert head(env.repo) == before["head"] and git(env.repo, "ls-files", "-s") == before["index"]
    assert sorted(git(env.repo, "status", "--porcelain").splitlines()) == [" M README.md", "?? agent.txt"]
    assert evolve_refs(env.repo) == {"refs/evolve/applied/unlanded/1": sha}
    code, info = status(cli)
    assert (code, info["health"]) == (0, "healthy"), info["reasons"]
    listed = orjson.loads(cli("setaside", "list", "--json").stdout)["refs"]
    assert [(x["kind"], x["short"]) for x in listed] == [("applied", "applied/unlanded/1")]
    assert ref not in cli("setaside").stdout
    d = cli("setaside", "drop", "applied/unlanded/1")
    assert d.code == 0 and evolve_refs(env.repo) == {}


# -- stranded and uncommitted: warnings, their items retried --------------------------------------------------


def test_a_stranded_ref_is_a_warning_and_can_be_shown_applied_and_dropped(env: Env, cli) -> None:
    import signal

    env.queue(entry("alpha", "beta"))
    env.steps([{"write": [{"path": "half.txt", "content": "partial\n"}, {"path": "README.md", "content": "x\n"}],
                "hang": True}, improved_step(path="beta.txt", content="beta\n")])
    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env.env())
    wait_until(lambda: (env.tree / "half.txt").exists(), "the agent's partial change")
    pgid = env.state()["fire"]["agent_pgid"]
    fire.send_signal(signal.SIGKILL)
    fire.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # the agent of the dead fire (the next fire's reconcile would too)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["result"] == "improved", r.stderr
    assert list(evolve_refs(env.repo)) == ["refs/evolve/stranded/1"]
    code, info = status(cli)
    assert (code, info["health"]) == (0, "healthy"), info["reasons"]  # the item was retried: nothing to ask
    assert any("refs/evolve/stranded/1" in w for w in info["warnings"]), info["warnings"]
    (row,) = orjson.loads(cli("setaside", "list", "--json").stdout)["refs"]
    assert (row["kind"], row["cycle"], row["paths"], row["work_ref"]) == (
        "stranded", 1, ["README.md", "half.txt"], env.ledger()[0]["work_ref"])
    assert row["age_s"] is not None and row["age_s"] >= 0
    s = cli("setaside", "show", "stranded/1")
    assert s.code == 0 and "+partial" in s.stdout and "-# test repo" in s.stdout and "+x" in s.stdout, s.stdout
    before = checkout_state(env.repo)
    a = cli("setaside", "apply", "refs/evolve/stranded/1")
    assert a.code == 0, a.stderr
    assert (env.repo / "half.txt").read_text() == "partial\n" and (env.repo / "README.md").read_text() == "x\n"
    assert (env.repo / "beta.txt").read_bytes() == before["files"]["beta.txt"]  # what landed since stays
    assert head(env.repo) == before["head"] and git(env.repo, "diff", "--cached").strip() == ""
    assert list(evolve_refs(env.repo)) == ["refs/evolve/applied/stranded/1"]
    d = cli("setaside", "drop", "applied/stranded/1")
    assert d.code == 0 and evolve_refs(env.repo) == {}


LOCK_GATE = [sys.executable, "-c", "import subprocess as s; open(s.run(['git', 'rev-parse', '--git-path', "
             "'index.lock'], capture_output=True, text=True, check=True).stdout.strip(), 'w').close()"]


def test_a_second_commit_failure_with_the_same_cycle_number_keeps_the_first_s_saved_change(env: Env, cli) -> None:
    env.write_config(gate={"commands": [LOCK_GATE], "timeout_s": 60}, git={"isolation": "none"})
    env.queue(entry("write docs"))
    env.steps([improved_step(path="docs/a.md", content="first\n")])
    assert cli("fire", "--cycles", "1").code == 1
    assert env.ledger()[-1]["uncommitted_ref"] == "refs/evolve/uncommitted/1"
    os.unlink(env.repo / ".git" / "index.lock")
    # The ledger is moved aside (rotated by hand): cycle numbers start again, and cycle 1 fails the same way.
    env.paths.ledger.rename(env.paths.ledger.with_name("cycle-history.old.jsonl"))
    env.steps([improved_step(path="docs/a.md", content="second\n")])
    assert cli("fire", "--cycles", "1").code == 1
    e = env.ledger()[-1]
    assert (e["cycle"], e["uncommitted_ref"]) == (1, "refs/evolve/uncommitted/1-2"), e
    assert git(env.repo, "show", "refs/evolve/uncommitted/1:docs/a.md") == "first\n"  # not overwritten
    assert git(env.repo, "show", "refs/evolve/uncommitted/1-2:docs/a.md") == "second\n"
    os.unlink(env.repo / ".git" / "index.lock")
    listed = orjson.loads(cli("setaside", "list", "--json").stdout)["refs"]
    assert [(x["short"], x["paths"]) for x in listed] == [("uncommitted/1", ["docs/a.md"]),
                                                          ("uncommitted/1-2", ["docs/a.md"])]
    assert "+first" in cli("setaside", "show", "uncommitted/1").stdout
    r = cli("setaside", "apply", "uncommitted/1")
    assert r.code == 0 and (env.repo / "docs" / "a.md").read_text() == "first\n", r.stderr
    assert git(env.repo, "status", "--porcelain").split() == ["??", "docs/"]
    d = cli("setaside", "drop", "uncommitted/1-2", "applied/uncommitted/1")
    assert d.code == 0 and evolve_refs(env.repo) == {}, d.stderr
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"  # the item is still retried


# -- the command's refusals, on refs made by hand -----------------------------------------------------------


def set_aside(env: Env, ref: str, files: dict[str, str], *, days_old: float = 0.0) -> str:
    """A commit on HEAD holding ``files``, kept at ``ref`` (committer date ``days_old`` ago), as evolve keeps them."""
    base = head(env.repo)
    idx = env.root / "scratch-index"
    when = f"@{int(time.time() - days_old * 86400)} +0000"
    genv = {**os.environ, **GIT_ENV, "GIT_INDEX_FILE": str(idx), "GIT_COMMITTER_DATE": when}

    def g(*args: str, data: bytes | None = None) -> str:
        return subprocess.run(["git", *args], cwd=env.repo, env=genv, check=True, capture_output=True,
                              input=data).stdout.decode().strip()

    g("read-tree", base)
    for path, content in files.items():
        blob = g("hash-object", "-w", "--stdin", data=content.encode())
        g("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
    sha = g("commit-tree", g("write-tree"), "-p", base, "-m", f"evolve: set aside ({ref})")
    idx.unlink()
    git(env.repo, "update-ref", ref, sha)
    return sha


def test_apply_refuses_during_a_merge_and_while_a_fire_holds_the_lock(env: Env, cli) -> None:
    from evolve.store.lock import FireLock

    set_aside(env, "refs/evolve/stranded/3", {"new.txt": "kept\n"})
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    lock = FireLock(env.paths.lock)
    assert lock.acquire()
    try:
        before = checkout_state(env.repo)
        r = cli("setaside", "apply", "stranded/3")
        assert r.code == 75 and "a fire is running" in r.stderr, r.stderr
        assert checkout_state(env.repo) == before
    finally:
        lock.release()
    # A merge that stopped on a conflict waits for the operator: nothing is applied into it.
    (env.repo / "m.txt").write_text("base\n")
    git(env.repo, "add", "m.txt")
    git(env.repo, "commit", "-q", "-m", "m")
    git(env.repo, "checkout", "-q", "-b", "side")
    (env.repo / "m.txt").write_text("side\n")
    git(env.repo, "commit", "-q", "-am", "side")
    git(env.repo, "checkout", "-q", "main")
    (env.repo / "m.txt").write_text("main\n")
    git(env.repo, "commit", "-q", "-am", "main")
    subprocess.run(["git", "merge", "-q", "side"], cwd=env.repo, capture_output=True, env={**os.environ, **GIT_ENV})
    assert (env.repo / ".git" / "MERGE_HEAD").exists()
    before = checkout_state(env.repo)
    r = cli("setaside", "apply", "stranded/3")
    assert r.code == 1 and "a merge is in progress" in r.stderr, r.stderr
    assert checkout_state(env.repo) == before and "refs/evolve/stranded/3" in evolve_refs(env.repo)
    git(env.repo, "merge", "--abort")
    git(env.repo, "bisect", "start")
    r = cli("setaside", "apply", "stranded/3")
    assert r.code == 1 and "a bisect is in progress" in r.stderr, r.stderr
    assert not (env.repo / "new.txt").exists()


def test_usage_and_refusals_are_one_line_with_their_exit_codes(env: Env, cli) -> None:
    set_aside(env, "refs/evolve/pending/main", {"p.txt": "p\n"})
    before = evolve_refs(env.repo)
    for args, code, says in [
        (("setaside", "show", "bogus/1"), 2, "not a set-aside ref"),
        (("setaside", "drop"), 2, "drop needs"),
        (("setaside", "show", "stranded/1", "--lines", "-1"), 2, "--lines"),
        (("setaside", "show", "stranded/99"), 1, "no such set-aside ref: refs/evolve/stranded/99"),
        (("setaside", "drop", "pending/main"), 1, "refusing to drop refs/evolve/pending/main"),
        (("setaside", "apply", "pending/main"), 1, "land by themselves"),
        (("setaside", "drop", "stranded/99"), 1, "nothing dropped"),
    ]:
        r = cli(*args)
        assert r.code == code and says in r.stderr, (args, r.code, r.stderr)
        assert len(r.error_lines()) == 1, (args, r.stderr)
    assert cli("setaside", "show").code == 2  # argparse: REF is required
    assert evolve_refs(env.repo) == before
    listed = orjson.loads(cli("setaside", "list", "--json").stdout)["refs"]
    assert [(x["kind"], x["paths"], x["waiting"]) for x in listed] == [("pending", ["p.txt"], 1)]


def test_show_is_bounded_and_redacted(env: Env, cli) -> None:
    token = "ghp_" + "A1b2C3d4" * 5
    set_aside(env, "refs/evolve/interrupted/4", {"big.txt": "".join(f"line {i}\n" for i in range(500)),
                                                 "cfg.txt": f"token = {token}\n"})
    s = cli("setaside", "show", "interrupted/4")
    assert s.code == 0 and token not in s.stdout and "cfg.txt" in s.stdout, s.stdout
    assert "more line(s) cut" in s.stdout and "+line 499" not in s.stdout
    assert len(s.stdout.splitlines()) < 420
    full = cli("setaside", "show", "interrupted/4", "--lines", "0")
    assert "+line 499" in full.stdout and token not in full.stdout


# -- retention ------------------------------------------------------------------------------------------------


def test_a_fire_drops_set_aside_refs_older_than_the_retention_and_keeps_young_and_pending_ones(env: Env, cli
                                                                                              ) -> None:
    old = {k: set_aside(env, f"refs/evolve/{k}/1", {f"{k}.txt": "x\n"}, days_old=40) for k in SETASIDE_PRUNED
           if k != "applied"}
    old["applied"] = set_aside(env, "refs/evolve/applied/unlanded/2", {"a.txt": "x\n"}, days_old=40)
    young = set_aside(env, "refs/evolve/stranded/5", {"y.txt": "y\n"}, days_old=2)
    other = set_aside(env, "refs/evolve/landing/x", {"o.txt": "o\n"}, days_old=400)
    pending = set_aside(env, "refs/evolve/pending/main", {"p.txt": "p\n"}, days_old=400)
    (env.repo / "p.txt").write_text("the operator's\n")  # so the pending commit waits and is not landed
    env.write_config(git={"setaside_keep_days": 30})
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    left = evolve_refs(env.repo)
    assert left == {"refs/evolve/stranded/5": young, "refs/evolve/landing/x": other,
                    "refs/evolve/pending/main": pending}, left
    dropped = {e["ref"]: e["sha"] for e in r.events() if e["event"] == "setaside.dropped"}
    assert dropped == {("refs/evolve/applied/unlanded/2" if k == "applied" else f"refs/evolve/{k}/1"): sha
                       for k, sha in old.items()}
    assert (env.repo / "p.txt").read_text() == "the operator's\n"
    # 0 keeps everything.
    set_aside(env, "refs/evolve/stranded/6", {"z.txt": "z\n"}, days_old=4000)
    env.write_config(git={"setaside_keep_days": 0})
    assert cli("fire", "--cycles", "1").code == 0
    assert "refs/evolve/stranded/6" in evolve_refs(env.repo)
